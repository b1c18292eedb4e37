"""Side by side with ignite's create_supervised_tbptt_trainer: what ignite's tests and handlers expect of it.

Each scenario runs ignite's trainer and ours on the same seeded model and data (k1 = k2, a fresh hidden state
every batch, no accumulation: the drop-in case of SPEC.md) and asserts the same observable result.
"""

import copy
import math

import pytest
import torch
from ignite.contrib.engines import create_supervised_tbptt_trainer
from ignite.contrib.engines.tbptt import Tbptt_Events
from ignite.engine import Engine, Events
from ignite.handlers import TerminateOnNan

from ignite_tbptt import TBPTTEvents, create_tbptt_evaluator, create_tbptt_trainer

from ..helpers import make_batches, sgd
from ..reference import Net, cross_entropy


def both(k=2, net=lambda: Net(), time_dim=0, optimizer=sgd, dtype=torch.float64):
    """The two trainers, each with its own copy of the same model and an optimizer of the same kind."""
    torch.manual_seed(0)
    model = net().to(dtype)
    runs = {}
    for name in ("ignite", "ours"):
        m = copy.deepcopy(model)
        opt = optimizer(m)
        if name == "ignite":
            trainer = create_supervised_tbptt_trainer(m, opt, cross_entropy, tbtt_step=k, dim=time_dim)
        else:
            trainer = create_tbptt_trainer(m, opt, cross_entropy, k, time_dim=time_dim)
        runs[name] = (m, opt, trainer)
    return runs


class CountingModel(Net):
    """Records how many arguments each call gets."""

    def __init__(self):
        super().__init__()
        self.arguments = []

    def forward(self, x, hidden=None):
        self.arguments.append(1 if hidden is None else 2)
        return super().forward(x, hidden)


class CountingSGD(torch.optim.SGD):
    def __init__(self, model):
        super().__init__(model.parameters(), lr=0.1)
        self.zero_grads = self.steps = 0

    def zero_grad(self, set_to_none=True):
        self.zero_grads += 1
        super().zero_grad(set_to_none)

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


def test_calls_events_and_optimizer_steps_per_chunk():
    # ignite's own scenario: a batch of 5 steps in chunks of 2 gives 3 chunks.
    seen = {}
    for name, (model, optimizer, trainer) in both(k=2, net=CountingModel, optimizer=CountingSGD).items():
        events = []
        trainer.add_event_handler(Tbptt_Events.TIME_ITERATION_STARTED, lambda _, ev=events: ev.append("started"))
        trainer.add_event_handler(Tbptt_Events.TIME_ITERATION_COMPLETED, lambda _, ev=events: ev.append("completed"))
        trainer.run(make_batches([5]))
        seen[name] = (events, model.arguments, optimizer.zero_grads, optimizer.steps)
    assert seen["ours"] == seen["ignite"]
    assert seen["ours"] == (["started", "completed"] * 3, [1, 2, 2], 3, 3)


@pytest.mark.parametrize("time_dim", [0, 1])
def test_same_parameters_and_chunk_outputs(time_dim):
    runs = both(k=3, net=lambda: Net(batch_first=time_dim == 1), time_dim=time_dim)
    outputs = {}
    for name, (_, _, trainer) in runs.items():
        outputs[name] = []
        # Per-chunk logging written for ignite: it reads engine.state.output, the chunk's loss as a float.
        trainer.add_event_handler(
            Tbptt_Events.TIME_ITERATION_COMPLETED, lambda e, out=outputs[name]: out.append(e.state.output)
        )
        trainer.run(make_batches([7, 9, 6], time_dim=time_dim), max_epochs=2)
    assert all(isinstance(v, float) for v in outputs["ours"])
    assert outputs["ours"] == pytest.approx(outputs["ignite"], rel=1e-12)
    for p, q in zip(runs["ours"][0].parameters(), runs["ignite"][0].parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda m: torch.optim.Adam(m.parameters(), lr=0.01),  # checked with one read per step
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=True),  # skips on an accelerator
    ],
    ids=["adam", "fused-sgd"],
)
def test_float32_parameters_equal_ignites_bit_for_bit(optimizer):
    # A window alone in its step backpropagates its mean loss, as ignite's trainer does: no rounding of ours.
    runs = both(k=3, optimizer=optimizer, dtype=torch.float32)
    outputs = {}
    for name, (_, _, trainer) in runs.items():
        outputs[name] = []
        trainer.add_event_handler(
            Tbptt_Events.TIME_ITERATION_COMPLETED, lambda e, out=outputs[name]: out.append(e.state.output)
        )
        trainer.run([(x.float(), y) for x, y in make_batches([7, 9, 6])], max_epochs=2)
    assert outputs["ours"] == outputs["ignite"]
    for p, q in zip(runs["ours"][0].parameters(), runs["ignite"][0].parameters()):
        assert p.dtype == torch.float32 and torch.equal(p, q)


