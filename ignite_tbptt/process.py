"""The process function of a TBPTT(k1, k2) trainer: segments, windows and optimizer steps along a stream."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import torch
from ignite.contrib.engines.tbptt import Tbptt_Events
from ignite.engine import Engine, Events

from . import distributed
from . import hidden as hs
from .backward_sweep import RetainedHistory, reach_profile
from .batch import check_pair, check_resettable, default_reset_hidden, split_batch, start_rows
from .compiled import retainable
from .events import COUNTERS, TBPTTEvents, fire, listened, register_tbptt_events
from .executor import SegmentExecutor, profiled
from .forward import ModelCall
from .loss_sum import LossSum
from .optimizer_step import OptimizerStep
from .plan import SegmentPlan, plan_segment
from .resume import configuration
from .schedule import WindowSource
from .stream import StreamState
from .versions import ParameterVersions

__all__ = ["TBPTTStep", "tbptt_step_of"]

_SOURCE_CHANGE = "the window source can only change before a run or between epochs; a stream is at step {}."


class TBPTTStep:
    """Process function of a TBPTT(k1, k2) trainer; build it with :func:`~ignite_tbptt.tbptt_training_step`.

    Each iteration plans the batch's segments (:func:`~ignite_tbptt.plan.plan_segment`), has a
    :class:`~ignite_tbptt.executor.SegmentExecutor` run them and the backward sweep of every window that closes,
    and takes the optimizer step of every accumulation that completes, firing ignite's events around them. Each
    piece of state has one owner: the stream (position, hidden state, open window, retained history and the
    weight versions it needs, the window source) is a :class:`~ignite_tbptt.stream.StreamState`, the accumulated
    windows, the optimizer and the scaler an :class:`~ignite_tbptt.optimizer_step.OptimizerStep`;
    :meth:`state_dict` saves both. It attaches itself to the engine that runs it, on the first iteration at the
    latest, so ``Engine(tbptt_training_step(...))`` works as ignite's ``Engine(supervised_training_step(...))``.

    Host reads: none per window unless asked for. The iteration's output (``loss.item()`` by default) is one read
    per iteration, as in ignite. ``engine.state.output`` is set to the window's mean loss as a float, one read,
    only while a handler listens to ``TBPTTEvents.WINDOW_COMPLETED`` or ``Tbptt_Events.TIME_ITERATION_COMPLETED``.
    Without a scaler, the finiteness check of an optimizer step reads nothing with an optimizer that skips on the
    device (fused ``SGD``, ``Adam``, ``AdamW``), whose decisions are read once at the iteration's end, and one
    value per step with any other. With a ``GradScaler``, whether it skipped a step is one read per step (besides
    what ``GradScaler.step`` reads with an unfused optimizer). A batch with ``starts`` costs one read to find them.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        source: WindowSource,
        *,
        model_call: ModelCall,
        optimizer_step: OptimizerStep,
        time_dim: int,
        carry_hidden: bool,
        device: str | torch.device | None,
        non_blocking: bool,
        prepare_batch: Callable,
        output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] | None,
        target_count_fn: Callable[[Any, Any], int] | None,
        recompute: int | None = None,
    ) -> None:
        self.model, self.optim = model, optimizer_step
        self.time_dim, self.carry_hidden, self.recompute = time_dim, carry_hidden, recompute
        self.device, self.non_blocking, self.prepare_batch = device, non_blocking, prepare_batch
        self.output_transform = output_transform
        # Only windows that reach into earlier ones keep graphs alive across an optimizer step.
        versions = ParameterVersions(optimizer_step.parameters) if source.spans_windows else None
        history = RetainedHistory(model_call, optimizer_step.parameters, versions, recompute is not None)
        self.stream = StreamState(source, history)
        # What checkpoints record, to refuse a resume into another configuration (ignite_tbptt.resume).
        self.configuration = configuration(source, carry_hidden, recompute, optimizer_step.accumulation)
        self.executor = SegmentExecutor(model_call, loss_fn, self.stream, optimizer_step.scaler, target_count_fn)
        self._engine: Engine | None = None
        self._loaded: dict | None = None
        self._failed: FloatingPointError | None = None  # a step refused for non-finite gradients, not yet raised
        self.reach_every: tuple[int, ...] = ()  # record the gradient reach of every n-th window, for each n
        self.reach_stride: int | None = None  # and split a recorded window's segments this often
        self._recording = False

    @property
    def source(self) -> WindowSource:
        """The window source of the stream."""
        return self.stream.source

    @property
    def schedule(self) -> WindowSource:
        """The window source (a :class:`~ignite_tbptt.Schedule` for fixed k1, k2)."""
        return self.stream.source

    @property
    def history(self) -> RetainedHistory:
        """The stream's retained segments."""
        return self.stream.history

    @property
    def versions(self) -> ParameterVersions | None:
        """The weight versions retained graphs need across optimizer steps (``None`` while no window reaches back)."""
        return self.stream.history.versions

    @property
    def optimizer(self) -> Any:
        """The optimizer."""
        return self.optim.optimizer

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The ``GradScaler``, or ``None``."""
        return self.optim.scaler

    def parameters(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates, in its order."""
        return self.optim.parameters()

    def hparams(self) -> dict[str, Any]:
        """The trainer's hyper-parameters, for logging."""
        return {
            **self.source.hparams(),
            "carry_hidden": self.carry_hidden,
            "gradient_accumulation_steps": self.optim.accumulation,
            "scaler": self.scaler is not None,
            "recompute": self.recompute or 0,
        }

    # -- ignite wiring -----------------------------------------------------------------------------------------
    def attach(self, engine: Engine) -> None:
        """Register the events, counters and the handlers that start and end streams and epochs on ``engine``."""
        register_tbptt_events(engine)
        engine.state.window_loss = engine.state.window_bounds = engine.state.gradient_reach = None
        engine.state.window_targets = engine.state.targets_seen = engine.state.step_targets = 0
        if "targets_seen" not in engine.state_dict_user_keys:
            engine.state_dict_user_keys.append("targets_seen")
        engine.add_event_handler(Events.STARTED, self._started)
        engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.end_epoch)
        self._engine = engine
        self.source.connect(engine, self)

    def use_source(self, source: WindowSource) -> None:
        """Take the windows of the streams from ``source``, before a stream starts (before a run or between epochs).

        Handlers that plan windows (:class:`~ignite_tbptt.AdaptiveTruncation`) install their source here. A
        source whose windows reach into earlier ones gets the weight versions it needs.

        Raises:
            RuntimeError: if a stream is under way: its windows so far kept no more history than the old
                source's cuts needed.
        """
        if self.stream.position > 0:
            raise RuntimeError(_SOURCE_CHANGE.format(self.stream.position))
        if source.spans_windows and self.history.versions is None:
            self.history.versions = ParameterVersions(self.optim.parameters)
        self.stream.source = source
        if self._engine is not None:
            source.connect(self._engine, self)

    def record_reach(self, every: int, stride: int | None = None) -> None:
        """Record the gradient reach of every ``every``-th window too; a ``stride`` splits recorded windows.

        The windows any handler asks for are recorded (GradientReach, AdaptiveTruncation).
        """
        self.reach_every = tuple(sorted({*self.reach_every, every}))
        self.reach_stride = stride if stride is not None else self.reach_stride

    def _records(self, window: int) -> bool:
        return bool(self.reach_every) and any(window % every == 0 for every in self.reach_every)

    def _started(self, engine: Engine) -> None:
        self._failed = None
        self.optim.failure()  # forget decisions of an interrupted run
        self.optim.distributed = distributed.is_distributed()
        if self.optim.distributed:
            distributed.broadcast_parameters(self.parameters())
        if engine.state.iteration == 0:
            _zero_counters(engine)
        if self._loaded is not None and engine.state.iteration > 0:
            self._check_source(self._loaded)
            try:
                self.stream.load_state_dict(self._loaded)
                self.optim.load_state_dict(self._loaded)
            except BaseException:  # neither half of a checkpoint: the stream starts afresh
                self._loaded = None
                self.stream.reset()
                self.optim.reset()
                raise
            # A window left open goes on being recorded if it was (GradientReach, AdaptiveTruncation).
            self._recording = self.stream.window is not None and self._records(engine.state.window)
        else:
            self.stream.reset()
            self.optim.reset()
        self._loaded = None

    def _check_source(self, state: dict[str, Any]) -> None:
        saved = state.get("configuration", {}).get("source")
        if saved is not None and saved != type(self.source).__name__ and state["position"] > 0:
            self._loaded = None
            raise ValueError(
                f"the checkpoint's stream is under way with windows from {saved}, this trainer's come from "
                f"{type(self.source).__name__}: attach the same handlers (e.g. AdaptiveTruncation) before resuming."
            )

    def _epoch_started(self, engine: Engine) -> None:
        # A run resumed mid-epoch fires EPOCH_STARTED again; the restored stream goes on.
        if engine.state.epoch_length is None or engine.state.iteration % engine.state.epoch_length == 0:
            self.stream.reset()

    def _attach_late(self, engine: Engine) -> None:
        # Engine(step) without create_tbptt_trainer: STARTED and the first EPOCH_STARTED have already fired.
        self.attach(engine)
        _zero_counters(engine)
        self._started(engine)

    def state_dict(self) -> dict[str, Any]:
        """The stream's state (position, hidden state, open window, retained history) and accumulated gradients.

        The retained graphs are saved as what rebuilds them (each segment's input, input hidden state,
        random state, and the weights it ran with); :meth:`load_state_dict` rebuilds them when the next run
        starts, so that resuming gives the parameters of an uninterrupted run. ``create_tbptt_trainer``'s
        engine includes this in its own ``state_dict()``, so ignite's ``Checkpoint`` saves it.
        """
        # The source in use may be a handler's (AdaptiveTruncation), installed after the trainer was built.
        record = {**self.configuration, "source": type(self.source).__name__}
        return {"configuration": record, **self.stream.state_dict(), **self.optim.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state when the engine's next run starts (after model and optimizer load)."""
        self._loaded = state

    # -- one iteration -----------------------------------------------------------------------------------------
    def __call__(self, engine: Engine, batch: Sequence[Any]) -> Any:
        """Run the segments of one batch; returns ``output_transform``'s value for the batch."""
        # Compiled graphs that outlive an optimizer step must be backpropagated again: one scope per iteration.
        with retainable(self.versions is not None):
            return self._iterate(engine, batch)

    def _iterate(self, engine: Engine, batch: Sequence[Any]) -> Any:
        if engine is not self._engine:
            self._attach_late(engine)
        self._raise_if_failed()
        x, y, starts = split_batch(self.prepare_batch(batch, device=self.device, non_blocking=self.non_blocking))
        length, rows = self._check_batch(x, y, starts)
        self.model.train()
        stream, run = self.stream, self.executor.run
        if not self.carry_hidden:
            stream.reset()
        offset = stream.position
        batch_end = offset + length
        epoch_length = engine.state.epoch_length
        last_iteration = epoch_length is not None and engine.state.iteration % epoch_length == 0
        stream_end = batch_end if not self.carry_hidden or last_iteration else None
        sequence_starts = [offset + t for t in rows]
        keep_predictions = self.output_transform is not None

        total = LossSum()
        y_preds: list[Any] = []
        while stream.position < batch_end and self._failed is None:
            if stream.window is None:
                self._start_window(engine)
            next_start = _next_start(sequence_starts, stream.position) if sequence_starts else None
            stride = self.reach_stride if self._recording else None
            plan = plan_segment(
                stream.source, stream.window, stream.position, batch_end, stream_end, self.recompute, next_start, stride
            )
            x_seg, y_seg = _steps(x, self.time_dim, plan, offset), _steps(y, self.time_dim, plan, offset)
            resets = rows.get(plan.start - offset)
            # The optimizer step divides by the target count; a window that is a step's only gradient may
            # backpropagate its mean loss instead, as a hand-written loop does.
            as_mean = plan.whole_window and self.optim.one_window_per_step
            loss, n, is_mean, y_pred = run(plan, x_seg, y_seg, resets, self._recording, keep_predictions, as_mean)
            total.add(loss, n, is_mean)
            self.optim.targets += n
            self.optim.divided = as_mean
            engine.state.targets_seen += n
            y_preds.append(y_pred)
            if plan.closes_window:
                self._complete_window(engine, plan.end, stream_continues=plan.end != stream_end)
        if last_iteration and self._failed is None:
            self.end_epoch(engine)
        self._collect_failure()
        if self._failed is not None:  # a NaN output, so that ignite's TerminateOnNan ends the run here
            return float("nan")

        loss = total.mean()
        if self.output_transform is None:
            return loss.item()
        return self.output_transform(x, y, hs.cat(y_preds, self.time_dim), loss)

    # -- window and step boundaries ----------------------------------------------------------------------------
    def _start_window(self, engine: Engine) -> None:
        if not self.model.training:  # a handler evaluated the model since the last window
            self.model.train()
        self.optim.window_started()
        self.stream.open_window()
        engine.state.window += 1
        self._recording = self._records(engine.state.window)
        fire(engine, TBPTTEvents.WINDOW_STARTED)
        fire(engine, Tbptt_Events.TIME_ITERATION_STARTED)

    def _complete_window(self, engine: Engine, end: int, stream_continues: bool) -> None:
        stream, source = self.stream, self.stream.source
        start = stream.window.start
        cut = source.cut(start, end)
        stream.following = source.window(end) if stream_continues else None
        next_cut = None if stream.following is None else stream.following.cut
        reach = self.executor.close_window(start, cut, next_cut, self._recording)
        engine.state.gradient_reach = None
        if reach is not None:  # get_scale() reads the scale from the device: only for recorded windows
            scale = self.scaler.get_scale() if self.scaler is not None else 1.0
            # What turns the backpropagated loss into the mean: 1 if the window backpropagated its mean.
            divisor = 1 if self.optim.divided else stream.window_loss.targets
            engine.state.gradient_reach = reach_profile(reach, end, divisor, scale)
        stream.window = None
        if self.optim.window_completed():
            self._optimizer_step(engine)
        engine.state.window_loss = stream.window_loss.mean()
        engine.state.window_targets = stream.window_loss.targets
        engine.state.window_bounds = (start, end, cut)
        if listened(engine, TBPTTEvents.WINDOW_COMPLETED, Tbptt_Events.TIME_ITERATION_COMPLETED):
            # What ignite's trainer leaves in state.output for chunk handlers: the window's mean loss, a float
            # (a read from the device, so only for handlers).
            engine.state.output = float(engine.state.window_loss)
        source.observe(engine)  # a source that learns from the window does so before any handler reads it
        fire(engine, TBPTTEvents.WINDOW_COMPLETED)
        fire(engine, Tbptt_Events.TIME_ITERATION_COMPLETED)

    def _optimizer_step(self, engine: Engine) -> None:
        if self.stream.history.segments:
            self.versions.freeze()
        try:
            with profiled("tbptt.optimizer_step"):
                self.optim.step(engine, on_skip=self.stream.recover)
        except FloatingPointError as error:
            # No window runs after this one; the iteration ends with a NaN output, and the error is raised
            # when anything would run next, unless a handler (TerminateOnNan) ends the run first.
            self.stream.history.clear()
            self._failed = error

    def _collect_failure(self) -> None:
        # Steps an optimizer refused on the device are read once, where the iteration's output is read anyway.
        failure = self.optim.failure()
        if failure is not None and self._failed is None:
            self.stream.history.clear()
            self._failed = failure

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    def end_epoch(self, engine: Engine) -> None:
        """End the stream and apply the windows not yet applied; runs once per epoch, whatever calls it first.

        Raises:
            FloatingPointError: if an optimizer step of the run was refused for non-finite gradients.
        """
        self._raise_if_failed()
        if self.stream.window is not None:
            self._complete_window(engine, self.stream.position, stream_continues=False)
        if self.optim.windows:
            self._optimizer_step(engine)
        self._collect_failure()
        self.stream.reset()

    # -- checks ------------------------------------------------------------------------------------------------
    def _check_batch(self, x: Any, y: Any, starts: Any) -> tuple[int, dict[int, torch.Tensor]]:
        """Check the batch before it changes anything.

        Returns:
            Its length, and the columns starting a sequence (``(B,)`` bool) at each step of the batch where any
            does.
        """
        length = check_pair(x, y, self.time_dim)
        rows = {} if starts is None else self._check_starts(x, starts)
        if self.carry_hidden:
            self.stream.check_columns(x, self.time_dim)
        return length, rows

    def _check_starts(self, x: torch.Tensor, starts: Any) -> dict[int, torch.Tensor]:
        # The one read from the device that starts cost; a batch without them runs as before.
        rows = start_rows(starts, x, self.time_dim)
        if rows and self.executor.model_call.reset_hidden is default_reset_hidden:
            columns = next(iter(rows.values())).shape[0]
            if self.carry_hidden and self.stream.hidden is not None:
                check_resettable(self.stream.hidden, columns)
            else:  # known after the stream's first model call
                self.executor.check_columns = columns
        return rows


def tbptt_step_of(engine: Engine, handler: str) -> TBPTTStep:
    """The TBPTT process function ``engine`` runs, for ``handler`` to attach to.

    Raises:
        TypeError: if ``engine`` does not run one.
    """
    step = getattr(engine, "tbptt", None) or getattr(engine, "_process_function", None)
    if not isinstance(step, TBPTTStep):
        raise TypeError(f"{handler} attaches to a TBPTT trainer: create_tbptt_trainer(...) or Engine(step).")
    return step


def _steps(t: torch.Tensor, time_dim: int, plan: SegmentPlan, offset: int) -> torch.Tensor:
    # The plan's steps of a batch that starts at step `offset` of the stream (basic slicing is the cheaper view).
    start, end = plan.start - offset, plan.end - offset
    return t[start:end] if time_dim == 0 else t.narrow(1, start, end - start)


def _next_start(starts: list[int], step: int) -> int | None:
    # The first step after `step` where some column starts a sequence, if any.
    following = bisect_right(starts, step)
    return starts[following] if following < len(starts) else None


def _zero_counters(engine: Engine) -> None:
    # A fresh run counts windows, optimizer steps and targets from 0.
    for name in (*COUNTERS, "targets_seen"):
        setattr(engine.state, name, 0)
