"""The optimizer step inside the program (``cuda_graphs``): division, check, clipping, step and scale on the device.

Each test trains the same model eagerly and with programs (uncaptured on the CPU, captured under ``--device cuda``)
and compares the parameters: bit for bit on the CPU, where the programs run the eager step's operations. Each counts
the steps the step programs took, so that it cannot pass with every step eager. Learning rates are multiples of
powers of two, exact in float32, the dtype torch's fused CUDA kernels read a tensor learning rate in.
"""

import contextlib
from unittest import mock

import pytest
import torch
from ignite.engine import Events
from ignite.handlers import LRScheduler, PiecewiseLinear, create_lr_scheduler_with_warmup

from ignite_tbptt import GradientClipping, TBPTTEvents, create_tbptt_trainer
from ignite_tbptt.runtime.programs import step as step_programs
from ignite_tbptt.runtime.programs.recording import RecordingError

from .program_mode import assert_replayed, mode
from .test_window import CharModel, assert_same, batches, loss_fn, programs

pytestmark = pytest.mark.usefixtures("recorded_mode")  # each test recorded on the CPU, captured on CUDA


def fused_sgd(params):
    return torch.optim.SGD(params, lr=0.125, momentum=0.5, weight_decay=2**-6, fused=True)


def fused_adam(params):
    return torch.optim.Adam(params, lr=2**-6, fused=True)


def fused_adamw(params):
    return torch.optim.AdamW(params, lr=2**-6, weight_decay=0.25, fused=True)


@contextlib.contextmanager
def counting_steps():
    """The optimizer steps programs took inside the block, one entry per step: its step program."""
    runs = []
    step = step_programs.StepProgram.step

    def counted(self):
        runs.append(self)
        return step(self)

    with mock.patch.object(step_programs.StepProgram, "step", counted):
        yield runs


def train(
    cuda_graphs, data, make=fused_sgd, handlers=(), dtype=torch.float64, loss=loss_fn, epochs=2, replays=True, **options
):
    torch.manual_seed(0)
    model = CharModel().to(dtype)
    optimizer = make(model.parameters())
    options = {"k1": 5, "carry_hidden": True, **options}
    trainer = create_tbptt_trainer(model, optimizer, loss, cuda_graphs=programs(cuda_graphs), **options)
    for attach in handlers:
        attach(trainer, model, optimizer)
    with counting_steps() as steps:
        trainer.run(data, max_epochs=epochs)
    if cuda_graphs is True and replays:  # the window programs, and the step programs where steps ran as programs
        assert_replayed(trainer, "window", *(["step"] if steps else []))
    return model, trainer, steps


