"""Log a TBPTT run to TensorBoard in one call, through ignite's ``TensorboardLogger``."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine, EventEnum, Events
from ignite.handlers import TensorboardLogger, global_step_from_engine
from ignite.handlers.tensorboard_logger import OptimizerParamsHandler

from ..checks import positive_int
from ..engine import DeterministicTBPTTEngine, TBPTTEngine, TBPTTEvents, TBPTTProcessFunction, tbptt_state
from .gradient_clipping import gradient_norm, keep_norm, step_norm

__all__ = ["attach_tensorboard"]

_TRAIN_ATTRIBUTES = ["window_loss", "grad_norm", "loss_scale", "targets_per_second", "peak_memory_mib"]


class _TokensLogged(EventEnum):
    """Fired where the training curves are logged, counted in targets: the x axis of ``OptimizerParamsHandler``."""

    TRAIN = "tbptt_train_logged_by_tokens"


def _peak_memory_mib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource
    except ImportError:  # not reported on this platform
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


class _Telemetry:
    """Puts what the "train" section logs into ``engine.state`` just before it is logged."""

    def __init__(self, trainer: Engine, step: TBPTTProcessFunction) -> None:
        self.last_time = time.perf_counter()  # set again as the run starts
        self.last_targets = 0
        params = step.parameters()
        self.device = params[0].device if params else torch.device("cpu")
        self.scaler = step.scaler
        state = tbptt_state(trainer)
        state.grad_norm = torch.tensor(float("nan"))
        state.loss_scale = float("nan")
        state.targets_per_second = float("nan")
        state.peak_memory_mib = float("nan")

    def started(self, engine: Engine) -> None:
        self.last_time, self.last_targets = time.perf_counter(), tbptt_state(engine).targets_seen

    def __call__(self, engine: Engine) -> None:
        now, seen = time.perf_counter(), tbptt_state(engine).targets_seen
        state = tbptt_state(engine)
        state.targets_per_second = (seen - self.last_targets) / max(now - self.last_time, 1e-9)
        self.last_time, self.last_targets = now, seen
        if self.scaler is not None:
            state.loss_scale = self.scaler.get_scale()
        peak = _peak_memory_mib(self.device)
        state.peak_memory_mib = float("nan") if peak is None else peak


def _log_programs(engine: Engine, tb: TensorboardLogger, step: Any) -> None:
    counts = getattr(engine.state, "programs", None)
    if counts is not None:  # cuda_graphs: how the windows and steps ran
        at = step(engine, TBPTTEvents.WINDOW_COMPLETED)
        for name, value in counts.as_dict().items():
            tb.writer.add_scalar(f"train/programs/{name}", value, at)


def _log_k2(engine: Engine, tb: TensorboardLogger, step: Any) -> None:
    k2 = getattr(engine.state, "k2", None)
    if k2 is not None:  # the k2 an AdaptiveTruncation chose
        tb.writer.add_scalar("train/k2", k2, step(engine, TBPTTEvents.WINDOW_COMPLETED))


class _ReachLog:
    """Logs :class:`~ignite_tbptt.GradientReach`'s profiles: a scalar per recorded window, a picture now and then."""

    def __init__(self, tb: TensorboardLogger, step: Any, picture_every: int) -> None:
        self.tb, self.step, self.picture_every = tb, step, picture_every
        self.profiles: list[dict[int, float]] = []

    def __call__(self, engine: Engine) -> None:
        state = tbptt_state(engine)
        reach = state.gradient_reach
        if not reach:
            return
        assert state.window_bounds is not None, "set by the trainer before a window's handlers run"
        start, end, cut = state.window_bounds
        step = self.step(engine, TBPTTEvents.WINDOW_COMPLETED)
        largest = max(reach.values())
        if end - cut in reach and largest > 0:  # no cut entry where the window reaches the stream's start
            self.tb.writer.add_scalar("train/reach_at_cut", reach[end - cut] / largest, step)
        self.profiles.append(reach)
        if len(self.profiles) == self.picture_every:
            from ..plot import plot_reach  # imports matplotlib

            if any(v > 0 for p in self.profiles for v in p.values()):
                self.tb.writer.add_figure("gradient_reach", plot_reach(self.profiles), step)
            self.profiles = []


