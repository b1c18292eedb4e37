"""Several windows per replay: a batch's windows and their optimizer steps as one program (``cuda_graphs``).

Each test trains eagerly and with programs (uncaptured on the CPU, captured under ``--device cuda``) and compares
parameters, counters and outputs: bit for bit on the CPU. Each counts the windows batch programs ran, so that it
cannot pass with none; where a batch program must not run, it checks that none did.
"""

import contextlib
from unittest import mock

import pytest
import torch
from ignite.engine import Events
from ignite.handlers import LRScheduler

from ignite_tbptt import GradientClipping, TBPTTEvents, count_targets, create_tbptt_trainer
from ignite_tbptt.runtime.programs import batch as batch_programs

from .test_executor import CharModel, assert_same, batches, loss_fn, programs
from .test_step import fused_adam, fused_sgd, poisoned_at
from .test_step import train as train_stepping

pytestmark = pytest.mark.usefixtures("replayed_mode")  # each test replayed on the CPU, captured on CUDA


@contextlib.contextmanager
def counting_windows():
    """The windows batch programs ran inside the block, one entry per window."""
    runs = []
    original = batch_programs.BatchProgram.__call__

    def counted(self, *args):
        runs.extend([self] * len(self.windows))
        return original(self, *args)

    with mock.patch.object(batch_programs.BatchProgram, "__call__", counted):
        yield runs


def train(cuda_graphs, data, make=fused_sgd, handlers=(), **options):
    """``test_step.train``, counting the windows batch programs ran and keeping each iteration's output."""
    outputs = []

    def collect(trainer, model, optimizer):
        trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda engine: outputs.append(engine.state.output))

    with counting_windows() as windows:
        model, trainer, _ = train_stepping(cuda_graphs, data, make, [*handlers, collect], **options)
    return model, trainer, windows, outputs


WINDOWS = (5 - 2) + 3 * 5 + (5 - 1) + 3 * 5  # the windows of two epochs that batch programs run

COUNTERS = ("iteration", "window", "optimizer_step", "targets_seen", "window_targets", "step_targets")


def assert_same_run(eager, programmed, device):
    (a, a_trainer, _, a_outputs), (b, b_trainer, _, b_outputs) = eager, programmed
    assert_same(a, b, device)
    assert [getattr(a_trainer.state, c) for c in COUNTERS] == [getattr(b_trainer.state, c) for c in COUNTERS]
    assert a_trainer.state.window_bounds == b_trainer.state.window_bounds
    assert b_outputs == pytest.approx(a_outputs, rel=1e-12, abs=0)  # each iteration's mean loss


@pytest.mark.parametrize(
    "make, accumulation",
    [(fused_sgd, 1), (fused_adam, 1), (fused_sgd, 3), (fused_adam, 2)],
    ids=["SGD", "Adam", "SGD, 3 windows a step", "Adam, 2 windows a step"],
)
def test_the_windows_of_a_batch_and_their_steps_run_as_one_program(device, make, accumulation):
    data = batches()
    eager = train(False, data, make, gradient_accumulation_steps=accumulation)
    programmed = train(True, data, make, gradient_accumulation_steps=accumulation)
    assert_same_run(eager, programmed, device)
    assert not eager[2]
    # 4 batches of 5 windows an epoch, each batch one program once programs may run: after the run's first two
    # windows (no state yet; the model call's check) and each later stream's first.
    assert len(programmed[2]) == WINDOWS


def test_clipping_and_resets_at_windows_first_steps(device):
    data = []
    for x, y in batches():
        starts = torch.zeros(x.shape, dtype=torch.bool)
        starts[10, 1] = starts[20, 3] = True  # at windows' first steps: reset masks inside the program
        data.append((x, y, starts))

    def clip(trainer, model, optimizer):
        GradientClipping(model, max_norm=0.5).attach(trainer)

    eager = train(False, data, fused_adam, handlers=[clip])
    programmed = train(True, data, fused_adam, handlers=[clip])
    assert_same_run(eager, programmed, device)
    assert len(programmed[2]) == WINDOWS


def test_a_sequence_start_inside_a_window_ends_the_batch_program_before_that_window(device):
    data = []
    for i, (x, y) in enumerate(batches()):
        starts = torch.zeros(x.shape, dtype=torch.bool)
        if i == 2:
            starts[12, 0] = True  # inside the window [10, 15) of the third batch: two model calls
        data.append((x, y, starts))
    eager = train(False, data)
    programmed = train(True, data)
    assert_same_run(eager, programmed, device)
    # In the third batch of each epoch, the windows before [10, 15) ran as one program; it and the rest, one by one.
    assert len(programmed[2]) == WINDOWS - 2 * 3


def listening(event):
    def attach(trainer, model, optimizer):
        trainer.add_event_handler(event, lambda engine: None)

    return attach


