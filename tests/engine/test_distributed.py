import time

import ignite.distributed as idist
import pytest
import torch

import ignite_tbptt.engine.distributed
from ignite_tbptt import count_targets, create_tbptt_trainer
from ignite_tbptt.data import pack_sequences, stream_batches

from ..helpers import assert_same_parameters, make_batches
from ..reference import Net, cross_entropy

pytestmark = [pytest.mark.slow, pytest.mark.cpu_only("starts gloo processes on the CPU")]  # two processes, local ports


K1, K2, ACCUMULATION, EPOCHS = 3, 7, 2, 2
BATCHES = make_batches([7, 12, 5], batch=4)


def build(seed):
    torch.manual_seed(seed)
    model = Net().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    trainer = create_tbptt_trainer(
        model, optimizer, cross_entropy, K1, K2, carry_hidden=True, gradient_accumulation_steps=ACCUMULATION
    )
    return model, trainer


def train_shard(local_rank, path):
    rank, size = idist.get_rank(), idist.get_world_size()
    model, trainer = build(seed=rank)  # other initial weights on rank 1: rank 0's are broadcast
    calls = {"all_reduce": [], "all_gather": []}
    collectives = ignite_tbptt.engine.distributed.idist

    def counting(name):
        collective = getattr(collectives, name)

        def call(tensor, *args, **kwargs):
            calls[name].append(trainer.state.optimizer_step)
            return collective(tensor, *args, **kwargs)

        return call

    originals = collectives.all_reduce, collectives.all_gather
    collectives.all_reduce, collectives.all_gather = counting("all_reduce"), counting("all_gather")
    width = BATCHES[0][0].shape[1] // size
    shard = [(x[:, rank * width : (rank + 1) * width], y[:, rank * width : (rank + 1) * width]) for x, y in BATCHES]
    try:
        trainer.run(shard, max_epochs=EPOCHS)
    finally:  # the process runs the next test's function too
        collectives.all_reduce, collectives.all_gather = originals
    if rank == 0:
        torch.save({"params": [p.detach() for p in model.parameters()], "calls": calls}, path)


def test_two_processes_on_shards_equal_one_process_on_the_whole_batch(tmp_path, gloo):
    path = tmp_path / "rank0.pt"
    gloo().run(train_shard, path)
    result = torch.load(path)

    single, trainer = build(seed=0)
    trainer.run(BATCHES, max_epochs=EPOCHS)
    shards = Net().double()
    with torch.no_grad():
        for p, q in zip(shards.parameters(), result["params"]):
            p.copy_(q)
    assert_same_parameters(shards, single, atol=1e-9)
    # Gradients are synchronised at optimizer steps only: one collective for the gradients and one for the target
    # counts with where each process is, although each step covers 2 windows of several backward calls; and one
    # for where each process is at every epoch's end.
    steps = trainer.state.optimizer_step
    assert steps == EPOCHS * 4
    assert result["calls"]["all_reduce"] == list(range(steps))
    assert len(result["calls"]["all_gather"]) == steps + EPOCHS


def train_uneven(local_rank, path):
    rank = idist.get_rank()
    model, trainer = build(seed=0)
    batches = BATCHES if rank == 0 else BATCHES[:2]  # rank 0 three batches, rank 1 two
    try:
        trainer.run([(x[:, :2], y[:, :2]) for x, y in batches], max_epochs=1)
    except ignite_tbptt.engine.distributed.ProcessesDisagree as error:
        torch.save(str(error), path.with_suffix(f".{rank}"))


def test_processes_with_different_numbers_of_batches_all_raise_naming_the_counts(tmp_path, gloo):
    started = time.monotonic()
    gloo().run(train_uneven, tmp_path / "error")
    assert time.monotonic() - started < 60
    for rank in (0, 1):  # both processes raise, at the first optimizer step
        message = torch.load(tmp_path / f"error.{rank}")
        assert "rank 0 runs 3, rank 1 runs 2" in message and "batches per epoch" in message