@pytest.mark.parametrize("make", [fused_sgd, fused_adam, fused_adamw], ids=["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("accumulation", [1, 3], ids=["a step a window", "3 windows a step"])
def test_fused_optimizers_step_inside_the_program(device, make, accumulation):
    data = batches()
    eager, eager_trainer, none = train(False, data, make, gradient_accumulation_steps=accumulation)
    model, trainer, steps = train(True, data, make, gradient_accumulation_steps=accumulation)
    assert_same(eager, model, device)
    assert not none
    # Every step, those after the stream's first windows (which run eagerly) too: their gradients are moved into
    # the static buffers first.
    # 20 windows an epoch: 20 steps, or 7 (six of 3 windows, and the epoch's last 2).
    assert (
        len(steps)
        == trainer.state.optimizer_step
        == eager_trainer.state.optimizer_step
        == (40 if accumulation == 1 else 14)
    )
    # One step program served every step: a step's shape does not change with its windows.
    assert len({id(p) for p in steps}) == 1


def test_an_optimizer_that_cannot_skip_on_the_device_steps_eagerly(device):
    data = batches()
    foreach = lambda params: torch.optim.AdamW(params, lr=2**-6, foreach=True)  # noqa: E731
    eager, _, _ = train(False, data, foreach)
    model, trainer, steps = train(True, data, foreach)
    assert_same(eager, model, device)
    assert not steps and trainer.state.optimizer_step == 40


def test_a_grad_scaler_unscales_steps_and_updates_inside_the_program(device):
    data = batches()
    options = {"dtype": torch.float32, "scaler": True}
    eager, _, _ = train(False, data, fused_adam, **options)
    model, trainer, steps = train(True, data, fused_adam, **options)
    if device.type == "cpu":
        assert_same(eager, model, device)
    else:
        for p, q in zip(eager.parameters(), model.parameters()):
            torch.testing.assert_close(p, q)
    assert len(steps) == 40
    scaler = trainer._process_function.scaler
    assert scaler.get_scale() == train(False, data, fused_adam, **options)[1]._process_function.scaler.get_scale()


def norms_after_each_step(trainer, model, optimizer):
    trainer.state.norms = []
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_COMPLETED, lambda engine: engine.state.norms.append(engine.state.grad_norm.item())
    )


def clip_by_norm(trainer, model, optimizer):
    GradientClipping(model, max_norm=0.5).attach(trainer)


def clip_by_value(trainer, model, optimizer):
    GradientClipping(model, max_value=0.01).attach(trainer)


def on_the_host(trainer, model, optimizer):
    trainer.state.seen = []

    @trainer.on(TBPTTEvents.OPTIMIZER_STEP_STARTED)
    def _(engine):  # the final gradients, before clipping where it comes after
        engine.state.seen.append(sum(p.grad.abs().sum().item() for p in model.parameters()))


def doubles(trainer, model, optimizer):
    @trainer.on(TBPTTEvents.OPTIMIZER_STEP_STARTED)
    def _(engine):  # new tensors, not the buffers a step program reads
        for p in model.parameters():
            p.grad = p.grad * 2


@pytest.mark.parametrize(
    "handlers, host",
    [
        ([clip_by_norm, norms_after_each_step], False),
        ([clip_by_value, norms_after_each_step], False),
        ([on_the_host, clip_by_norm, norms_after_each_step], True),
        ([clip_by_norm, on_the_host, norms_after_each_step], True),
        ([doubles, clip_by_norm, norms_after_each_step], True),
    ],
    ids=["by norm", "by value", "a host handler before", "a host handler after", "a host handler's new gradients"],
)
def test_clipping_runs_inside_the_step_and_a_host_handler_makes_the_step_eager(device, handlers, host):
    # A handler of OPTIMIZER_STEP_STARTED without a device part runs on the host between the division and the step:
    # the step then runs eagerly, every handler in its order, counted; the windows still run as programs.
    data = batches()
    eager, eager_trainer, _ = train(False, data, fused_sgd, handlers)
    model, trainer, steps = train(True, data, fused_sgd, handlers)
    assert_same(eager, model, device)
    assert trainer.state.norms == eager_trainer.state.norms  # the norm before clipping, on engine.state
    if hasattr(trainer.state, "seen"):  # the handler saw the gradients of the eager step at the same moment
        assert trainer.state.seen == eager_trainer.state.seen
    if host:
        assert not steps and trainer.state.programs.eager == {"checks": 3, "step/host_handlers": 40}
    else:
        assert len(steps) == 40 and len(steps[0].handlers) == 1  # the clipping, inside


def attach_at_steps(scheduler):
    def attach(trainer, model, optimizer):
        trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_COMPLETED, scheduler(optimizer))
        trainer.state.rates = []
        group = optimizer.param_groups[0]
        trainer.add_event_handler(
            TBPTTEvents.OPTIMIZER_STEP_COMPLETED,
            lambda engine: engine.state.rates.append((group["lr"], group["momentum"])),
        )

    return attach