def test_window_completed_handlers_read_the_window_loss_as_output():
    _, _, trainer = both(k=3)["ours"]
    seen = []
    trainer.add_event_handler(
        TBPTTEvents.WINDOW_COMPLETED, lambda e: seen.append((e.state.output, float(e.state.window_loss)))
    )
    state = trainer.run(make_batches([7]))
    assert len(seen) == 3 and all(output == loss for output, loss in seen)
    assert isinstance(state.output, float)  # after the iteration: output_transform's value, the batch's mean


class ModeRecordingNet(Net):
    """Records whether each call runs in training mode (dropout on)."""

    def __init__(self):
        super().__init__(dropout=0.5)
        self.modes = []

    def forward(self, x, hidden=None):
        self.modes.append(self.training)
        return super().forward(x, hidden)


def test_every_chunk_trains_even_if_a_handler_evaluated_the_model():
    # A handler that evaluates mid-batch leaves the model in eval mode (ignite's trainer calls train() per chunk).
    modes = {}
    for name, (model, _, trainer) in both(k=2, net=lambda: Net(dropout=0.5)).items():
        modes[name] = []
        original = model.forward
        model.forward = lambda x, hidden=None, m=model, seen=modes[name], f=original: (
            seen.append(m.training),
            f(x, hidden),
        )[1]
        trainer.add_event_handler(Tbptt_Events.TIME_ITERATION_COMPLETED, lambda _, m=model: m.eval())
        trainer.run(make_batches([6, 5]))
    assert modes["ours"] == modes["ignite"] == [True] * 6


def test_the_evaluator_leaves_the_model_in_the_mode_it_found():
    model, _, trainer = both(k=2, net=lambda: Net(dropout=0.5))["ours"]
    evaluator = create_tbptt_evaluator(model)
    modes = []
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED(once=2), lambda _: evaluator.run(make_batches([4])))
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda _: modes.append(model.training))
    trainer.run(make_batches([6]))
    assert modes == [True, True, True]
    model.eval()
    evaluator.run(make_batches([4]))
    assert not model.training


def nan_batches():
    batches = make_batches([6, 6, 6, 6])
    batches[2][0][1, 0, 0] = float("nan")  # the third iteration's loss and gradients are NaN
    return batches


def test_terminate_on_nan_ends_both_runs_cleanly_at_the_same_iteration():
    ends = {}
    for name, (_, _, trainer) in both(k=3).items():
        trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan())
        state = trainer.run(nan_batches(), max_epochs=2)
        ends[name] = state.iteration
        assert math.isnan(state.output)
    assert ends["ours"] == ends["ignite"] == 3
    model, _, trainer = both(k=3)["ours"]
    assert trainer.state.window == 0  # (a fresh trainer, for the parameters below)
    finite = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan())
    trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_COMPLETED, lambda _: finite.append(copy.deepcopy(model)))
    state = trainer.run(nan_batches(), max_epochs=2)
    assert state.window == 5  # windows 1-4 stepped; window 5 holds the NaN and is not applied
    for p, q in zip(model.parameters(), finite[-1].parameters()):
        assert torch.equal(p, q) and torch.isfinite(p).all()


