import copy
import gc
import warnings
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ignite.engine import Events
from torch import nn

from ignite_tbptt import TBPTTEvents, create_tbptt_trainer
from ignite_tbptt.engine.optimizer_step import OptimizerStep

from ..helpers import NoLength, RecordingNet, make_batches, sgd
from ..reference import Net, cross_entropy, spec_cut

# -- bad input --------------------------------------------------------------------------------------------------

CREATION_ERRORS = [
    ({"k1": 0}, ValueError, "k1 must be a positive int"),
    ({"k1": 2.5}, TypeError, "k1 must be a positive int"),
    ({"k2": "4"}, TypeError, "k2 must be a positive int"),
    ({"k2": -1}, ValueError, "k2 must be a positive int"),
    ({"time_dim": 1.0}, TypeError, "time_dim must be an int"),
    ({"gradient_accumulation_steps": 0}, ValueError, "gradient_accumulation_steps must be a positive int"),
    ({"scaler": "yes"}, TypeError, "scaler must be a torch.amp.GradScaler"),
    ({"autocast_dtype": "bf16"}, TypeError, "autocast_dtype must be a torch.dtype"),
    ({"model_fn": 3}, TypeError, "model_fn must be callable"),
    ({"optimizer": "other"}, ValueError, "optimizer holds none of model's parameters"),
]


@pytest.mark.parametrize("kwargs,error,match", CREATION_ERRORS, ids=[m.split()[0] for _, _, m in CREATION_ERRORS])
def test_bad_arguments_are_rejected_when_the_trainer_is_created(kwargs, error, match):
    model = Net().double()
    args = {"k1": 3, "optimizer": sgd(model)}
    args.update(kwargs)
    if args["optimizer"] == "other":
        args["optimizer"] = sgd(Net())
    optimizer, k1 = args.pop("optimizer"), args.pop("k1")
    with pytest.raises(error, match=match):
        create_tbptt_trainer(model, optimizer, cross_entropy, k1, **args)


def test_a_scaler_with_bfloat16_warns():
    model = Net()
    with pytest.warns(UserWarning, match="only needed with float16"):
        create_tbptt_trainer(model, sgd(model), cross_entropy, 3, scaler=True, autocast_dtype=torch.bfloat16)


def shrink_hidden(model, x, hidden):
    y_pred, (h, c) = model(x) if hidden is None else model(x, hidden)
    return y_pred, (h[:, :1], c[:, :1])


((GOOD_X, GOOD_Y),) = make_batches([6])
RUN_ERRORS = [
    ("time_dim out of range", {"time_dim": 3}, (GOOD_X, GOOD_Y), ValueError, "time_dim=3 is out of range"),
    ("x and y lengths", {}, (GOOD_X, GOOD_Y[:5]), ValueError, "same length along time_dim=0"),
    ("no steps", {}, (GOOD_X[:0], GOOD_Y[:0]), ValueError, "empty batch"),
    ("no streams", {}, (GOOD_X[:, :0], GOOD_Y[:, :0]), ValueError, "empty batch"),
    ("not tensors", {}, ({"tokens": GOOD_X}, GOOD_Y), TypeError, "prepare_batch must return tensors"),
    ("model output", {"model_fn": lambda m, x, h: m(x)[0]}, (GOOD_X, GOOD_Y), TypeError, r"return \(y_pred, hidden\)"),
    ("hidden changes", {"model_fn": shrink_hidden, "carry_hidden": True}, (GOOD_X, GOOD_Y), ValueError, "hidden state"),
    ("streams change", {"carry_hidden": True}, (GOOD_X[:, :2], GOOD_Y[:, :2]), ValueError, "3 parallel streams"),
    ("starts as a list", {}, (GOOD_X, GOOD_Y, [[False] * 3] * 6), TypeError, "starts must be a bool tensor"),
]


LOSS_ERRORS = [
    ("a float", lambda y_pred, y: cross_entropy(y_pred, y).item(), TypeError, "got float"),
    (
        "per target",
        lambda y_pred, y: nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten(), reduction="none"),
        ValueError,
        r"0-dim tensor .*got shape \(",
    ),
    ("detached", lambda y_pred, y: cross_entropy(y_pred.detach(), y), ValueError, "without a graph"),
]