SCHEDULERS = {
    "LRScheduler": lambda opt: LRScheduler(torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)),
    "PiecewiseLinear": lambda opt: PiecewiseLinear(opt, "lr", milestones_values=[(0, 0.0), (16, 0.25), (40, 0.125)]),
    "warm-up": lambda opt: create_lr_scheduler_with_warmup(
        torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5), warmup_start_value=0.0, warmup_end_value=0.125,
        warmup_duration=8,
    ),
    "momentum": lambda opt: PiecewiseLinear(opt, "momentum", milestones_values=[(0, 0.5), (2, 0.75), (4, 0.875)]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_ignites_schedulers_reach_the_step_at_every_step(device, name):
    data = batches()
    attach = attach_at_steps(SCHEDULERS[name])
    eager, eager_trainer, _ = train(False, data, fused_sgd, [attach])
    model, trainer, steps = train(True, data, fused_sgd, [attach])
    assert_same(eager, model, device)
    assert len(steps) == 40
    assert trainer.state.rates == eager_trainer.state.rates and len(set(trainer.state.rates)) > 3
    assert all(isinstance(lr, float) for lr, _ in trainer.state.rates)  # the group's own value, not the buffer
    programs_made = {id(p) for p in steps}
    # A learning rate reaches the one program through its buffer; each momentum (0.5, 0.625, 0.75, 0.8125, 0.875)
    # makes a new program.
    assert len(programs_made) == (5 if name == "momentum" else 1)


def poisoned_at(data, batch, step):
    """``data`` with a target of -1 at ``step`` of ``batch``, and a loss that is NaN for a window holding one.

    The data decide which window is NaN, as a program replayed without its Python sees them (a count of loss_fn's
    calls would not: a replay makes none).
    """
    data = [(x, y.clone()) for x, y in data]
    data[batch][1][step, 0] = -1

    def poisoned(y_pred, y):
        nan_or_one = torch.where((y < 0).any(), torch.nan, 1.0)  # a factor of the loss: where's other branch is 0
        return loss_fn(y_pred, y.clamp(min=0)) * nan_or_one

    return data, poisoned


def test_a_step_with_non_finite_gradients_is_skipped_on_the_device_and_named_at_the_iterations_end(device):
    # The 13th window (the third of iteration 3, steps 10-14) has a NaN loss: its step, the 13th, NaN gradients.
    data, poisoned = poisoned_at(batches(), 2, 12)
    torch.manual_seed(0)
    model = CharModel().double()
    trainer = create_tbptt_trainer(model, fused_adam(model.parameters()), poisoned, 5, cuda_graphs=programs(True))
    params = {}
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_COMPLETED(once=12),
        lambda _: params.update(before=[p.clone() for p in model.parameters()]),
    )
    with counting_steps() as steps, pytest.raises(FloatingPointError) as error:
        trainer.run(data, max_epochs=1)
    # The iteration's last windows ran, their steps skipped on the device; the decisions were read at its end.
    assert "optimizer step 13 (window 13, iteration 3)" in str(error.value)
    assert "every later step of the iteration were not taken" in str(error.value)
    assert len(steps) == 15
    for p, q in zip(params["before"], model.parameters()):
        assert torch.equal(p, q)
    assert trainer.state.iteration == 4  # raised as the next iteration starts, as after a step refused eagerly
    assert_replayed(trainer, "window", "step")  # the refused step was a replay's, not a warm-up's


def test_gradients_stay_in_static_buffers_across_steps(device):
    data = batches()
    grads = []

    def record(trainer, model, optimizer):
        trainer.add_event_handler(
            TBPTTEvents.OPTIMIZER_STEP_COMPLETED, lambda _: grads.append([p.grad for p in model.parameters()])
        )

    _, _, steps = train(True, data, fused_sgd, [record])
    assert len(steps) == 40
    # zero_grad() sets .grad to None between steps; each step's first window puts the same buffers back.
    assert all(g is h for step in grads[1:] for g, h in zip(step, grads[0]))


