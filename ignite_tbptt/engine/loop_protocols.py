"""The stream loop's two faces: what it reports to the process function, and what a look-ahead of it reads.

The loop (:class:`~ignite_tbptt.engine.stream_loop.StreamLoop`) fires no event: it reports each window's and each
step's boundary to a :class:`LoopListener`. Deciding whether the next windows run as one sweep or batch program
(:mod:`~ignite_tbptt.engine.program_runs`) reads the loop's planner, stream, executor and optimizer step as a
:class:`LoopView`, and walks the windows it ran through it, so that the module need not import the loop.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from ..layout import Layout
from ..planning import BatchPlan, ClosePlan, SegmentPlan, StreamPlanner
from ..runtime import LossSum, RetainedHistory, SegmentResult, StepHandlers, StreamState
from .optimizer_step import OptimizerStep, RunPosition

__all__ = ["CompletedWindow", "LoopListener", "LoopView"]


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
        """The handlers of the step's start, as a step program sees them: the last ones may run inside it."""

    def quiet_step_handlers(self) -> StepHandlers | None:
        """The step's handlers, if no handler listens to a window's or a step's events on the host; else ``None``.

        Then a batch's windows may run as one program (:mod:`ignite_tbptt.runtime.programs.batch`).
        """

    def step_started(self, targets: int, in_program: int = 0) -> None:
        """The gradients of an optimizer step over ``targets`` targets are final; the step comes next.

        The last ``in_program`` handlers of the step's start run inside the step program, not here.
        """

    def step_completed(self) -> None:
        """The optimizer stepped (or the scaler skipped the step)."""

    def window_completed(self, window: CompletedWindow) -> None:
        """A window's backward pass and its optimizer step, if one was due, are done."""


class LoopView(Protocol):
    """What the look-ahead of a sweep or batch program reads of the stream loop (read only)."""

    @property
    def executor(self) -> Any:
        """The executor: a :class:`~ignite_tbptt.runtime.ProgramExecutor` where windows run as programs."""

    @property
    def planner(self) -> StreamPlanner:
        """The stream's planner (a look-ahead plans on a copy)."""

    @property
    def stream(self) -> StreamState:
        """The stream's position, hidden state and history."""

    @property
    def history(self) -> RetainedHistory:
        """The stream's retained segments."""

    @property
    def optimizer_step(self) -> OptimizerStep:
        """The accumulation and the optimizer step."""

    @property
    def layout(self) -> Layout:
        """The batches' time and batch axes."""

    @property
    def listener(self) -> LoopListener:
        """What the loop reports to (set before a run)."""

    def open_window(self) -> None:
        """A window opens at the stream's position."""

    def segment_done(
        self,
        batch: BatchPlan,
        plan: SegmentPlan,
        result: SegmentResult,
        out: Any,
        swept: bool = False,
        taken: Any = None,
        close: ClosePlan | None = None,
    ) -> None:
        """A segment ran: its loss counted into ``out``, its window closed if it ends (a program's results too)."""