@pytest.mark.parametrize("loss_fn,error,match", [c[1:] for c in LOSS_ERRORS], ids=[c[0] for c in LOSS_ERRORS])
def test_a_bad_loss_fn_raises_a_clear_error_before_any_backward(loss_fn, error, match):
    torch.manual_seed(0)
    model = Net().double()
    before = copy.deepcopy(model)
    trainer = create_tbptt_trainer(model, sgd(model), loss_fn, 3, 5)
    with pytest.raises(error, match=match):
        trainer.run([(GOOD_X, GOOD_Y)])
    assert trainer.state.optimizer_step == 0
    for p, q in zip(model.parameters(), before.parameters()):
        assert torch.equal(p, q) and p.grad is None


@pytest.mark.parametrize("kwargs,batch,error,match", [c[1:] for c in RUN_ERRORS], ids=[c[0] for c in RUN_ERRORS])
def test_a_bad_batch_raises_a_clear_error_before_changing_anything(kwargs, batch, error, match):
    torch.manual_seed(0)
    model = Net().double()
    model_fn = kwargs.pop("model_fn", None)
    calls = {"n": 0}

    def fn(m, x, h):
        calls["n"] += 1
        if model_fn is not None and calls["n"] > 2:  # the good batch's two windows ran normally
            return model_fn(m, x, h)
        return m(x) if h is None else m(x, h)

    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 3, model_fn=fn, **kwargs)
    trained = {"model": copy.deepcopy(model)}
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=1), lambda _: trained.update(model=copy.deepcopy(model)))
    # A good batch trains first (but time_dim=3 fits no batch of this shape).
    data = [batch] if "time_dim" in kwargs else [(GOOD_X, GOOD_Y), batch]
    with pytest.raises(error, match=match):
        trainer.run(data)
    for p, q in zip(model.parameters(), trained["model"].parameters()):
        assert torch.equal(p, q)


# -- numerical faults -------------------------------------------------------------------------------------------


def test_without_a_scaler_non_finite_gradients_stop_training_before_the_step():
    torch.manual_seed(0)
    model = Net().double()
    batches = make_batches([6, 6, 6])
    batches[1][0][4, 1, 2] = float("nan")
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 3, 5, carry_hidden=True)
    last = {}
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_COMPLETED,
        lambda e: last.update(model=copy.deepcopy(model), step=e.state.optimizer_step),
    )
    with pytest.raises(FloatingPointError, match="non-finite gradients at optimizer step 4") as refused:
        trainer.run(batches)
    assert "inputs or targets hold NaN or inf" in str(refused.value)  # here the batch's input is the cause
    assert last["step"] == 3  # windows 1-3 stepped; window 4 (steps 9-11) holds the NaN
    for p, q in zip(model.parameters(), last["model"].parameters()):
        assert torch.equal(p, q) and torch.isfinite(p).all()
    assert not trainer.tbptt.history.segments


def test_with_a_scaler_a_nan_step_is_skipped_and_training_recovers():
    torch.manual_seed(0)
    model = RecordingNet().double()
    batches = make_batches([12, 12, 12])
    batches[1][0][4, :, 0] = float("nan")  # poisons the carried hidden state of every stream
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 3, 7, carry_hidden=True, scaler=True)
    snapshots = []

    @trainer.on(TBPTTEvents.OPTIMIZER_STEP_COMPLETED)
    def record(engine):
        snapshots.append(([p.detach().clone() for p in model.parameters()], len(trainer.tbptt.history.segments)))

    trainer.run(batches)
    params = [s[0] for s in snapshots]
    skipped = [i for i in range(1, len(params)) if all(torch.equal(p, q) for p, q in zip(params[i - 1], params[i]))]
    assert skipped == [5]  # window 6 (steps 15-17) holds the NaN: its step, and only it, is skipped
    assert snapshots[5][1] == 0  # the retained history was dropped after the skipped step
    assert model.fresh_calls == [0, 18]  # the NaN hidden state restarted at the next window
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not torch.equal(snapshots[-1][0][0], snapshots[5][0][0])  # later steps were applied


# -- long runs --------------------------------------------------------------------------------------------------