@pytest.mark.parametrize(
    "handlers, options",
    [
        ([listening(TBPTTEvents.WINDOW_COMPLETED)], {}),
        ([listening(TBPTTEvents.WINDOW_STARTED)], {}),
        ([listening(TBPTTEvents.OPTIMIZER_STEP_COMPLETED)], {}),
        ([listening(TBPTTEvents.OPTIMIZER_STEP_STARTED)], {}),
        ([], {"scaler": True, "dtype": torch.float32}),
        ([], {"output_transform": lambda x, y, y_pred, loss: loss.item()}),
    ],
    ids=["window completed", "window started", "step completed", "a host handler of the step",
         "a scaler", "output_transform"],
)  # fmt: skip
def test_what_needs_the_host_between_windows_runs_them_one_by_one(device, handlers, options):
    data = batches()
    eager = train(False, data, handlers=handlers, **options)
    programmed = train(True, data, handlers=handlers, **options)
    if options.get("dtype") is torch.float32 and device.type != "cpu":
        for p, q in zip(eager[0].parameters(), programmed[0].parameters()):
            torch.testing.assert_close(p, q)
    else:
        assert_same(eager[0], programmed[0], device)
    assert not programmed[2]


def test_a_learning_rate_schedule_between_batches_reaches_every_step(device):
    def schedule(trainer, model, optimizer):
        scheduler = LRScheduler(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5))
        trainer.add_event_handler(Events.ITERATION_COMPLETED, scheduler)

    data = batches()
    eager = train(False, data, handlers=[schedule])
    programmed = train(True, data, handlers=[schedule])
    assert_same_run(eager, programmed, device)
    assert len(programmed[2]) == WINDOWS


def test_non_finite_gradients_in_a_batch_program_name_the_first_refused_step(device):
    # NaN in the 13th window's loss, the third of the third batch (a batch program), as the data say.
    data, poisoned = poisoned_at(batches(), 2, 12)
    torch.manual_seed(0)
    model = CharModel().double()
    trainer = create_tbptt_trainer(
        model, fused_adam(model.parameters()), poisoned, 5, carry_hidden=True, cuda_graphs=programs(True)
    )
    with counting_windows() as windows, pytest.raises(FloatingPointError, match=r"optimizer step 13 \(window 13"):
        trainer.run(data, max_epochs=1)
    # The first batch's last 3 windows, the second's 5, the third's 5, whose steps after the 13th were skipped too.
    assert len(windows) == 13


def test_batches_that_are_streams_of_their_own_run_all_but_their_first_window_at_once(device):
    data = batches()
    eager = train(False, data, carry_hidden=False)
    programmed = train(True, data, carry_hidden=False)
    assert_same_run(eager, programmed, device)
    # Each batch's first window has no state yet, and the run's second is the model call's check.
    assert len(programmed[2]) == (5 - 2) + 7 * (5 - 1)


def summed_over_counted(y_pred, y):
    """The mean over the real targets as a sum over their count: its gradient is NaN (0 / 0) without any.

    (Cross-entropy alone gives ignored targets a gradient of exactly 0 whatever flows into it; the term that adds
    nothing here lets the NaN reach the predictions, as a loss of one's own might.)
    """
    mask = (y != -100).flatten()
    losses = torch.nn.functional.cross_entropy(y_pred.flatten(0, 1).float(), y.flatten(), reduction="none")
    losses = losses + 0.0 * y_pred.float().mean(-1).flatten()
    return (losses * mask).sum() / mask.sum()


@pytest.mark.parametrize("accumulation", [1, 2], ids=["a step a window", "2 windows a step"])
def test_target_counts_stay_on_the_device_through_the_batch(device, accumulation):
    # Padding (-100) here and there, a window of padding only (the second batch's [5, 10)), and with 2 windows a step
    # a step of padding only (the third batch's [10, 20): the epoch's windows 13 and 14): no gradient from them, and
    # no step taken where there is no target, as eagerly.
    data = []
    for i, (x, y) in enumerate(batches()):
        y = y.clone()
        y[2, 1] = y[13, 3] = y[21, 0] = -100
        if i == 1:
            y[5:10] = -100
        if i == 2:
            y[10:20] = -100
        data.append((x, y))
    options = {
        "target_count_fn": lambda y_pred, y: count_targets(y),
        "gradient_accumulation_steps": accumulation,
        "loss": summed_over_counted,
    }
    eager = train(False, data, fused_adam, **options)
    programmed = train(True, data, fused_adam, **options)
    assert_same_run(eager, programmed, device)
    assert len(programmed[2]) == WINDOWS
    # The steps without targets were not taken: 3 windows of padding only an epoch, or 1 step of 2 of them.
    assert eager[1].state.optimizer_step == (2 * (20 - 3) if accumulation == 1 else 2 * (10 - 1))


