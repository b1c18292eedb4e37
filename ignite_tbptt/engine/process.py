"""The process function of a TBPTT(k1, k2) trainer: the ignite adapter around the stream loop."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import ignite.distributed as idist
import torch
from ignite.contrib.engines.tbptt import Tbptt_Events
from ignite.engine import Engine, Events

from ..data.batch import split_batch
from ..data.masks import count_targets
from ..layout import Layout
from ..planning import WindowSource
from ..runtime import (
    Execution,
    ModelCall,
    ProgramCounts,
    RetainedHistory,
    StepHandler,
    StepHandlers,
    is_sharded,
    join_along,
    reduce_gradients_by_sum,
    retainable,
)
from . import distributed
from .burn_in import BurnIn
from .checkpoint import check_resume, configuration, source_type
from .events import COUNTERS, EventFiring, TBPTTEvents, register_tbptt_events
from .optimizer_step import OptimizerStep, RunPosition
from .state import tbptt_state
from .stream_loop import BatchResult, CompletedWindow, StreamLoop

__all__ = ["TBPTTProcessFunction"]

_SOURCE_CHANGE = "the window source can only change before a run or between epochs; a stream is at step {}."


class TBPTTProcessFunction:
    """Process function of a TBPTT(k1, k2) trainer; build it with :func:`~ignite_tbptt.tbptt_training_step`.

    The ignite adapter: it registers :class:`~ignite_tbptt.TBPTTEvents` and the counters on the engine, starts and
    ends streams with the run and its epochs, fires the events at window and optimizer-step boundaries, and saves
    the stream in :meth:`state_dict`. The work is the :attr:`loop`'s, a
    :class:`~ignite_tbptt.engine.stream_loop.StreamLoop`: it plans each segment, has the runtime execute it, closes
    windows and takes optimizer steps, and reports each boundary back here. It attaches itself to the engine that
    runs it, on the first iteration at the latest, so ``Engine(tbptt_training_step(...))`` works as ignite's
    ``Engine(supervised_training_step(...))``.

    Handlers reach it through :meth:`of` and use its public methods: :meth:`record_reach`, :meth:`use_source`,
    :attr:`window_source`, :meth:`parameters`, :attr:`optimizer`, :attr:`scaler`, :meth:`hparams`.

    Host reads: none per window unless asked for. The iteration's output (``loss.item()`` by default) is one read
    per iteration, as in ignite. ``engine.state.output`` is set to the window's mean loss as a float, one read,
    only while a handler listens to ``TBPTTEvents.WINDOW_COMPLETED`` or ``Tbptt_Events.TIME_ITERATION_COMPLETED``.
    Without a scaler, the finiteness check of an optimizer step on an accelerator reads nothing with an optimizer
    that skips on the device (fused ``SGD``, ``Adam``, ``AdamW``), whose decisions are read once at the iteration's
    end, and one value per step with any other; on the CPU, where a read waits for nothing, one value per step.
    With a ``GradScaler``, whether it skipped a step is one read per step (besides what ``GradScaler.step`` reads
    with an unfused optimizer). A batch with ``starts`` costs one read to find them. Without ``target_count_fn``, the
    first batch the trainer runs costs one read to look for padding in its targets (a warning if there is some).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        source: WindowSource,
        *,
        model_call: ModelCall,
        optimizer_step: OptimizerStep,
        layout: Layout,
        carry_hidden: bool,
        device: str | torch.device | None,
        non_blocking: bool,
        prepare_batch: Callable,
        output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] | None,
        target_count_fn: Callable[[Any, Any], int | torch.Tensor] | None,
        recompute: int | None = None,
        execution: Execution,
        burn_in: BurnIn | None = None,
    ) -> None:
        self.loop = StreamLoop(
            model,
            model_call,
            loss_fn,
            source,
            optimizer_step,
            layout=layout,
            carry_hidden=carry_hidden,
            target_count_fn=target_count_fn,
            recompute=recompute,
            execution=execution,
            burn_in=burn_in,
        )
        self.optimizer_step = optimizer_step
        self.layout, self.carry_hidden, self.recompute = layout, carry_hidden, recompute
        self.device, self.non_blocking, self.prepare_batch = device, non_blocking, prepare_batch
        self.output_transform = output_transform
        # Targets with padding but no count of them: looked for in the first batch the trainer runs, and in a batch
        # whose loss is NaN, until found.
        self._padding_unchecked = target_count_fn is None
        self._first_batch = True
        self._engine: Engine | None = None
        self._listener: _EngineListener | None = None  # the loop's listener, once attached to an engine
        self._loaded: dict | None = None
        # The loaded checkpoint's configuration, and where its windows are still to be compared with this trainer's
        # (the epoch's end or not), until the run starts: None if they were compared when it loaded.
        self._resumed: tuple[dict, bool | None] | None = None

    # -- the seam for handlers ---------------------------------------------------------------------------------
    @classmethod
    def of(cls, engine: Engine, handler: str = "this handler") -> TBPTTProcessFunction:
        """The TBPTT process function ``engine`` runs: how a handler reaches the trainer it attaches to.

        Args:
            engine: an engine of :func:`~ignite_tbptt.create_tbptt_trainer`, or ``Engine(tbptt_training_step(...))``.
            handler: the handler's name, for the error.

        Raises:
            TypeError: if ``engine`` does not run one.
        """
        step = getattr(engine, "tbptt", None) or getattr(engine, "_process_function", None)
        if not isinstance(step, cls):
            raise TypeError(f"{handler} attaches to a TBPTT trainer: create_tbptt_trainer(...) or Engine(step).")
        return step

    @property
    def window_source(self) -> WindowSource:
        """The window source in use (a :class:`~ignite_tbptt.Schedule` for fixed k1, k2, or a handler's)."""
        return self.loop.source

    @property
    def history(self) -> RetainedHistory:
        """The stream's retained segments (``history.versions``: the weights they need across optimizer steps)."""
        return self.loop.history

    @property
    def optimizer(self) -> Any:
        """The torch optimizer."""
        return self.optimizer_step.optimizer

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The ``GradScaler``, or ``None``."""
        return self.optimizer_step.scaler

    @property
    def programs(self) -> ProgramCounts | None:
        """How the windows and steps ran as programs (``cuda_graphs``), or ``None`` where they run eagerly."""
        return getattr(self.loop.executor, "counts", None)

    def parameters(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates, in its order."""
        return self.optimizer_step.parameters()

    def hparams(self) -> dict[str, Any]:
        """The trainer's hyper-parameters, for logging."""
        return {
            **self.window_source.hparams(),
            "carry_hidden": self.carry_hidden,
            "gradient_accumulation_steps": self.optimizer_step.accumulation,
            "scaler": self.scaler is not None,
            "recompute": self.recompute or 0,
            **self.loop.burn_in.hparams(),
        }

    def use_source(self, source: WindowSource) -> None:
        """Take the windows of the streams from ``source``, before a stream starts (before a run or between epochs).

        Handlers that plan windows (:class:`~ignite_tbptt.AdaptiveTruncation`) install their source here. A
        source whose windows reach into earlier ones gets the weight versions it needs.

        Raises:
            RuntimeError: if a stream is under way: its windows so far kept no more history than the old
                source's cuts needed.
        """
        if self.loop.stream.position > 0:
            raise RuntimeError(_SOURCE_CHANGE.format(self.loop.stream.position))
        self.loop.use_source(source)
        if self._engine is not None:
            source.connect(self._engine, self)

    def record_reach(self, every: int, stride: int | None = None) -> None:
        """Record the gradient reach of every ``every``-th window too; a ``stride`` splits recorded windows.

        The windows any handler asks for are recorded (GradientReach, AdaptiveTruncation).
        """
        self.loop.planner.reach.ask(every, stride)

    # -- ignite lifecycle --------------------------------------------------------------------------------------
    def attach(self, engine: Engine) -> None:
        """Register the events, counters and the handlers that start and end streams and epochs on ``engine``."""
        register_tbptt_events(engine)
        state = tbptt_state(engine)
        # None until the first window: TBPTTState types them as a window's handlers read them.
        state.window_loss = state.window_bounds = state.gradient_reach = None
        state.window_targets = state.targets_seen = state.step_targets = 0
        state.programs = self.programs  # counted as the run goes (cuda_graphs), else None
        if "targets_seen" not in engine.state_dict_user_keys:
            engine.state_dict_user_keys.append("targets_seen")
        engine.add_event_handler(Events.STARTED, self._started)
        engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.end_epoch)
        self._engine = engine
        self._listener = self.loop.listener = _EngineListener(engine, self)
        self.window_source.connect(engine, self)

    def _attach_late(self, engine: Engine) -> None:
        # Engine(step) without create_tbptt_trainer: STARTED and the first EPOCH_STARTED have already fired.
        self.attach(engine)
        _zero_counters(engine)
        self._started(engine)

    def start_run(self) -> None:
        """A run starts: in a distributed one, every process takes rank 0's parameters and sums at each step.

        Whether the run is distributed is asked of ``ignite.distributed``, which finds a process group made by
        ``torch.distributed`` (Lightning's strategies make one) as well as its own.
        """
        self.optimizer_step.distributed = distributed.is_distributed()
        self.loop.start_run(self.optimizer_step.distributed and any(is_sharded(p) for p in self.parameters()))
        if self.optimizer_step.distributed:
            reduce_gradients_by_sum(self.loop.model, idist.backend())  # FSDP2's: sums, for the division by all targets
            distributed.broadcast_parameters(self.parameters())

    def _started(self, engine: Engine) -> None:
        loop, listener = self.loop, self._listener
        assert listener is not None, "attach() set it, and registered this handler"
        listener.events.refresh()  # handler lists that removals replaced since the last run
        self.start_run()
        if engine.state.iteration == 0:
            _zero_counters(engine)
        loaded, self._loaded = self._loaded, None
        resumed, self._resumed = self._resumed, None
        if loaded is None or engine.state.iteration == 0:
            loop.reset()
            return
        saved, epoch_end = resumed if resumed is not None else ({}, None)
        if epoch_end is not None:  # the handlers are attached by now: the windows in use are compared
            check_resume(saved, self.configuration(), loaded, epoch_end, ("windows",))
        # Another source's state (a change allowed between streams) is not this source's to load.
        same_source = not saved or source_type(saved) == type(self.window_source).__name__
        try:
            # A window left open goes on being recorded if it was (GradientReach, AdaptiveTruncation).
            loop.load_state_dict(loaded, tbptt_state(engine).window, same_source)
            self.optimizer_step.load_state_dict(loaded)
        except BaseException:  # neither half of a checkpoint: the stream starts afresh
            loop.reset()
            raise

    def _epoch_started(self, engine: Engine) -> None:
        # A run resumed mid-epoch fires EPOCH_STARTED again; the restored stream goes on.
        if engine.state.epoch_length is None or engine.state.iteration % engine.state.epoch_length == 0:
            self.loop.reset_stream()

    def end_epoch(self, engine: Engine) -> None:
        """End the stream and apply the windows not yet applied; runs once per epoch, whatever calls it first.

        Raises:
            FloatingPointError: if an optimizer step of the run was refused for non-finite gradients.
            ProcessesDisagree: in a distributed run, if another process is not at its epoch's end too.
        """
        self._raise_if_failed()
        ended = self.loop.stream.position > 0  # the first call of the epoch: the second finds the stream reset
        self.loop.end_stream()
        if ended and self.optimizer_step.distributed:  # a process with fewer batches is found here at the latest
            # A stream under way ran batches: the step attached itself to its engine first.
            assert self._listener is not None, "attached before a stream runs"
            position = self._listener.position()
            step = tbptt_state(engine).optimizer_step
            self.optimizer_step.synchronise((distributed.EPOCH_END, *position[:-1], step), 0)

    def configuration(self) -> dict[str, Any]:
        """What checkpoints record, to refuse a resume into another configuration (``engine.checkpoint``).

        The windows are the source's in use, which may be a handler's (AdaptiveTruncation) installed after the trainer
        was built.
        """
        return configuration(self.window_source, self.carry_hidden, self.recompute, self.optimizer_step.accumulation)

    def _raise_if_failed(self) -> None:
        if self.loop.failed is not None:
            raise self.loop.failed

    def state_dict(self) -> dict[str, Any]:
        """The stream's state (position, hidden state, open window, retained history) and accumulated gradients.

        The retained graphs are saved as what rebuilds them (each segment's input, input hidden state,
        random state, and the weights it ran with); :meth:`load_state_dict` rebuilds them when the next run
        starts, so that resuming gives the parameters of an uninterrupted run. ``create_tbptt_trainer``'s
        engine includes this in its own ``state_dict()``, so ignite's ``Checkpoint`` saves it.
        """
        return {"configuration": self.configuration(), **self.loop.state_dict(), **self.optimizer_step.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state when the engine's next run starts (after model and optimizer load)."""
        self._loaded = state

    def resumes_from(self, saved: dict[str, Any], epoch_end: bool | None) -> None:
        """The configuration of the checkpoint being loaded (:mod:`~ignite_tbptt.engine.checkpoint`).

        Args:
            saved: its configuration.
            epoch_end: if not ``None``, its windows are compared with this trainer's when the run starts (their
                source types differ when it loads: a handler may still be attached), taken at an epoch's end or not.
        """
        self._resumed = (saved, epoch_end)

    # -- one iteration -----------------------------------------------------------------------------------------
    def __call__(self, engine: Engine, batch: Sequence[Any]) -> Any:
        """Run the segments of one batch; returns ``output_transform``'s value for the batch."""
        # Compiled graphs that outlive an optimizer step must be backpropagated again: one scope per iteration.
        with retainable(self.history.versions is not None):
            return self._iterate(engine, batch)

    def _iterate(self, engine: Engine, batch: Sequence[Any]) -> Any:
        if engine is not self._engine:
            self._attach_late(engine)
        self._raise_if_failed()
        loop = self.loop
        epoch_length = engine.state.epoch_length
        epoch_ends = epoch_length is not None and engine.state.iteration % epoch_length == 0
        x, y, result = self.train_batch(batch, epoch_ends)
        if epoch_ends and loop.failed is None:
            self.end_epoch(engine)
        loop.collect_failure()
        if loop.failed is not None:  # a NaN output, so that ignite's TerminateOnNan ends the run here
            return float("nan")
        loss = result.loss.mean()
        if self.output_transform is None:
            value = loss.item()
            if self._padding_unchecked and value != value:  # NaN: read anyway, so the check costs nothing here
                self._check_padding(y)
            return value
        return self.output_transform(x, y, join_along(result.predictions, self.layout.time_dim), loss)

    def train_batch(self, batch: Sequence[Any], epoch_ends: bool) -> tuple[Any, Any, BatchResult]:
        """Run one batch's segments, windows and optimizer steps, without ending the epoch.

        Ignite's iteration and :class:`~ignite_tbptt.lightning.TBPTTModule`'s ``training_step`` both run it.
        ``epoch_ends``: the batch is its epoch's last, where the stream ends (every batch ends one without
        ``carry_hidden``). Returns the batch's ``x`` and ``y`` as prepared, and what the loop gave.

        Raises:
            TypeError, ValueError: a batch that does not fit, before anything changes.
        """
        loop = self.loop
        x, y, starts = split_batch(self.prepare_batch(batch, device=self.device, non_blocking=self.non_blocking))
        length, resets = loop.check_batch(x, y, starts)
        if self._first_batch:
            self._first_batch = False
            if self._padding_unchecked:
                self._check_padding(y)
        ends_stream = epoch_ends or not loop.carry_hidden  # without carry_hidden, every batch is a stream
        keep = self.output_transform is not None
        return x, y, loop.run_batch(x, y, length, resets, ends_stream, keep_predictions=keep)

    def _check_padding(self, y: Any) -> None:
        if not isinstance(y, torch.Tensor):
            return
        padding = int(y.numel() - count_targets(y))  # one read
        if padding:
            self._padding_unchecked = False
            warnings.warn(
                f"the targets hold padding ({padding} of {y.numel()} elements of a batch are -100 or NaN), but "
                "target_count_fn is None: every element counts as a target, in each window's mean loss and in the "
                "division of the gradients, and a segment of padding only makes loss_fn's mean NaN (window_loss = "
                "nan in engine.state and the logs; its gradient adds nothing). Pass target_count_fn=count_targets: a "
                "window without targets then contributes nothing and reports a loss of 0 for 0 targets.",
                stacklevel=2,
            )


# The events a window fires, in the order of their indices in _EngineListener's EventFiring.
_WINDOW_EVENTS = (
    TBPTTEvents.WINDOW_STARTED,
    Tbptt_Events.TIME_ITERATION_STARTED,
    TBPTTEvents.OPTIMIZER_STEP_STARTED,
    TBPTTEvents.OPTIMIZER_STEP_COMPLETED,
    TBPTTEvents.WINDOW_COMPLETED,
    Tbptt_Events.TIME_ITERATION_COMPLETED,
)
_STARTED, _TIME_STARTED, _STEP_STARTED, _STEP_COMPLETED, _COMPLETED, _TIME_COMPLETED = range(len(_WINDOW_EVENTS))


class _EngineListener:
    """Turns what the stream loop reports into ``engine.state`` and ignite's events (the loop's ``LoopListener``)."""

    __slots__ = ("engine", "step", "events", "_step_handlers")

    def __init__(self, engine: Engine, step: TBPTTProcessFunction) -> None:
        self.engine, self.step = engine, step
        self.events = EventFiring(engine, _WINDOW_EVENTS)
        self._step_handlers: tuple[list, StepHandlers] | None = None  # the handler entries they were made from

    def window_started(self) -> int:
        state = tbptt_state(self.engine)
        state.window += 1
        events = self.events
        if events.handlers[_STARTED]:
            events.fire(_STARTED)
        if events.handlers[_TIME_STARTED]:
            events.fire(_TIME_STARTED)
        return state.window

    def window_closed(self, reach: dict[int, float] | None) -> None:
        tbptt_state(self.engine).gradient_reach = reach  # before the step, for its handlers too

    def targets_processed(self, targets: int) -> None:
        tbptt_state(self.engine).targets_seen += targets

    def position(self) -> RunPosition:
        state = tbptt_state(self.engine)
        length = state.epoch_length if state.epoch_length is not None else -1
        return RunPosition(length, state.epoch, state.iteration, state.window, state.optimizer_step + 1)

    def step_handlers(self) -> StepHandlers:
        entries = self.events.handlers[_STEP_STARTED]
        if self._step_handlers is None or self._step_handlers[0] != entries:
            self._step_handlers = (list(entries), _step_handlers(self.engine, entries))
        return self._step_handlers[1]

    def step_started(self, targets: int, in_program: bool = False) -> None:
        state = tbptt_state(self.engine)
        state.step_targets = targets
        state.optimizer_step += 1
        if self.events.handlers[_STEP_STARTED] and not in_program:
            self.events.fire(_STEP_STARTED)

    def step_completed(self) -> None:
        if self.events.handlers[_STEP_COMPLETED]:
            self.events.fire(_STEP_COMPLETED)

    def window_completed(self, window: CompletedWindow) -> None:
        engine, events = self.engine, self.events
        state = tbptt_state(engine)
        # A 0-dim tensor on the device, as documented (TBPTTState.window_loss is annotated as a float).
        state.window_loss = window.loss.mean()
        state.window_targets = window.loss.targets
        state.window_bounds = (window.start, window.end, window.cut)
        completed, time_completed = events.handlers[_COMPLETED], events.handlers[_TIME_COMPLETED]
        if completed or time_completed:
            # What ignite's trainer leaves in state.output for chunk handlers: the window's mean loss, a float
            # (a read from the device, so only for handlers).
            state.output = float(state.window_loss)  # type: ignore[assignment]  # ignite annotates it int | None
        # A source that learns from the window does so before handlers read.
        self.step.loop.planner.source.observe(engine)
        if completed:
            events.fire(_COMPLETED)
        if time_completed:
            events.fire(_TIME_COMPLETED)


def _step_handlers(engine: Engine, entries: list) -> StepHandlers:
    # The last handlers of OPTIMIZER_STEP_STARTED that have a device part and a host part, attached without a filter
    # or arguments of their own (ignite keeps such a handler as itself, given the engine): they may run inside a step
    # program, in their order, where no other handler comes before them.
    inside: list[StepHandler] = []
    for func, args, kwargs in reversed(entries):
        if kwargs or len(args) != 1 or not isinstance(args[0], weakref.ref) or not _in_step(func):
            break
        inside.append(StepHandler(partial(func.device_part, engine), partial(func.host_part, engine), id(func)))
    inside.reverse()
    return StepHandlers(tuple(inside), len(inside) < len(entries))


def _in_step(func: Any) -> bool:
    return callable(getattr(func, "device_part", None)) and callable(getattr(func, "host_part", None))


def _zero_counters(engine: Engine) -> None:
    # A fresh run counts windows, optimizer steps and targets from 0.
    for name in (*COUNTERS, "targets_seen"):
        setattr(engine.state, name, 0)