DOCUMENTS = [torch.arange(n) % 7 for n in (23, 5, 17, 40, 9, 31, 12, 3, 26)]


def build_lm(seed=0):
    torch.manual_seed(seed)
    model = Net(n_in=7, n_out=7).double()
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        cross_entropy,
        3,
        5,
        carry_hidden=True,
        target_count_fn=lambda y_pred, y: count_targets(y),
        prepare_batch=one_hot,
    )
    return model, trainer


def one_hot(batch, device=None, non_blocking=False):
    x, y, starts = batch
    return torch.nn.functional.one_hot(x, 7).double(), y, starts


def train_packed(local_rank, path):
    model, trainer = build_lm(seed=idist.get_rank())
    packed = pack_sequences(DOCUMENTS, batch_size=4, length=6)  # rank and world size from ignite.distributed
    trainer.run(packed, max_epochs=2)
    if idist.get_rank() == 0:
        torch.save([p.detach() for p in model.parameters()], path)


def test_uneven_documents_packed_on_two_processes_train_as_one_process_on_all_columns(tmp_path, gloo):
    path = tmp_path / "rank0.pt"
    gloo().run(train_packed, path)
    single, trainer = build_lm()
    trainer.run(pack_sequences(DOCUMENTS, batch_size=4, length=6), max_epochs=2)
    for p, q in zip(single.parameters(), torch.load(path), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-9)


def test_each_process_keeps_its_columns_and_as_many_batches():
    whole = list(pack_sequences(DOCUMENTS, batch_size=4, length=6))
    shares = [list(pack_sequences(DOCUMENTS, batch_size=4, length=6, rank=r, world_size=2)) for r in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == len(whole)
    for (x, y, s), (x0, y0, s0), (x1, y1, s1) in zip(whole, *shares):
        assert torch.equal(x[:, 0::2], x0) and torch.equal(x[:, 1::2], x1)
        assert torch.equal(y[:, 0::2], y0) and torch.equal(y[:, 1::2], y1)
        assert torch.equal(s[:, 0::2], s0) and torch.equal(s[:, 1::2], s1)
    tokens = torch.arange(100)
    full = stream_batches(tokens, 4, 5)
    part = stream_batches(tokens, 4, 5, rank=1, world_size=2)
    assert len(part) == len(full) and all(torch.equal(x[:, 1::2], xp) for (x, _), (xp, _) in zip(full, part))
    with pytest.raises(ValueError, match="3 columns cannot be shared among 4 processes"):
        pack_sequences(DOCUMENTS, batch_size=3, length=6, rank=0, world_size=4)


MULTINODE = """
import sys

import ignite.distributed as idist
import torch

from tests.engine.test_distributed import BATCHES, build


def training(local_rank, path):
    rank, size = idist.get_rank(), idist.get_world_size()
    model, trainer = build(seed=rank)
    shard = [(x[:, rank::size], y[:, rank::size]) for x, y in BATCHES]
    trainer.run(shard, max_epochs=2)
    if rank == 0:
        torch.save([p.detach() for p in model.parameters()], path)


if __name__ == "__main__":
    with idist.Parallel(backend="gloo") as parallel:  # the processes, ranks and rendezvous come from torchrun
        parallel.run(training, sys.argv[1])
"""


def test_two_nodes_under_torchrun_on_one_machine_give_the_result_of_one_process(tmp_path, free_port):
    # The how-to's commands: two nodes of one process each, their rendezvous on 127.0.0.1.
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "multinode.py"
    script.write_text(MULTINODE)
    root = Path(__file__).parent.parent.parent
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(free_port),
                str(script),
                str(tmp_path / "rank0.pt"),
            ],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},  # the script imports this test module
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=180)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    single, trainer = build(seed=0)
    trainer.run(BATCHES, max_epochs=2)
    for p, q in zip(single.parameters(), torch.load(tmp_path / "rank0.pt"), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-9)