def test_a_profiled_run_steps_eagerly(device):
    data = batches(count=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        _, trainer, steps = train(True, data, fused_sgd, epochs=1, replays=False)
    assert not steps and trainer.state.optimizer_step == 5


def test_events_fire_once_per_step_in_order(device):
    fired = []

    def listen(trainer, model, optimizer):
        for event in (
            TBPTTEvents.OPTIMIZER_STEP_STARTED,
            TBPTTEvents.OPTIMIZER_STEP_COMPLETED,
            Events.ITERATION_COMPLETED,
        ):
            trainer.add_event_handler(event, lambda engine, e=event: fired.append((e, engine.state.optimizer_step)))
        GradientClipping(model, max_norm=0.5).attach(trainer)

    train(True, batches(count=2), fused_sgd, [listen], epochs=1)
    expected = []
    for step in range(1, 11):
        expected += [(TBPTTEvents.OPTIMIZER_STEP_STARTED, step), (TBPTTEvents.OPTIMIZER_STEP_COMPLETED, step)]
        if step % 5 == 0:
            expected.append((Events.ITERATION_COMPLETED, step))
    assert fired == expected


def test_tensorboards_gradient_norm_and_clipping_leave_the_step_one_program(device, tmp_path):
    from ignite_tbptt import attach_tensorboard

    def main_jobs(folder):
        def attach(trainer, model, optimizer):  # as the main job attaches them: clipping, then the logger
            GradientClipping(model, max_norm=0.5).attach(trainer)
            attach_tensorboard(trainer, folder, every=5)
            norms_after_each_step(trainer, model, optimizer)

        return attach

    data = batches()
    eager, eager_trainer, _ = train(False, data, fused_adam, [main_jobs(tmp_path / "eager")])
    model, trainer, steps = train(True, data, fused_adam, [main_jobs(tmp_path / "programs")])
    assert_same(eager, model, device)
    assert trainer.state.norms == eager_trainer.state.norms  # the norm before clipping, as eagerly
    assert len(steps) == 40 and len(steps[0].handlers) == 2


MARK = 7  # a window whose first step reads this token in every column has a NaN gradient in the second dtype


class SqrtOfZeroWhereMarked(torch.nn.Module):
    """A float64 parameter at 1, whose gradient is NaN in a window that starts marked: sqrt(g * 0) there."""

    def __init__(self):
        super().__init__()
        self.g = torch.nn.Parameter(torch.ones((), dtype=torch.float64))

    def forward(self, y, x):
        marked = (x[0] == MARK).all().to(self.g.dtype)  # on the device: no read
        return y + torch.sqrt(self.g * (1 - marked)).to(y.dtype)


class WithSqrtOfZero(CharModel):
    """A float64 parameter besides the float32 model, last in the optimizer's order, NaN gradient where marked."""

    def __init__(self):
        super().__init__()
        self.tail = SqrtOfZeroWhereMarked()  # a child registered last: its parameter comes last

    def forward(self, x, hidden=None):
        y, hidden = super().forward(x, hidden)
        return self.tail(y, x), hidden


def test_an_inf_gradient_in_a_second_dtype_refuses_the_step(device):
    # The division and check run once per dtype: the decision of each reaches the step. The 9th window (steps 40-44)
    # starts marked, so that its step comes after the step programs' warm-up and capture: a replay refuses it.
    data = batches()
    data[1][0][15] = MARK
    errors = {}
    for cuda_graphs in (False, True):
        torch.manual_seed(0)
        model = WithSqrtOfZero()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.125, fused=True)
        trainer = create_tbptt_trainer(
            model, optimizer, loss_fn, 5, carry_hidden=True, cuda_graphs=programs(cuda_graphs)
        )
        before = {}
        trainer.add_event_handler(
            TBPTTEvents.OPTIMIZER_STEP_COMPLETED(once=8),
            lambda _, kept=before, tail=model.tail: kept.update(g=tail.g.item()),
        )
        with pytest.raises(FloatingPointError) as error:
            trainer.run(data, max_epochs=1)
        errors[cuda_graphs] = str(error.value)
        assert before["g"] != 1.0 and model.tail.g.item() == before["g"]  # steps 1-8 taken, the 9th not
        if cuda_graphs:
            assert_replayed(trainer, "window", "step")
    assert "optimizer step 9 " in errors[False] and "optimizer step 9 " in errors[True]


def test_a_learning_rate_set_by_a_host_handler_of_the_step_reaches_it_eagerly(device):
    def schedule(trainer, model, optimizer):
        scheduler = PiecewiseLinear(optimizer, "lr", milestones_values=[(0, 0.0), (16, 0.25), (40, 0.125)])
        trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_STARTED, scheduler)  # on the host, before the step

    def momentum(trainer, model, optimizer):
        scheduler = PiecewiseLinear(optimizer, "momentum", milestones_values=[(0, 0.5), (2, 0.75), (4, 0.875)])
        trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_STARTED, scheduler)

    data = batches()
    for attach in (schedule, momentum):
        eager, _, _ = train(False, data, fused_sgd, [attach])
        model, trainer, steps = train(True, data, fused_sgd, [attach])
        assert_same(eager, model, device)
        # On the host: each step eagerly (a scheduler on OPTIMIZER_STEP_COMPLETED keeps them programs, above).
        assert not steps and trainer.state.programs.eager["step/host_handlers"] == 40