def _fire_tokens_logged(engine: Engine) -> None:
    engine.fire_event(_TokensLogged.TRAIN)  # its handler, ignite's OptimizerParamsHandler, only logs


def _learned(engine: Engine, window: int, every: int) -> bool:
    return window % every == 0 and tbptt_state(engine).window_targets > 0


class _GradientNorm:
    """``engine.state.grad_norm`` at every optimizer step; inside the step program with window programs."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params

    def __call__(self, engine: Engine) -> None:
        gradient_norm(engine, self.params)

    def device_part(self, engine: Engine, shared: dict) -> torch.Tensor:
        return step_norm(shared, self.params)

    def host_part(self, engine: Engine, norm: torch.Tensor) -> None:
        keep_norm(engine, norm)


def attach_tensorboard(
    trainer: TBPTTEngine | DeterministicTBPTTEngine,
    logger: str | Path | TensorboardLogger,
    *,
    evaluators: Mapping[str, Engine] | None = None,
    hparams: Mapping[str, Any] | None = None,
    x_axis: str = "windows",
    every: int = 1,
    reach_picture_every: int = 100,
) -> TensorboardLogger:
    """Log the training curves, validation metrics, hyper-parameters and schedule of a TBPTT run.

    Everything goes through ignite's ``TensorboardLogger`` (``OutputHandler`` with state attributes). Every
    ``every`` windows (``TBPTTEvents.WINDOW_COMPLETED``), under ``train/``:

    - ``window_loss``: the window's mean per-target loss (nats for cross-entropy); windows of padding only
      (packed sequences) log none of the curves in this list;
    - ``grad_norm``: total 2-norm of the last optimizer step's gradients, before clipping (after unscaling);
    - ``lr/group_i``: each parameter group's learning rate (ignite's ``OptimizerParamsHandler``);
    - ``loss_scale``: the ``GradScaler``'s scale, when the trainer has one;
    - ``k2``: the k2 an attached :class:`~ignite_tbptt.AdaptiveTruncation` has chosen;
    - ``programs/captures``, ``programs/replays``, ``programs/warmups``, ``programs/eager_windows``,
      ``programs/evictions``, ``programs/eager/<reason>`` and ``programs/<kind>/<count>``: with ``cuda_graphs``, how
      the windows and steps ran so far (``engine.state.programs``, :class:`~ignite_tbptt.runtime.ProgramCounts`; the
      reasons are :class:`~ignite_tbptt.planning.EagerReason`'s values, the kinds ``window`` and ``step``);
    - ``targets_per_second``: targets (tokens) processed per second of wall-clock time since the last log;
    - ``peak_memory_mib``: peak memory in MiB, CUDA's allocator for a CUDA model, otherwise the process's
      peak resident set (where the platform reports it).

    With a :class:`~ignite_tbptt.GradientReach` (or an ``AdaptiveTruncation``) attached, for every recorded window
    ``train/reach_at_cut``: the hidden-state gradient norm at the window's cut over the largest of the window
    (near 1: truncation throws away as much gradient as it keeps, so k2 may be too short; orders of magnitude
    below 1: k2 reaches far enough), and every ``reach_picture_every`` recorded windows the picture
    ``gradient_reach`` of their profiles (:func:`~ignite_tbptt.plot_reach`).

    After each run of an evaluator, its ``engine.state.metrics`` under the evaluator's name. Once, at
    attachment: the hyper-parameters (the trainer's k1, k2, ..., those of an ``AdaptiveTruncation`` attached
    before, and ``hparams``) for TensorBoard's HParams tab, and the schedule picture
    (:func:`~ignite_tbptt.plot_schedule`) as the image ``schedule``.

    Args:
        trainer: an engine from :func:`~ignite_tbptt.create_tbptt_trainer`.
        logger: a log directory, or a ``TensorboardLogger`` to add to.
        evaluators: evaluators by name (the tag), e.g. ``{"validation": evaluator}``.
        hparams: more hyper-parameters to record (ints, floats, strings, bools).
        x_axis: ``"windows"`` (``engine.state.window``) or ``"tokens"`` (``tbptt_state(engine).targets_seen``, the
            targets processed so far) for every curve, validation included.
        every: log the training curves every ``every`` windows.
        reach_picture_every: recorded windows per gradient-reach picture.

    Returns:
        The ``TensorboardLogger``; close it at the end of the run (``logger.close()``).

    Raises:
        TypeError: if ``trainer`` does not come from ``create_tbptt_trainer``, or ``every`` or
            ``reach_picture_every`` is not an int.
        ValueError: if ``x_axis`` is neither ``"windows"`` nor ``"tokens"``, or ``every`` or
            ``reach_picture_every`` is not positive.
    """
    if not hasattr(trainer, "tbptt"):
        raise TypeError("trainer must be an engine returned by create_tbptt_trainer.")
    if x_axis not in ("windows", "tokens"):
        raise ValueError(f'x_axis must be "windows" or "tokens", got {x_axis!r}.')
    positive_int("every", every, "windows between logs")
    positive_int("reach_picture_every", reach_picture_every, "recorded windows per picture")
    tb = logger if isinstance(logger, TensorboardLogger) else TensorboardLogger(log_dir=str(logger))
    if x_axis == "windows":
        # ignite annotates the event as Events, but takes any event, a custom EventEnum's included.
        step = global_step_from_engine(trainer, TBPTTEvents.WINDOW_COMPLETED)  # type: ignore[arg-type]
    else:

        def step(_: Engine, __: Any) -> int:
            return tbptt_state(trainer).targets_seen

    tbptt = TBPTTProcessFunction.of(trainer, "attach_tensorboard")
    params = tbptt.parameters()
    trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_STARTED, _GradientNorm(params))
    telemetry = _Telemetry(trainer, tbptt)
    trainer.add_event_handler(Events.STARTED, telemetry.started)
    window_event = TBPTTEvents.WINDOW_COMPLETED(every=every)
    trainer.add_event_handler(window_event, telemetry)
    attributes = [a for a in _TRAIN_ATTRIBUTES if a != "loss_scale" or tbptt.scaler is not None]
    # A window of padding only (packed sequences) learned nothing: its loss of 0.0 would draw a false dip.
    learned = TBPTTEvents.WINDOW_COMPLETED(event_filter=lambda engine, window: _learned(engine, window, every))
    tb.attach_output_handler(trainer, learned, tag="train", state_attributes=attributes, global_step_transform=step)
    lr_event: Any = window_event
    if x_axis == "tokens":
        trainer.register_events(*_TokensLogged, event_to_attr={_TokensLogged.TRAIN: "targets_seen"})
        trainer.add_event_handler(window_event, _fire_tokens_logged)
        lr_event = _TokensLogged.TRAIN
    tb.attach(trainer, OptimizerParamsHandler(tbptt.optimizer, tag="train"), lr_event)
    # Whether a GradientReach or an AdaptiveTruncation is attached, before or after this call, shows in the state.
    trainer.add_event_handler(window_event, _log_k2, tb, step)
    trainer.add_event_handler(window_event, _log_programs, tb, step)
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, _ReachLog(tb, step, reach_picture_every))
    for name, evaluator in (evaluators or {}).items():
        tb.attach_output_handler(evaluator, Events.COMPLETED, tag=name, metric_names="all", global_step_transform=step)

    values = {**tbptt.hparams(), **(hparams or {})}
    tb.writer.add_hparams(values, {}, run_name=".")  # "." keeps them in the run's own directory
    windows = tbptt.window_source.hparams()
    if "k1" in windows and "k2" in windows:
        from ..plot import plot_schedule  # imports matplotlib

        k1, k2 = windows["k1"], windows["k2"]
        tb.writer.add_figure("schedule", plot_schedule(k1, k2, n_steps=min(4 * k1 + k2, 12 * k1)))
    return tb
