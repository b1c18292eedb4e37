"""A window run as a program where planning says so, and the loop's walk of the segments it ran.

Where windows run as programs (``cuda_graphs``), the stream loop asks as each window opens whether it runs whole
as one sweep program (:func:`run_window_program`, as
:func:`~ignite_tbptt.planning.plan_window` says: its model calls, their losses and its backward pass through the
retained segments it reaches; a window program where it is one call reaching nothing); the loop takes its segments'
results as an eager segment's, and its close only drops what no later window reaches. A window that runs eagerly
is counted with its reason.
"""

from __future__ import annotations

from typing import Any

from ..planning import BatchPlan, Eager, SegmentPlan, StreamPlanner, plan_window
from ..runtime import ProgramExecutor, Resets, SegmentResult

__all__ = ["run_window_program"]


def run_window_program(
    planner: StreamPlanner,
    executor: ProgramExecutor,
    batch: BatchPlan,
    x: Any,
    y: Any,
    resets: Resets,
    position: int,
    one_window_per_step: bool,
    keep_predictions: bool,
) -> list[tuple[SegmentPlan, SegmentResult]] | None:
    """Run the window ``planner`` just opened at step ``position`` as one program, where planning says so.

    Why no program may run now is the executor's answer (:meth:`ProgramExecutor.blocked
    <ignite_tbptt.runtime.ProgramExecutor.blocked>`), handed to planning with the rest
    (:func:`~ignite_tbptt.planning.plan_window`).

    Returns:
        Each segment's plan and result, which the loop takes as an eager segment's; ``None`` where the window did not
        run as a program, its reason counted in ``engine.state.programs``: the loop runs it segment by segment.
    """
    plans, eager = plan_window(planner, batch, position, one_window_per_step, executor.blocked())
    if eager is None:
        results = executor.run_sweep(plans, x, y, resets, batch.start, keep_predictions)
        if results is not None:
            return list(zip(plans, results))
        eager = Eager.REACH_NOT_RETAINED
    executor.counts.ran_eagerly(eager)
    return None
