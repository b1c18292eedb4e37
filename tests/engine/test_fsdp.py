"""Models sharded by FSDP2 (``fully_shard`` per layer and at the root) train as one process on the whole batch.

Each process holds a shard of every parameter and its share of the batch's columns; FSDP2 gathers the weights for
each forward and backward pass and reduce-scatters the gradients. At k2 > k1 a segment retained across an optimizer
step is backpropagated with the weights it ran with, gathered from the shards its version kept.
"""

import ignite.distributed as idist
import pytest
import torch
from ignite.engine import Events
from ignite.handlers import Checkpoint, DiskSaver

from ignite_tbptt import FullStateDict, GradientClipping, create_tbptt_trainer, load_checkpoint
from ignite_tbptt.runtime import weight_versions

from ..helpers import make_batches
from ..reference import Net, cross_entropy

pytestmark = [pytest.mark.slow, pytest.mark.cpu_only("starts gloo processes on the CPU")]

fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard

BATCHES = make_batches([7, 12, 5], batch=4)


def shard(model, **options):
    """Each layer, then the root, as FSDP2's documentation shards a transformer."""
    for layer in (model.inp, model.rnn, model.head):
        fully_shard(layer, **options)
    fully_shard(model, **options)


def build(sharded, k1, k2, accumulation, clip, recompute=None):
    torch.manual_seed(0)  # every process builds the same model before sharding it, as FSDP2 asks
    model = Net().double()
    if sharded:
        shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    options = {"carry_hidden": True, "gradient_accumulation_steps": accumulation, "recompute": recompute}
    trainer = create_tbptt_trainer(model, optimizer, cross_entropy, k1, k2, **options)
    if clip:
        GradientClipping(model, max_norm=0.5).attach(trainer)
    return model, trainer


def with_starts(batches):
    out = []
    for x, y in batches:
        starts = torch.zeros(x.shape[:2], dtype=torch.bool)
        starts[min(4, x.shape[0] - 1), 1] = starts[2, 2] = True
        out.append((x, y, starts))
    return out


def train_shard(local_rank, path, k1, k2, accumulation, clip, starts, recompute):
    rank, size = idist.get_rank(), idist.get_world_size()
    model, trainer = build(True, k1, k2, accumulation, clip, recompute)
    gathers = []
    gathered = weight_versions.gathered
    weight_versions.gathered = lambda *args: gathers.append(1) or gathered(*args)
    batches = with_starts(BATCHES) if starts else BATCHES
    width = BATCHES[0][0].shape[1] // size
    columns = slice(rank * width, (rank + 1) * width)
    try:
        trainer.run([tuple(t[:, columns] for t in batch) for batch in batches], max_epochs=2)
    finally:  # the process runs the next test's function too
        weight_versions.gathered = gathered
    params = [p.full_tensor().detach() for p in model.parameters()]  # a collective: every process takes part
    if rank == 0:
        torch.save({"params": params, "gathers": len(gathers)}, path)


@pytest.mark.parametrize(
    "processes, k1, k2, accumulation, clip, starts, recompute",
    [
        (2, 3, 3, 2, False, False, None),
        (2, 3, 7, 2, True, True, None),
        (2, 1, 4, 1, False, False, None),
        (2, 3, 7, 1, False, False, 2),
        (4, 3, 7, 1, False, True, None),
    ],
    ids=["k1=k2, accumulation", "k2>k1, clipping, starts", "k1=1, k2=4", "recompute", "4 processes, k2>k1"],
)
def test_sharded_training_equals_one_process(tmp_path, gloo, processes, k1, k2, accumulation, clip, starts, recompute):
    path = tmp_path / "rank0.pt"
    options = (k1, k2, accumulation, clip, starts, recompute)
    gloo(processes).run(train_shard, path, *options)
    result = torch.load(path)
    single, trainer = build(False, k1, k2, accumulation, clip, recompute)
    trainer.run(with_starts(BATCHES) if starts else BATCHES, max_epochs=2)
    for p, q in zip(single.parameters(), result["params"]):
        torch.testing.assert_close(q, p.detach(), rtol=0, atol=1e-9)
    # Retained segments reached across optimizer steps were backpropagated with their version's gathered weights
    # (recomputation rebuilds them from the version's weights instead).
    assert (result["gathers"] > 0) == (k2 > k1 and recompute is None)


def train_mixed(local_rank, path, autocast):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    rank, size = idist.get_rank(), idist.get_world_size()
    torch.manual_seed(0)
    model = Net()
    shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    trainer = mixed_trainer(model, torch.bfloat16 if autocast else None)
    width = BATCHES[0][0].shape[1] // size
    columns = slice(rank * width, (rank + 1) * width)
    trainer.run([(x[:, columns].float(), y[:, columns]) for x, y in BATCHES], max_epochs=2)
    params = [p.full_tensor().detach() for p in model.parameters()]
    if rank == 0:
        torch.save(params, path)