def test_handlers_that_only_read_the_state_run_after_the_replay_each_with_its_windows_state(device, tmp_path):
    # The main job's handlers: clipping, the TensorBoard logger (ignite's handlers and the package's own, which only
    # read the state), target counts; and a handler of one's own marked reads_state_only.
    from ignite_tbptt import attach_tensorboard

    def main_jobs(folder, records):
        def record(engine):
            state = engine.state
            records.append(
                (state.window, state.window_bounds, float(state.window_loss), state.window_targets,
                 float(state.grad_norm), state.optimizer_step, state.targets_seen)
            )  # fmt: skip

        record.reads_state_only = True

        def attach(trainer, model, optimizer):
            GradientClipping(model, max_norm=0.5).attach(trainer)
            attach_tensorboard(trainer, folder, every=2)
            trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, record)

        return attach

    data, eager_records, records = batches(), [], []
    options = {"target_count_fn": lambda y_pred, y: count_targets(y)}
    eager = train(False, data, fused_adam, [main_jobs(tmp_path / "eager", eager_records)], **options)
    programmed = train(True, data, fused_adam, [main_jobs(tmp_path / "programs", records)], **options)
    assert_same_run(eager, programmed, device)
    assert len(programmed[2]) == WINDOWS
    assert records == eager_records and len(records) == 40  # each window's own state, in order


def test_a_handler_not_marked_as_reading_only_keeps_the_windows_one_by_one(device):
    def record(engine):
        pass

    def attach(trainer, model, optimizer):
        trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED(every=2), record)

    assert not train(True, batches(), handlers=[attach])[2]
    record.reads_state_only = True  # through ignite's wrapper of a filtered event
    assert len(train(True, batches(), handlers=[attach])[2]) == WINDOWS


@pytest.mark.parametrize("stop_at", [2, 3])
def test_a_run_resumed_mid_accumulation_ends_as_the_uninterrupted_one(tmp_path, device, stop_at):
    # 3 windows a step: the checkpoint after 10 or 15 windows holds 1 or 0 windows' gradients, kept in the static
    # buffers by the batch programs and saved from .grad.
    from ...helpers import assert_resume_is_bit_identical

    def build():
        torch.manual_seed(0)
        model = CharModel().double()
        optimizer = fused_adam(model.parameters())
        trainer = create_tbptt_trainer(
            model,
            optimizer,
            loss_fn,
            5,
            carry_hidden=True,
            gradient_accumulation_steps=3,
            deterministic=True,
            cuda_graphs=programs(True),
        )
        return model, optimizer, trainer

    with counting_windows() as windows:
        assert_resume_is_bit_identical(tmp_path, build, batches(), stop_at=stop_at, epochs=2)
    assert windows  # batch programs ran in each of the three runs


def test_a_first_step_without_targets_leaves_the_batch_window_by_window(device):
    # A fused SGD with momentum sets its momentum at its first step: a first step skipped on the device (no targets)
    # would leave it unset. Until a step was taken, batches with target counts run window by window.
    data = [(x, y.clone()) for x, y in batches()]
    data[0][1][:15] = -100  # the first batch's first three windows: padding only

    def sgd(params):
        return torch.optim.SGD(params, lr=0.125, momentum=0.5, fused=True)

    options = {"target_count_fn": lambda y_pred, y: count_targets(y)}
    eager = train(False, data, sgd, **options)
    programmed = train(True, data, sgd, **options)
    assert_same_run(eager, programmed, device)
    assert len(programmed[2]) == WINDOWS - 3  # the first batch's last windows ran one by one: no step yet


@pytest.mark.parametrize("accumulation", [1, 2, 3])
def test_a_batch_ending_inside_a_window_runs_its_whole_windows_as_one_program(device, accumulation):
    # Batches of 23 steps, windows of 5: each batch's whole windows run at once, the window it ends inside (its last
    # segment here, its first in the next batch) one by one.
    g = torch.Generator().manual_seed(0)
    stream = torch.randint(0, 10, (4 * 23 + 1, 4), generator=g).to(torch.get_default_device())
    data = [(stream[i : i + 23], stream[i + 1 : i + 24]) for i in range(0, 4 * 23, 23)]
    eager = train(False, data, gradient_accumulation_steps=accumulation)
    programmed = train(True, data, gradient_accumulation_steps=accumulation)
    assert_same_run(eager, programmed, device)
    # Epoch 1: [10, 20) of the first batch, then [25, 45), [50, 65) and [70, 92) of the others (the stream's end
    # closes its last window); epoch 2 alike, with [5, 20) in the first.
    assert len(programmed[2]) == (2 + 4 + 3 + 5) + (3 + 4 + 3 + 5)
