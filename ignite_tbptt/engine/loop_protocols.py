"""What the stream loop reports to the process function.

The loop (:class:`~ignite_tbptt.engine.stream_loop.StreamLoop`) fires no event: it reports each window's and each
step's boundary to a :class:`LoopListener`.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from ..runtime import LossSum, StepHandlers
from .optimizer_step import RunPosition

__all__ = ["CompletedWindow", "LoopListener"]


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

    def step_started(self, targets: int, in_program: int = 0) -> None:
        """The gradients of an optimizer step over ``targets`` targets are final; the step comes next.

        The last ``in_program`` handlers of the step's start run inside the step program, not here.
        """

    def step_completed(self) -> None:
        """The optimizer stepped (or the scaler skipped the step)."""

    def window_completed(self, window: CompletedWindow) -> None:
        """A window's backward pass and its optimizer step, if one was due, are done."""