def mixed_trainer(model, autocast_dtype=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    loss = lambda y_pred, y: cross_entropy(y_pred.float(), y)  # noqa: E731
    return create_tbptt_trainer(model, optimizer, loss, 3, 7, carry_hidden=True, autocast_dtype=autocast_dtype)


def test_bfloat16_parameters_through_fsdp2s_mixed_precision_policy(tmp_path, gloo):
    # bfloat16 parameters in the forward and backward passes, float32 reduction and optimizer: within bfloat16's
    # rounding (8 bits of mantissa, 4e-3 relative) of float32 training, retained segments across steps included.
    for autocast in (False, True):
        gloo().run(train_mixed, tmp_path / f"autocast-{autocast}.pt", autocast)
    torch.manual_seed(0)
    single = Net()
    mixed_trainer(single).run([(x.float(), y) for x, y in BATCHES], max_epochs=2)
    mixed, autocast = torch.load(tmp_path / "autocast-False.pt"), torch.load(tmp_path / "autocast-True.pt")
    for p, q, r in zip(single.parameters(), mixed, autocast):
        assert p.dtype == q.dtype == torch.float32
        torch.testing.assert_close(q, p.detach(), rtol=0, atol=5e-3)
        # The trainer's bfloat16 autocast on top of the policy changes nothing: the weights are bfloat16 already.
        assert torch.equal(q, r)


RESUMED = make_batches([7, 12, 5, 9], batch=4)


def resumable(folder):
    torch.manual_seed(0)
    model = Net().double()
    shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    trainer = create_tbptt_trainer(
        model, optimizer, cross_entropy, 3, 7, carry_hidden=True, gradient_accumulation_steps=2, deterministic=True
    )
    to_save = {"trainer": trainer, "model": FullStateDict(model), "optimizer": FullStateDict(model, optimizer)}
    return model, trainer, to_save, Checkpoint(to_save, DiskSaver(folder, require_empty=False), n_saved=None)


def train_resumed(local_rank, folder, mode):
    rank, size = idist.get_rank(), idist.get_world_size()
    model, trainer, to_save, checkpoint = resumable(folder)
    width = RESUMED[0][0].shape[1] // size
    shard = [(x[:, rank * width : (rank + 1) * width], y[:, rank * width : (rank + 1) * width]) for x, y in RESUMED]
    if mode == "interrupted":  # mid-epoch, a window's gradient accumulated and segments retained
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=6), checkpoint)
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=6), lambda engine: engine.terminate())
    elif mode == "resumed":
        Checkpoint.load_objects(to_save, load_checkpoint(folder / "checkpoint_6.pt"))
    trainer.run(shard, max_epochs=3)
    params = [p.full_tensor().detach() for p in model.parameters()]
    if rank == 0 and mode != "interrupted":
        torch.save(params, folder / f"{mode}.pt")


def test_a_sharded_run_resumes_mid_epoch_from_its_checkpoint_as_if_uninterrupted(tmp_path, gloo):
    for mode in ("whole", "interrupted", "resumed"):
        gloo().run(train_resumed, tmp_path, mode)
    whole, resumed = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "resumed.pt")
    for p, q in zip(whole, resumed):
        assert torch.equal(p, q)
    # The checkpoint holds the full parameters (rank 0 wrote them), not rank 0's shards.
    saved = load_checkpoint(tmp_path / "checkpoint_6.pt")["model"]
    assert saved["rnn.weight_hh_l0"].shape == (4 * 5, 5)


def refuse(local_rank, path, what):
    from ignite_tbptt import AdaptiveTruncation

    torch.manual_seed(0)
    model = Net().double()
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    programs = "uncaptured" if what == "cuda_graphs" else False  # the same programs a GPU captures
    trainer = create_tbptt_trainer(model, optimizer, cross_entropy, 3, cuda_graphs=programs)
    if what == "adaptive":
        AdaptiveTruncation(0.1, 4, 12).attach(trainer)
    try:
        trainer.run(BATCHES[:1])
    except ValueError as error:
        if idist.get_rank() == 0:
            path.write_text(str(error))


@pytest.mark.parametrize(
    "what, message",
    [
        ("cuda_graphs", "cuda_graphs with a model sharded by FSDP2"),
        ("adaptive", "AdaptiveTruncation with a model sharded by FSDP2: each process would choose its own windows"),
    ],
)
def test_what_cannot_work_with_a_sharded_model_is_refused_when_the_run_starts(tmp_path, what, message, gloo):
    path = tmp_path / "error.txt"
    gloo().run(refuse, path, what)
    assert message in path.read_text()


def train_uneven(local_rank, path, starts):
    from ignite_tbptt.engine.distributed import ProcessesDisagree

    rank = idist.get_rank()
    model, trainer = build(True, 3, 7, 1, False)
    x, y = BATCHES[1]  # 12 steps; rank 1's batch is cut to 10
    batch = (x[: 12 - 2 * rank], y[: 12 - 2 * rank])
    if starts:  # only rank 0 marks sequence starts: the processes must still agree on the collectives they make
        batch = (*batch, torch.zeros(batch[0].shape[:2], dtype=torch.bool)) if rank == 0 else batch
    before = [p.to_local().clone() for p in model.parameters()]
    try:
        trainer.run([batch])
    except ProcessesDisagree as error:
        unchanged = all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
        path.with_name(f"rank{rank}.txt").write_text(f"{unchanged}\n{error}")


