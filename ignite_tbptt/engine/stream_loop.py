"""The loop along a stream: each batch's segments, the windows they close and the optimizer steps that follow.

A :class:`StreamLoop` walks each batch with the :class:`~ignite_tbptt.planning.walk.StreamWalk` that every walk of a
schedule runs (its :class:`~ignite_tbptt.planning.StreamPlanner` plans every segment and every window's close), has
the :class:`~ignite_tbptt.runtime.SegmentExecutor` carry out both plans, and takes the optimizer step of every
accumulation that completes. It fires no event and touches no ``engine.state``: what happens at a window's or
a step's boundary is reported to a :class:`LoopListener` (the process function's, in
:mod:`ignite_tbptt.engine.process`), which fires ignite's events and keeps ``engine.state``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

import torch

from ..data.batch import check_pair, resets_by_step
from ..layout import Layout
from ..planning import (
    BatchPlan,
    SegmentPlan,
    StreamPlanner,
    WindowSource,
    check_source,
    plan_batch,
    plan_step,
    plan_window,
)
from ..planning.walk import StreamWalk
from ..runtime import (
    Execution,
    LossRule,
    LossSum,
    ModelCall,
    ProgramExecutor,
    Resets,
    RetainedHistory,
    SegmentResult,
    StepHandlers,
    StreamState,
    build_executor,
    check_resettable,
    profiled,
    profiling,
    reach_profile,
)
from . import distributed
from .burn_in import BurnIn
from .optimizer_step import OptimizerStep, RunPosition

__all__ = ["StreamLoop", "LoopListener", "CompletedWindow", "BatchResult"]


class CompletedWindow(NamedTuple):
    """A window whose backward pass (and optimizer step, if one was due) is done."""

    #: First step of the window.
    start: int
    #: End (exclusive) of the window.
    end: int
    #: Its cut: the first step its backward pass reached.
    cut: int
    #: Its loss over its segments, with their target count.
    loss: LossSum


class LoopListener(Protocol):
    """What the loop reports for each window, in order: started, targets, closed, step started, step done, completed."""

    def window_started(self) -> int:
        """A window opens; returns its number in the run (from 1)."""

    def window_closed(self, reach: dict[int, float] | None) -> None:
        """A window's backward pass is done, with its gradient reach if recorded; its optimizer step comes next."""

    def targets_processed(self, targets: int) -> None:
        """A segment's ``targets`` entered the loss."""

    def position(self) -> RunPosition:
        """Where the run is, with the optimizer step about to be taken."""

    def step_handlers(self) -> StepHandlers:
        """The handlers of the step's start, as a step program sees them: those that may run inside it."""

    def step_started(self, targets: int, in_program: bool = False) -> None:
        """The gradients of an optimizer step over ``targets`` targets are final; the step comes next.

        ``in_program``: the step runs as a step program, and every handler of the step's start inside it, not here.
        """

    def step_completed(self) -> None:
        """The optimizer stepped (or the scaler skipped the step)."""

    def window_completed(self, window: CompletedWindow) -> None:
        """A window's backward pass and its optimizer step, if one was due, are done."""


class BatchResult(NamedTuple):
    """What one batch gave."""

    #: The loss of the segments the batch ran, with their target count.
    loss: LossSum
    #: Their detached predictions, in order, if asked for.
    predictions: list[Any]


