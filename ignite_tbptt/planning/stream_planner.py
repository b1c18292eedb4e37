"""The windows of one stream as its source plans them, and the plans of their segments and closes.

A :class:`StreamPlanner` is the only thing that asks a :class:`~ignite_tbptt.planning.WindowSource`: it opens each
window where the last one ended, plans each segment (:func:`~ignite_tbptt.planning.plan_segment`) and each close
(:func:`~ignite_tbptt.planning.plan_close`), and decides which windows record their gradient reach
(:class:`~ignite_tbptt.planning.ReachRequests`). The stream loop hands its plans to the runtime, which executes
them and asks no source anything (the layers' test enforces it). Free of torch, like every module here.
"""

from __future__ import annotations

from typing import Any

from .batch_plan import BatchPlan
from .close_plan import ClosePlan, plan_close
from .reach import ReachRequests
from .segment_plan import SegmentPlan, plan_segment
from .window import Window, WindowSource

__all__ = ["StreamPlanner"]


class StreamPlanner:
    """The planning side of a stream: its source, its open window and the window after it.

    Args:
        source: the window source.
        recompute: in recomputation mode, the most steps a rebuilt segment may have; ``None`` otherwise.

    Attributes:
        source: the window source in use.
        reach: the windows whose gradient reach is recorded.
        window: the open window, or ``None`` between windows.
        recorded: whether the open window's gradient reach is recorded.
    """

    def __init__(self, source: WindowSource, recompute: int | None = None) -> None:
        self.source, self.recompute = source, recompute
        self.reach = ReachRequests()
        self.window: Window | None = None
        self.recorded = False
        # The window the source gave for the last close's end: sources give the same window for the same start until
        # reset(), so it need not be asked twice.
        self._following: Window | None = None

    def reset(self) -> None:
        """A new stream starts at step 0: no open window, and the source forgets its per-stream state."""
        self.window = self._following = None
        self.recorded = False
        self.source.reset()

    def open_window(self, start: int, number: int) -> Window:
        """Open the window that starts at ``start``, window ``number`` of the run (from 1, for the reach)."""
        window = self._following
        if window is None or window.start != start:
            window = self.source.window(start)
        self.window, self._following = window, None
        self.recorded = self.reach.records(number)
        return window

    def segment(self, step: int, batch: BatchPlan, one_window_per_step: bool = False) -> SegmentPlan:
        """The plan of the open window's segment from ``step`` of ``batch``.

        ``batch`` bounds it: its end, the stream's end where the batch ends the stream, and the next sequence start
        after ``step``; ``one_window_per_step``: each optimizer step applies this window alone. See
        :func:`plan_segment`.
        """
        stride = self.reach.stride if self.recorded else None
        window, next_start = self._open(), batch.next_start(step)
        return plan_segment(
            self.source,
            window,
            step,
            batch.end,
            batch.stream_end,
            self.recompute,
            next_start,
            stride,
            self.recorded,
            one_window_per_step,
        )

    def close(self, end: int, stream_continues: bool, retained: list[int]) -> ClosePlan:
        """The plan that closes the open window at ``end``; ``retained``: the retained segments' first steps.

        See :func:`plan_close`. The window stays open until :meth:`closed`, once the plan is carried out.
        """
        return plan_close(self.source, self._open().start, end, stream_continues, retained, self.recorded)

    def _open(self) -> Window:
        if self.window is None:
            raise RuntimeError("no window is open: a segment or a close is planned only inside a window.")
        return self.window

    def closed(self, plan: ClosePlan) -> None:
        """The window ``plan`` closes is closed: the next opens where it ended."""
        self.window, self._following = None, plan.following

    def state_dict(self) -> dict[str, Any]:
        """The open window's start (``None`` between windows) and the source's state."""
        return {"window": None if self.window is None else self.window.start, "source": self.source.state_dict()}

    def load_state_dict(self, state: dict[str, Any], number: int) -> None:
        """Restore :meth:`state_dict`'s state; ``number`` is the run's window count (of the open window, if any)."""
        self.reset()
        self.source.load_state_dict(state.get("source", {}))  # absent in checkpoints written by 0.1.0
        self.window = None if state["window"] is None else self.source.window(state["window"])
        self.recorded = self.window is not None and self.reach.records(number)