@pytest.mark.parametrize("starts", [False, True], ids=["no starts", "starts on one process"])
def test_batches_of_different_lengths_on_the_processes_are_refused_on_every_process_before_any_call(
    tmp_path, gloo, starts
):
    gloo().run(train_uneven, tmp_path / "error", starts)
    for rank in (0, 1):
        unchanged, message = (tmp_path / f"rank{rank}.txt").read_text().split("\n", 1)
        assert unchanged == "True"
        assert "batches differ in length (rank 0 has 12, rank 1 has 10 steps)" in message


def padded(batches):
    """The batches with the targets of columns 2 and 3, the second process's, padding in steps 3 to 8."""
    out = []
    for x, y in batches:
        y = y.clone()
        y[3:9, 2:] = -100
        out.append((x, y))
    return out


def counted_trainer(sharded):
    from ignite_tbptt import count_targets

    torch.manual_seed(0)
    model = Net().double()
    if sharded:
        shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    target_count_fn = lambda y_pred, y: count_targets(y)  # noqa: E731
    trainer = create_tbptt_trainer(
        model, optimizer, cross_entropy, 3, 7, carry_hidden=True, target_count_fn=target_count_fn
    )
    return model, trainer


def train_padded(local_rank, path):
    rank = idist.get_rank()
    model, trainer = counted_trainer(True)
    columns = slice(2 * rank, 2 * rank + 2)
    trainer.run([tuple(t[:, columns] for t in batch) for batch in padded(BATCHES)], max_epochs=2)
    params = [p.full_tensor().detach() for p in model.parameters()]
    if rank == 0:
        torch.save(params, path)


def test_a_segment_of_padding_only_on_one_process_still_makes_its_backward_calls(tmp_path, gloo):
    # Segments [3, 6) and [6, 9) of the first two batches hold no target on the second process: it backpropagates a
    # zero loss there, so that its backward calls meet the first process's (each runs FSDP2's collectives), and
    # the two together train as one process on the whole batch.
    gloo().run(train_padded, tmp_path / "params.pt")
    single, trainer = counted_trainer(False)
    trainer.run(padded(BATCHES), max_epochs=2)
    for p, q in zip(single.parameters(), torch.load(tmp_path / "params.pt")):
        torch.testing.assert_close(q, p.detach(), rtol=0, atol=1e-9)


XLSTM_TOKENS = torch.randint(0, 50, (8, 64 * 4 + 1), generator=torch.Generator().manual_seed(0))
XLSTM_BATCHES = [(XLSTM_TOKENS[:, i : i + 64], XLSTM_TOKENS[:, i + 1 : i + 65]) for i in range(0, 64 * 4, 64)]


def xlstm_trainer(sharded, parts=None):
    from ignite_tbptt.examples.char_lm import cross_entropy as char_loss
    from ignite_tbptt.examples.xlstm_lm import build_model, xlstm_model_fn

    torch.manual_seed(0)
    model = build_model(50)
    if sharded:  # every part model_fn calls: it bypasses the root's forward, where FSDP2 would gather the rest
        every = (model.embedding, *model.backbone.blocks, model.backbone.out_norm, model.lm_head)
        for part in every if parts is None else parts(model):
            fully_shard(part)
        fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    options = {"time_dim": 1, "carry_hidden": True, "model_fn": xlstm_model_fn}
    return model, create_tbptt_trainer(model, optimizer, char_loss, 16, 48, **options)


def train_xlstm(local_rank, path):
    rank, size = idist.get_rank(), idist.get_world_size()
    model, trainer = xlstm_trainer(sharded=True)
    rows = slice(rank * 8 // size, (rank + 1) * 8 // size)  # (B, T) batches: each process its rows
    trainer.run([(x[rows], y[rows]) for x, y in XLSTM_BATCHES])
    params = [p.full_tensor().detach() for p in model.parameters()]
    if rank == 0:
        torch.save(params, path)


def test_xlstm_large_sharded_through_its_model_fn_trains_as_one_process(tmp_path, gloo):
    pytest.importorskip("xlstm")
    path = tmp_path / "rank0.pt"
    gloo().run(train_xlstm, path)
    single, trainer = xlstm_trainer(sharded=False)
    trainer.run(XLSTM_BATCHES)
    # float32, the package's native kernels: the reductions' order differs, which Adam carries on.
    for p, q in zip(single.parameters(), torch.load(path)):
        torch.testing.assert_close(q, p.detach(), rtol=0, atol=1e-4)
    # Without the final norm sharded, its weight is never gathered: refused, naming the fix.
    gloo().run(train_ungathered, tmp_path / "error.txt")
    assert "Apply fully_shard to every part model_fn calls" in (tmp_path / "error.txt").read_text()


def train_ungathered(local_rank, path):
    model, trainer = xlstm_trainer(True, lambda model: (model.embedding, *model.backbone.blocks, model.lm_head))
    try:
        trainer.run(XLSTM_BATCHES[:2])
    except RuntimeError as error:
        if idist.get_rank() == 0:
            path.write_text(str(error))