def live_objects():
    gc.collect()
    objects = gc.get_objects()
    with warnings.catch_warnings():  # the scan touches torch's deprecated aliases (torch.distributed.reduce_op)
        warnings.simplefilter("ignore", FutureWarning)
        return len(objects), sum(isinstance(o, torch.Tensor) for o in objects)


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.slow  # 20,000 windows
@pytest.mark.cpu_only("20,000 launch-bound windows take minutes on a GPU, and the memory it bounds is the host's")
def test_twenty_thousand_windows_keep_objects_graphs_and_memory_bounded():
    torch.manual_seed(0)
    model = Net("rnn", n_hidden=4)
    x = torch.randn(20_000, 2, 3)
    y = torch.randint(0, 4, (20_000, 2))
    batches = [(x[i : i + 1000], y[i : i + 1000]) for i in range(0, 20_000, 1000)]
    # k2 > k1 with accumulation: history outlives windows and optimizer steps (weight copies) all along.
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), 1e-2),
        cross_entropy,
        1,
        3,
        carry_hidden=True,
        gradient_accumulation_steps=4,
    )
    samples, spans = [], []

    @trainer.on(TBPTTEvents.WINDOW_COMPLETED)
    def measure(engine):
        spans.append(len(trainer.tbptt.history.segments))
        if engine.state.window % 4000 == 0:
            samples.append((*live_objects(), resident_mib()))

    trainer.run(batches)
    assert trainer.state.window == 20_000
    assert max(spans) == 2  # k2 - k1 segments of one step, never more
    (objects0, tensors0, rss0), *later = samples
    for objects, tensors, rss in later:
        assert objects - objects0 < 200 and tensors - tensors0 < 20, samples
        assert rss - rss0 < 16, samples


# -- properties of the trainer's windows, cuts and counts -------------------------------------------------------


class Accumulator(torch.nn.Module):
    """``h_t = h_{t-1} + x_t``, ``y_pred_t = w * h_t``: the loss of step u reaches x_s with gradient w."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones((), dtype=torch.float64))

    def forward(self, x, hidden=None):
        h = torch.cumsum(x, 0) + (0 if hidden is None else hidden)
        return self.w * h, h[-1]


@settings(max_examples=60, deadline=None)
@given(
    k1=st.integers(1, 6),
    k2=st.integers(1, 9),
    lengths=st.lists(st.integers(1, 11), min_size=1, max_size=4),
    accumulation=st.integers(1, 3),
    carry_hidden=st.booleans(),
    length_known=st.booleans(),
)
def test_every_target_counts_once_and_every_loss_reaches_back_to_its_spec_cut(
    k1, k2, lengths, accumulation, carry_hidden, length_known
):
    model = Accumulator()
    xs = [torch.zeros(n, 2, dtype=torch.float64, requires_grad=True) for n in lengths]
    batches = [(x, torch.ones(len(x), 2, dtype=torch.float64)) for x in xs]
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        lambda y_pred, y: (y_pred * y).mean(),  # each target's loss has gradient 1 w.r.t. its prediction
        k1,
        k2,
        carry_hidden=carry_hidden,
        gradient_accumulation_steps=accumulation,
        prepare_batch=lambda batch, device, non_blocking: batch,
    )
    step_targets = []
    trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_STARTED, lambda e: step_targets.append(e.state.step_targets))
    # x.grad counts the losses reaching each step only while every window backpropagates its summed loss: a
    # window alone in its step may backpropagate its mean instead (the same parameter gradient after the step's
    # division, checked against brute force elsewhere).
    with mock.patch.object(OptimizerStep, "one_window_per_step", new_callable=mock.PropertyMock, return_value=False):
        trainer.run(batches if length_known else NoLength(batches))

    streams = [sum(lengths)] if carry_hidden else lengths
    reach, windows = [], []
    for length in streams:
        count = [0] * length
        for start in range(0, length, k1):
            end = min(start + k1, length)
            cut = spec_cut(k1, k2, start, end)
            windows.append(end - start)
            for u in range(start, end):
                for s in range(cut if u >= cut else u, u + 1):
                    count[s] += 1
        reach += count
    got = torch.cat([x.grad[:, 0] for x in xs]).tolist()
    assert got == reach  # x_s got one unit of gradient per loss whose backward pass reaches it
    groups = [sum(windows[i : i + accumulation]) * 2 for i in range(0, len(windows), accumulation)]
    assert step_targets == groups and sum(step_targets) == 2 * sum(lengths) == trainer.state.targets_seen