def test_two_clippings_share_the_steps_norm_as_eagerly(device):
    def clip_twice(trainer, model, optimizer):
        GradientClipping(model, max_value=0.01).attach(trainer)
        GradientClipping(model, max_norm=0.02).attach(trainer)  # by the norm before any clipping, as eagerly

    data = batches()
    eager, _, _ = train(False, data, fused_sgd, [clip_twice])
    model, _, steps = train(True, data, fused_sgd, [clip_twice])
    assert_same(eager, model, device)
    assert len(steps) == 40


def test_a_scaler_that_skips_a_step_restarts_an_overflowed_hidden_state(device):
    # One inf input overflows the carried state: the scaler skips the step, and the stream's state starts afresh, as
    # eagerly (the program's decision is read after the step, as the eager step's).
    data = [(x.clone(), y) for x, y in batches()]

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding, self.rnn, self.out = torch.nn.Embedding(10, 6), torch.nn.RNN(6, 8), torch.nn.Linear(8, 10)
            self.scale = torch.nn.Parameter(torch.ones(()))

        def forward(self, x, hidden=None):
            e = self.embedding(x.clamp(max=9)) * self.scale
            e = torch.where(x[..., None] == 99, torch.inf, e)
            h, hidden = self.rnn(e, hidden)
            return self.out(h), hidden

    data[1][0][12, 2] = 99  # an input that reads as inf
    outputs = {}
    for cuda_graphs in (False, True):
        torch.manual_seed(0)
        model = Linear()
        optimizer = torch.optim.Adam(model.parameters(), lr=2**-6, fused=True)
        trainer = create_tbptt_trainer(
            model, optimizer, loss_fn, 5, carry_hidden=True, scaler=True, cuda_graphs=programs(cuda_graphs)
        )
        losses = []
        trainer.add_event_handler(
            Events.ITERATION_COMPLETED, lambda engine, kept=losses: kept.append(engine.state.output)
        )
        trainer.run(data, max_epochs=1)
        outputs[cuda_graphs] = (losses, [p.detach().clone() for p in model.parameters()])
        if cuda_graphs:
            assert_replayed(trainer, "window", "step")
    (a, ps), (b, qs) = outputs[False], outputs[True]
    assert a[2] == a[2] and a[3] == a[3]  # after the overflow the eager run learns on
    assert b == pytest.approx(a, nan_ok=True, rel=1e-6)
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_an_optimizer_state_reassigned_between_steps_gets_a_new_program(device):
    # A handler that restarts Adam's moments with new tensors (not in place): a step captured before would read the
    # old ones, freed. The step programs follow the state's tensors, as they follow the parameters' storage.
    def restart_moments(trainer, model, optimizer):
        def restart(engine):
            for state in optimizer.state.values():
                state["exp_avg"], state["exp_avg_sq"] = (
                    torch.zeros_like(state["exp_avg"]),
                    torch.zeros_like(state["exp_avg_sq"]),
                )

        trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_COMPLETED(every=15), restart)

    data = batches()
    eager, _, _ = train(False, data, fused_adam, [restart_moments])
    if mode() == "recorded":  # without a new program, the replay names what it reads that was freed
        with mock.patch.object(step_programs.StepProgram, "stale", lambda self: False):
            message = r"the optimizer step reads the optimizer's state 'exp_avg' of parameter 0, a 10x6 float64"
            with pytest.raises(RecordingError, match=message):
                train(True, data, fused_adam, [restart_moments])
    model, _, steps = train(True, data, fused_adam, [restart_moments])
    assert_same(eager, model, device)
    # Captured, a new program after steps 15 and 30; uncaptured, the program reads the state as it is every step.
    assert len({id(program) for program in steps}) == (1 if mode() == "uncaptured" else 3)