def test_without_a_terminating_handler_the_error_comes_before_any_further_window():
    model, _, trainer = both(k=3)["ours"]
    outputs = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(e.state.output))
    with pytest.raises(FloatingPointError, match="non-finite gradients"):
        trainer.run(nan_batches())
    assert trainer.state.window == 5 and trainer.state.iteration == 4  # raised as iteration 4 started
    assert math.isnan(outputs[-1]) and len(outputs) == 3
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_nan_in_the_last_iteration_is_raised_when_the_epoch_completes():
    model, _, trainer = both(k=3)["ours"]
    batches = make_batches([6, 6])
    batches[1][0][4, 0, 0] = float("nan")
    completed = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda _: completed.append(True))
    with pytest.raises(FloatingPointError):
        trainer.run(batches)
    assert not completed  # the trainer's own EPOCH_COMPLETED handler raised first


def test_a_state_saved_by_ignites_trainer_resumes_at_its_epoch_and_iteration():
    runs = both(k=3)
    batches = make_batches([7, 9, 6])
    ignite_model, ignite_optimizer, ignite_trainer = runs["ignite"]
    saved = {}

    def save(engine):
        saved.update(
            trainer=copy.deepcopy(engine.state_dict()),
            model=copy.deepcopy(ignite_model.state_dict()),
            optimizer=copy.deepcopy(ignite_optimizer.state_dict()),
        )

    ignite_trainer.add_event_handler(Events.EPOCH_COMPLETED(once=1), save)
    ignite_trainer.run(batches, max_epochs=3)

    model, optimizer, trainer = runs["ours"]
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    trainer.load_state_dict(saved["trainer"])
    assert (trainer.state.epoch, trainer.state.iteration, trainer.state.window) == (1, 3, 0)
    trainer.run(batches)
    assert (trainer.state.epoch, trainer.state.iteration) == (3, 9)
    for p, q in zip(model.parameters(), ignite_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)  # as if ignite's run had gone on


def test_a_plain_engine_state_loads_too():
    _, _, trainer = both(k=3)["ours"]
    plain = Engine(lambda e, b: None)
    plain.run([0, 1], max_epochs=2)
    trainer.load_state_dict(plain.state_dict())
    assert (trainer.state.epoch, trainer.state.iteration, trainer.state.optimizer_step) == (2, 4, 0)


class Wrapped:
    """An optimizer wrapper as third-party libraries write them: not a torch.optim.Optimizer."""

    def __init__(self, optimizer):
        self.inner = optimizer
        self.param_groups = optimizer.param_groups

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)

    def step(self, closure=None):
        return self.inner.step(closure)


def test_optimizers_are_checked_by_what_the_trainer_uses():
    runs = both(k=3, optimizer=lambda m: Wrapped(sgd(m)))
    for _, _, trainer in runs.values():
        trainer.run(make_batches([7, 5]))
    for p, q in zip(runs["ours"][0].parameters(), runs["ignite"][0].parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)

    class NoStep:
        param_groups = []

        def zero_grad(self):
            pass

    with pytest.raises(TypeError, match="NoStep has no step"):
        create_tbptt_trainer(Net(), NoStep(), cross_entropy, 3)


def test_a_zero_weight_rnn_learns_its_recurrent_weight_from_detached_leaf_states():
    # ignite's scenario: nn.RNN(1, 1) with zero weights, SGD(lr=1), MSE, chunks of 2 over 6 steps. Only
    # updates between chunks let the second chunk's hidden state depend on the weights.
    results = {}
    for name in ("ignite", "ours"):
        model = torch.nn.RNN(1, 1, bias=False)
        for p in model.parameters():
            p.data.zero_()
        calls = []
        model.register_forward_hook(lambda m, inputs, out, calls=calls: calls.append(inputs))
        optimizer = torch.optim.SGD(model.parameters(), 1.0)
        loss = torch.nn.functional.mse_loss
        if name == "ignite":
            trainer = create_supervised_tbptt_trainer(model, optimizer, loss, tbtt_step=2)
        else:
            trainer = create_tbptt_trainer(model, optimizer, loss, 2)
        trainer.run([(torch.ones(6, 2, 1), torch.ones(6, 2, 1))])
        shapes = [(len(inputs), len(inputs) == 1 or inputs[1].is_leaf) for inputs in calls]
        results[name] = (model.weight_hh_l0.item(), shapes)
    assert results["ours"] == results["ignite"]
    assert results["ours"][0] != pytest.approx(0) and results["ours"][1] == [(1, True), (2, True), (2, True)]
