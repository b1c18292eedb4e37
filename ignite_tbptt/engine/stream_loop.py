"""The walk along a stream: each batch's segments, the windows they close and the optimizer steps that follow.

A :class:`StreamLoop` walks each batch with the :class:`~ignite_tbptt.planning.walk.StreamWalk` that every walk of a
schedule runs (its :class:`~ignite_tbptt.planning.StreamPlanner` plans every segment and every window's close), has
the :class:`~ignite_tbptt.runtime.SegmentExecutor` carry out both plans, and takes the optimizer step of every
accumulation that completes. It fires no event and touches no ``engine.state``: what happens at a window's or
a step's boundary is reported to a :class:`LoopListener` (the process function's, in
:mod:`ignite_tbptt.engine.process`), which fires ignite's events and keeps ``engine.state``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..data.batch import check_pair, resets_by_step
from ..layout import Layout
from ..planning import BatchPlan, SegmentPlan, StreamPlanner, WindowSource, plan_batch
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
    StreamState,
    SwappedWeights,
    build_executor,
    check_resettable,
    profiled,
    profiling,
    reach_profile,
)
from . import distributed
from .loop_protocols import CompletedWindow, LoopListener
from .optimizer_step import OptimizerStep
from .program_runs import run_window_program

__all__ = ["StreamLoop", "LoopListener", "CompletedWindow", "BatchResult"]


class BatchResult(NamedTuple):
    """What one batch gave."""

    #: The loss of the segments the batch ran, with their target count.
    loss: LossSum
    #: Their detached predictions, in order, if asked for.
    predictions: list[Any]


def _check_sharded_takes(source: WindowSource, programs: bool) -> None:
    # What a model sharded by FSDP2 cannot run, refused as a run starts.
    if not source.standalone:
        raise ValueError(
            f"{type(source).__name__} with a model sharded by FSDP2: each process would choose its own windows from "
            "its own measurements, and their backward passes (each with FSDP2's collectives) would differ. "
            "Use fixed windows (k1, k2), or windows of the same seed on every process (RandomWindows, ARTBP)."
        )
    if programs:
        raise ValueError(
            "cuda_graphs with a model sharded by FSDP2: its gathers and reduce-scatters run in every model "
            "call and are not captured. Pass cuda_graphs=False."
        )


def _check_programs_take(source: WindowSource, call: ModelCall, parameters: list[torch.Tensor]) -> None:
    # What programs cannot run, refused as the source is installed. Windows that reach back run retained segments
    # again with the weights they ran with, swapped into the model and the initial state.
    if not source.allows_programs:
        k1, k2 = getattr(source, "k1", None), getattr(source, "k2", None)
        raise ValueError(
            f"cuda_graphs captures fixed windows of TBPTT(k1, k2) with k2 >= k1; {type(source).__name__} has "
            f"k1 = {k1}, k2 = {k2}: steps before a k2 < k1 cut get their own loss only, windows of varying length "
            "are cut at places of every kind, or the gradient is reweighted inside the sweep (ARTBP). Use fixed "
            "windows with k2 >= k1, or pass cuda_graphs=False."
        )
    if source.spans_windows:
        SwappedWeights.check(call.model, call.initial_state, [p for p in parameters if p.requires_grad])


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
        execution: how windows run: eagerly, or as window programs (:mod:`ignite_tbptt.runtime.programs.executor`).

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
    ) -> None:
        self.model, self.optimizer_step = model, optimizer_step
        self.layout, self.carry_hidden = layout, carry_hidden
        self.planner = StreamPlanner(source, recompute)
        history = RetainedHistory(model_call, optimizer_step.parameters, None, recompute is not None)
        self.stream = StreamState(history)
        # Every plan is asked of the walk all walks of a schedule share; closes are planned from the runtime's history.
        self.walk = StreamWalk(self.planner, optimizer_step.one_window_per_step, history.starts)
        loss = LossRule(loss_fn, model_call, optimizer_step.scaler)
        self.executor = build_executor(
            execution, model_call, loss, self.stream, target_count_fn, optimizer_step.programs
        )
        self.use_source(source)
        #: The model has parameters sharded by FSDP2 and runs in a distributed group (:meth:`start_run`).
        self.sharded = False
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
        if sharded:
            _check_sharded_takes(self.source, self.executor.runs_programs)
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
                k2 != k1, ARTBP), or reach back while the optimizer trains parameters that are neither the model's
                nor ``initial_state``'s (:class:`~ignite_tbptt.runtime.SwappedWeights`).
        """
        if self.executor.runs_programs:
            _check_programs_take(source, self.executor.model_call, self.optimizer_step.parameters())
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

    def state_dict(self) -> dict:
        """The stream and its windows (:meth:`StreamState.state_dict`, :meth:`StreamPlanner.state_dict`)."""
        return {**self.stream.state_dict(), **self.planner.state_dict()}

    def load_state_dict(self, state: dict, window: int, same_source: bool = True) -> None:
        """Restore :meth:`state_dict`'s stream; ``window`` is the run's window count, for the open window's reach.

        ``same_source``: the checkpoint's windows came from a source of this one's type, whose state it loads.
        """
        self.planner.load_state_dict(state if same_source else {**state, "source": {}}, window)
        self.stream.load_state_dict(state)

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
        batch = plan_batch(self.stream.position, length, ends_stream, resets)
        out = BatchResult(LossSum(), [])
        self._walk(batch, x, y, resets, keep_predictions, out)
        return out

    def _walk(
        self,
        batch: BatchPlan,
        x: Any,
        y: Any,
        resets: Resets,
        keep_predictions: bool,
        out: BatchResult,
    ) -> None:
        stream, planner, run, steps = self.stream, self.planner, self.executor.run, self.layout.steps
        offset = batch.start
        # Read where it is used, as the optimizer step has it now (a distributed run's is known once the run starts).
        self.walk.one_window_per_step = self.optimizer_step.one_window_per_step
        # Where windows may run as programs, planning decides as each window opens; None where they run eagerly.
        programs = self.executor if isinstance(self.executor, ProgramExecutor) else None
        while stream.position < batch.end and self.failed is None:
            if planner.window is None:
                self.open_window()
                if programs is not None:
                    ran = run_window_program(
                        planner, programs, batch, x, y, resets, stream.position, self.walk.one_window_per_step,
                        keep_predictions,
                    )  # fmt: skip
                    if ran is not None:
                        for plan, result in ran:
                            self.segment_done(batch, plan, result, out, swept=True)
                        continue
            for plan in self.walk.segments(batch, stream.position):
                start, end = plan.start - offset, plan.end - offset
                result = run(plan, steps(x, start, end), steps(y, start, end), resets.get(start), keep_predictions)
                self.segment_done(batch, plan, result, out)

    def segment_done(
        self,
        batch: BatchPlan,
        plan: SegmentPlan,
        result: SegmentResult,
        out: BatchResult,
        swept: bool = False,
    ) -> None:
        """A segment ran (eagerly, or in a sweep program): its loss counted, its window closed if it ends.

        ``swept`` as :meth:`close_window` takes it; ``out``: the batch's loss and predictions so far.
        """
        out.loss.add(result.loss, result.targets, plan.whole_window)
        self.optimizer_step.accumulate(result.targets, plan.backward_mean)
        self.listener.targets_processed(result.targets)
        out.predictions.append(result.predictions)
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

        ``swept``: a sweep program ran the window and its backward pass; only what no later window reaches is
        dropped.
        """
        stream, executor, listener = self.stream, self.executor, self.listener
        plan = self.walk.close(end, stream_continues)
        if swept:
            assert isinstance(executor, ProgramExecutor), "only a program executor sweeps a window at once"
            executor.close_swept(plan)
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
        # Retained segments need nothing of the step: their weights were copied before it (take_step).
        handlers = listener.step_handlers() if step.programs is not None else None
        targets = step.prepare(listener.position(), handlers)
        if not targets:
            return
        # A step runs in a program only with the handlers it was prepared with.
        listener.step_started(targets, len(handlers.on_device) if handlers is not None and step.in_program else 0)
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