class StreamLoop:
    """Runs the batches of a stream: their segments, windows and optimizer steps.

    Args:
        model: the model, put in training mode for every batch and window.
        model_call: runs the model on a segment.
        loss_fn: ``loss_fn(y_pred, y)``, reducing by mean over its targets.
        source: the window source.
        optimizer_step: the accumulation and the optimizer step.
        layout: the time and batch axes of the batches.
        carry_hidden: whether the batches of an epoch are pieces of one stream.
        target_count_fn: ``target_count_fn(y_pred, y) -> int``, or ``None`` for ``y.numel()``.
        recompute: the most steps a rebuilt segment may have in recomputation mode, or ``None``.
        execution: how windows run: eagerly, or as window programs (:mod:`ignite_tbptt.runtime.programs.window`).

    Raises:
        ValueError: as :meth:`use_source`.
    """

    #: What the loop reports each boundary to: the process function's, set as it attaches to its engine, before
    #: any batch runs.
    listener: LoopListener

    def __init__(
        self,
        model: torch.nn.Module,
        model_call: ModelCall,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        source: WindowSource,
        optimizer_step: OptimizerStep,
        *,
        layout: Layout,
        carry_hidden: bool,
        target_count_fn: Callable[[Any, Any], int | torch.Tensor] | None,
        recompute: int | None,
        execution: Execution,
        burn_in: BurnIn | None = None,
    ) -> None:
        self.model, self.optimizer_step = model, optimizer_step
        self.burn_in = burn_in or BurnIn(0, True)  #: the burn-in after each fresh start (of 0 steps: none)
        self.layout, self.carry_hidden = layout, carry_hidden
        self.planner = StreamPlanner(source, recompute)
        history = RetainedHistory(model_call, optimizer_step.parameters, None, recompute is not None)
        self.stream = StreamState(history)
        # Every plan is asked of the walk all walks of a schedule share; closes are planned from the runtime's history.
        self.walk = StreamWalk(self.planner, optimizer_step.one_window_per_step, history.starts)
        loss = LossRule(loss_fn, model_call, optimizer_step.scaler)
        self.executor = build_executor(
            execution, model_call, loss, self.stream, target_count_fn, optimizer_step.step_programs
        )
        #: Where windows may run as programs, the executor that runs them; ``None`` where every window runs eagerly.
        self.window_programs = self.executor if isinstance(self.executor, ProgramExecutor) else None
        #: The model has parameters sharded by FSDP2 and runs in a distributed group (:meth:`start_run`).
        self.sharded = False
        self.use_source(source)
        self.failed: FloatingPointError | None = None  # a step refused for non-finite gradients, not yet raised
        self.attributes_checked = False  # the model's attributes were checked for graphs after a first window

    def start_run(self, sharded: bool) -> None:
        """A run starts; ``sharded``: the model has parameters sharded by FSDP2 and runs in a distributed group.

        Every process of a sharded model then makes the same model calls and backward calls, a segment without
        targets included. A refused step of an interrupted run, and the device's decisions on its steps, are not
        this run's.

        Raises:
            ValueError: for a sharded model, if the window source learns from the run (each process would choose its
                own windows), or windows run as programs (FSDP2's collectives are not captured).
        """
        check_source(self.source, self.window_programs is not None, sharded)
        self.sharded = self.executor.backward_without_targets = sharded
        self.failed = None
        self.optimizer_step.forget_failure()

    @property
    def history(self) -> RetainedHistory:
        """The stream's retained segments."""
        return self.stream.history

    @property
    def source(self) -> WindowSource:
        """The window source in use."""
        return self.planner.source

    def use_source(self, source: WindowSource) -> None:
        """Take the windows from ``source`` from the stream's start; one that reaches back gets weight versions.

        Raises:
            ValueError: if windows run as window programs (``cuda_graphs``) and ``source``'s windows are not
                :attr:`~ignite_tbptt.planning.WindowSource.allows_programs` (k2 < k1, windows of varying length with
                k2 != k1, ARTBP).
        """
        check_source(source, self.window_programs is not None, self.sharded)
        if source.spans_windows:  # only windows reaching into earlier ones keep graphs across an optimizer step
            self.history.keep_weight_versions()
        self.planner.source = source

    def reset(self) -> None:
        """Forget the stream, the accumulated windows and a refused step: a run starts afresh."""
        self.reset_stream()
        self.optimizer_step.reset()
        self.failed = None

    def reset_stream(self) -> None:
        """Forget the stream (position, hidden state, history, open window); a new one starts at step 0."""
        self.stream.reset()
        self.planner.reset()
        self.burn_in.reset()

    def state_dict(self) -> dict:
        """The stream and its windows (:meth:`StreamState.state_dict`, :meth:`StreamPlanner.state_dict`)."""
        return {**self.stream.state_dict(), **self.planner.state_dict(), **self.burn_in.state_dict()}

    def load_state_dict(self, state: dict, window: int, same_source: bool = True) -> None:
        """Restore :meth:`state_dict`'s stream; ``window`` is the run's window count, for the open window's reach.

        ``same_source``: the checkpoint's windows came from a source of this one's type, whose state it loads.
        """
        self.planner.load_state_dict(state if same_source else {**state, "source": {}}, window)
        self.stream.load_state_dict(state)
        self.burn_in.load_state_dict(state)

    # -- one batch ---------------------------------------------------------------------------------------------
    def check_batch(self, x: Any, y: Any, starts: Any) -> tuple[int, Resets]:
        """Check the batch before it changes anything.

        Returns:
            Its length, and the columns starting a sequence (``(B,)`` bool) at each step of the batch where any
            does (for a model sharded by FSDP2, at each step where any column of any process does; ``None`` where
            none of this process's does).

        Raises:
            TypeError, ValueError: as :func:`~ignite_tbptt.create_tbptt_trainer` lists for batches.
            ProcessesDisagree: for a model sharded by FSDP2, if the processes' batches differ in length.
        """
        length = check_pair(x, y, self.layout)
        resets: Resets = {} if starts is None else self._check_starts(x, starts)
        # Every process of a sharded model makes the same calls: the same batch length, and segments split where
        # any process resets.
        if self.sharded and distributed.check_same_batch(length, starts is not None, x.device):
            resets = {t: resets.get(t) for t in distributed.all_start_steps(list(resets), length, x.device)}
        if self.carry_hidden and x.dim() > 1:
            self.stream.check_columns(self.layout.columns(x))
        return length, resets

    def _check_starts(self, x: torch.Tensor, starts: Any) -> dict[int, torch.Tensor]:
        # The one read from the device that starts cost; a batch without them runs as before.
        resets = resets_by_step(starts, x, self.layout)
        if resets and self.executor.model_call.default_reset:
            columns = next(iter(resets.values())).shape[0]
            if self.carry_hidden and self.stream.hidden is not None:
                check_resettable(self.stream.hidden, columns)
            else:  # known after the stream's first model call
                self.executor.expect_columns(columns)
        return resets

    def run_batch(
        self, x: Any, y: Any, length: int, resets: Resets, ends_stream: bool, keep_predictions: bool
    ) -> BatchResult:
        """Run a checked batch of ``length`` steps; ``ends_stream`` if the batch ends its stream.

        A batch ends its stream if it is the epoch's last (with the epoch's length known) or if every batch is a
        stream of its own (``carry_hidden=False``). The stream's windows that close inside the batch are
        backpropagated, and their optimizer steps taken; no window runs after a refused step (:attr:`failed`).
        """
        self.model.train()
        if not self.carry_hidden:
            self.reset_stream()
        y, resets = self.burn_in.apply(y, length, resets, self.layout)
        batch = plan_batch(self.stream.position, length, ends_stream, resets)
        result = BatchResult(LossSum(), [])
        for plan, segment, swept in self._segments(batch, x, y, resets, keep_predictions):
            result.loss.add(segment.loss, segment.targets, plan.whole_window)
            result.predictions.append(segment.predictions)
            self.segment_done(batch, plan, segment, swept)
        return result

    def _segments(
        self, batch: BatchPlan, x: Any, y: Any, resets: Resets, keep: bool
    ) -> Iterator[tuple[SegmentPlan, SegmentResult, bool]]:
        # Each segment of the batch as it runs, with its plan and whether a program swept its window: a window whole
        # as one program where planning says so, else segment by segment.
        stream, planner, run, span = self.stream, self.planner, self.executor.run, self.layout.steps
        offset, walk = batch.start, self.walk
        # Read where it is used, as the optimizer step has it now (a distributed run's is known once the run starts).
        walk.one_window_per_step = self.optimizer_step.one_window_per_step
        while stream.position < batch.end and self.failed is None:
            if planner.window is None:
                self.open_window()
                if self.window_programs is not None:
                    swept = self._run_program(batch, x, y, resets, keep)
                    if swept is not None:
                        yield from swept
                        continue
            for plan in walk.segments(batch, stream.position):
                start, end = plan.start - offset, plan.end - offset
                stops, graph_free = self.burn_in.segment(start, end)
                result = run(plan, span(x, start, end), span(y, start, end), resets.get(start), keep, stops, graph_free)
                yield plan, result, False

    def _run_program(
        self, batch: BatchPlan, x: Any, y: Any, resets: Resets, keep: bool
    ) -> list[tuple[SegmentPlan, SegmentResult, bool]] | None:
        # The window just opened, as one program where planning says so; None where it runs eagerly, counted.
        executor = self.window_programs
        assert executor is not None, "asked only where windows may run as programs"
        position, one_window_per_step = self.stream.position, self.walk.one_window_per_step
        plans, eager = plan_window(self.planner, batch, position, one_window_per_step, executor.facts())
        if eager is not None:
            executor.counts.ran_eagerly(eager)
            return None
        results = executor.run_window(plans, x, y, resets, batch.start, keep)
        return [(plan, result, True) for plan, result in zip(plans, results)]

    def segment_done(self, batch: BatchPlan, plan: SegmentPlan, result: SegmentResult, swept: bool = False) -> None:
        """A segment ran (eagerly, or in a program): its targets counted, its window closed if it ends.

        ``swept`` as :meth:`close_window` takes it.
        """
        self.optimizer_step.accumulate(result.targets, plan.backward_mean)
        self.listener.targets_processed(result.targets)
        if plan.closes_window:
            self.close_window(plan.end, batch.stream_continues(plan.end), swept)

    # -- window and step boundaries ----------------------------------------------------------------------------
    def open_window(self) -> None:
        """A window opens at the stream's position: the model in training mode, the step's first clears ``.grad``."""
        if not self.model.training:  # a handler evaluated the model since the last window
            self.model.train()
        self.optimizer_step.window_started()
        self.stream.open_window()
        self.walk.open(self.stream.position, self.listener.window_started())

    def close_window(self, end: int, stream_continues: bool, swept: bool = False) -> None:
        """Backpropagate the open window, which ends at ``end``, and take the optimizer step if it is due.

        ``swept``: a window program ran the window and its backward pass; the retained segments before it are dropped
        (no window reaches into a program's, nor a program's window back: k2 = k1).
        """
        stream, executor, listener = self.stream, self.executor, self.listener
        plan = self.walk.close(end, stream_continues)
        if swept:
            assert self.window_programs is not None, "only a program executor sweeps a window at once"
            self.window_programs.close_swept(plan)
            reach = None
        else:
            reach = executor.close_window(plan)
        self.walk.closed(plan)  # after the sweep: a checkpoint taken where it failed keeps the window open
        if not self.attributes_checked:  # once: a graph the trainer cannot see would otherwise grow unnoticed
            self.attributes_checked = True
            self.executor.check_attributes(self.model)
        profile = None
        if reach is not None:  # only recorded windows: a host read
            optimizer_step = self.optimizer_step
            targets = stream.window_loss.targets
            profile = reach_profile(reach, end, targets, optimizer_step.backward_mean, optimizer_step.scaler)
        listener.window_closed(profile)
        if self.optimizer_step.window_completed():
            self.take_step()
        listener.window_completed(CompletedWindow(plan.start, end, plan.cut, stream.window_loss))

    def take_step(self) -> None:
        """Take the optimizer step over the accumulated windows; a refused one is kept in :attr:`failed`.

        Raises:
            ProcessesDisagree: in a distributed run whose processes are at different steps.
        """
        history = self.stream.history
        if history.segments:  # segments outlive the step only where windows reach back: with weight versions
            assert history.versions is not None, "retained segments across a step keep weight versions"
            history.versions.freeze()
        try:
            if profiling():
                with profiled("tbptt.optimizer_step"):
                    self._step()
            else:
                self._step()
        except FloatingPointError as error:
            # No window runs after this one; the iteration ends with a NaN output, and the error is raised
            # when anything would run next, unless a handler (TerminateOnNan) ends the run first.
            history.clear()
            self.failed = error

    def _step(self) -> None:
        step, listener = self.optimizer_step, self.listener
        # Retained segments need nothing of the step: their weights were copied before it (take_step). Where steps
        # may run as programs, planning says whether this one does; its handlers then all run inside it.
        handlers = None
        if step.step_programs is not None:
            handlers = listener.step_handlers()
            refused = plan_step(step.facts(handlers.host_first))
            if refused is not None:
                step.step_programs.counts.ran_eagerly(refused, "step")
                handlers = None
        targets = step.prepare(listener.position(), None if handlers is None else handlers.on_device)
        if not targets:
            return
        listener.step_started(targets, step.in_program)
        if step.apply():  # the scaler skipped it: cut the history there
            self.stream.recover()
        listener.step_completed()

    def end_stream(self) -> None:
        """Close the open window and apply the windows not yet applied; the stream starts afresh after."""
        if self.planner.window is not None:
            self.close_window(self.stream.position, stream_continues=False)
        if self.optimizer_step.accumulated:
            self.take_step()
        self.collect_failure()
        self.reset_stream()

    def collect_failure(self) -> None:
        """Read the device's decisions on the steps taken (one read, where the iteration's output is read anyway)."""
        failure = self.optimizer_step.take_failure()
        if failure is not None and self.failed is None:
            self.history.clear()
            self.failed = failure
