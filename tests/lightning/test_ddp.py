"""TBPTTModule under Lightning's DDP on two gloo processes: each process its columns, the run one process's.

The processes belong to the suite's gloo group (``tests/gloo.py``), made with ``torch.distributed`` before Lightning
starts: Lightning's ``strategy="ddp"`` finds the environment the group set (``LOCAL_RANK``, ``WORLD_SIZE``, ...),
creates no processes and keeps the group.
"""

import pytest
import torch

pytest.importorskip("lightning")

from torch.nn.functional import mse_loss  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from ignite_tbptt.data import shard_of  # noqa: E402

from ..reference import Net  # noqa: E402
from .test_module import SGDModule, batches, lightning_trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.cpu_only("starts gloo processes on the CPU")]

K1, K2, OPTIONS = 3, 7, {"carry_hidden": True, "gradient_accumulation_steps": 2}
DATA = batches(count=3, length=12, columns=4)


def module(seed):
    torch.manual_seed(seed)
    return SGDModule(Net().double(), mse_loss, K1, K2, **OPTIONS)


def ddp_trainer(**kwargs):
    return lightning_trainer(2, strategy="ddp", devices=2, **kwargs)


def train_columns(local_rank, path):
    lit = module(seed=local_rank)  # other initial weights on rank 1: rank 0's are broadcast
    shard = shard_of()
    own = [(shard.select(x), shard.select(y)) for x, y in DATA]
    trainer = ddp_trainer(use_distributed_sampler=False)
    trainer.fit(lit, DataLoader(own, batch_size=None))
    if local_rank == 0:
        torch.save({"params": [p.detach() for p in lit.parameters()], "steps": trainer.global_step}, path)


def test_two_processes_on_their_columns_equal_one_process_on_the_whole_batch(tmp_path, gloo):
    path = tmp_path / "rank0.pt"
    gloo().run(train_columns, path)
    result = torch.load(path)
    single = module(seed=0)
    trainer = lightning_trainer(2)
    trainer.fit(single, DataLoader(DATA, batch_size=None))
    for p, q in zip(single.parameters(), result["params"], strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-9)
    assert result["steps"] == trainer.global_step > 0


def train_dealt_out(local_rank, path):
    try:
        ddp_trainer().fit(module(seed=0), DataLoader(DATA, batch_size=None))
    except ValueError as error:
        torch.save(str(error), path.with_suffix(f".{local_rank}"))


def test_a_stream_dealt_out_by_lightnings_sampler_is_refused_on_every_process(tmp_path, gloo):
    gloo().run(train_dealt_out, tmp_path / "error")
    for rank in (0, 1):
        message = torch.load(tmp_path / f"error.{rank}")
        assert "DistributedSampler deals them out" in message and "use_distributed_sampler=False" in message


def train_uneven(local_rank, path):
    from ignite_tbptt.engine.distributed import ProcessesDisagree

    shard = shard_of()
    own = [(shard.select(x), shard.select(y)) for x, y in DATA[: 3 - local_rank]]  # 3 batches, and 2
    try:
        ddp_trainer(use_distributed_sampler=False).fit(module(seed=0), DataLoader(own, batch_size=None))
    except ProcessesDisagree as error:
        torch.save(str(error), path.with_suffix(f".{local_rank}"))


def test_processes_with_different_numbers_of_batches_are_named_not_left_waiting(tmp_path, gloo):
    gloo().run(train_uneven, tmp_path / "error", timeout=120)
    for rank in (0, 1):
        message = torch.load(tmp_path / f"error.{rank}")
        assert "rank 0 runs 3, rank 1 runs 2" in message and "batches per epoch" in message
