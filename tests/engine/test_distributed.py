import ignite.distributed as idist
import pytest
import torch

import ignite_tbptt.engine.distributed
from ignite_tbptt import create_tbptt_trainer

from ..helpers import assert_same_parameters, make_batches
from ..reference import Net, cross_entropy

pytestmark = pytest.mark.slow  # starts two gloo processes on local ports


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
    calls = []
    reduce = ignite_tbptt.engine.distributed.idist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        calls.append(trainer.state.optimizer_step)
        return reduce(tensor, *args, **kwargs)

    ignite_tbptt.engine.distributed.idist.all_reduce = counting_all_reduce
    width = BATCHES[0][0].shape[1] // size
    shard = [(x[:, rank * width : (rank + 1) * width], y[:, rank * width : (rank + 1) * width]) for x, y in BATCHES]
    trainer.run(shard, max_epochs=EPOCHS)
    if rank == 0:
        torch.save({"params": [p.detach() for p in model.parameters()], "calls": calls}, path)


def test_two_processes_on_shards_equal_one_process_on_the_whole_batch(tmp_path, free_port):
    path = tmp_path / "rank0.pt"
    with idist.Parallel(backend="gloo", nproc_per_node=2, master_addr="127.0.0.1", master_port=free_port) as p:
        p.run(train_shard, path)
    result = torch.load(path)

    single, trainer = build(seed=0)
    trainer.run(BATCHES, max_epochs=EPOCHS)
    shards = Net().double()
    with torch.no_grad():
        for p, q in zip(shards.parameters(), result["params"]):
            p.copy_(q)
    assert_same_parameters(shards, single, atol=1e-9)
    # Gradients are synchronised at optimizer steps only: one collective for the gradients and one for the
    # target count per step, although each step covers 2 windows of several backward calls.
    steps = trainer.state.optimizer_step
    assert steps == EPOCHS * 4
    assert result["calls"] == [step for step in range(steps) for _ in range(2)]
