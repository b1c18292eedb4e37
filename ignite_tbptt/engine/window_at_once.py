"""A window of several model calls, or one that reaches back (k2 > k1), run at once as a sweep program.

The stream loop runs a window segment by segment, and the eager executor backpropagates it in a sweep when it
closes. Where windows run as programs (``cuda_graphs``), a window that is more than one model call paid at once (a
sequence start splits it, a later cut splits it, or it reaches back into retained segments) runs whole as one sweep
program (:mod:`~ignite_tbptt.runtime.programs.sweep`) as it opens; the loop then takes its segments' results as it
takes an eager segment's, and its close only drops what no later window reaches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..planning import BatchPlan, SegmentPlan
from ..runtime import profiling
from .loop_protocols import LoopView

__all__ = ["run_window"]


def run_window(
    loop: LoopView,
    batch: BatchPlan,
    x: Any,
    y: Any,
    resets: Mapping[int, torch.Tensor | None],
    one_window_per_step: bool,
    keep_predictions: bool,
    out: Any,
) -> bool:
    """Run the window that just opened as a sweep program, where it is one, and walk its segments; whether it ran.

    It is one where the batch holds all of it, its gradient reach is not recorded, none of its segments gets its own
    loss only, and it is more than one model call paid at once (which a window program runs). In recomputation
    mode every window is one (its segments are rebuilt), and its program recomputes each call in its backward pass.
    The loop takes each segment's result as an eager segment's (:meth:`StreamLoop.segment_done
    <ignite_tbptt.engine.stream_loop.StreamLoop.segment_done>`, into ``out``, the batch's
    :class:`~ignite_tbptt.engine.stream_loop.BatchResult`); where it did not run, the loop runs the window segment
    by segment.
    """
    executor, planner = loop.executor, loop.planner
    if planner.recorded or not executor.ready() or profiling():
        return False
    plans = _segments(loop, batch, one_window_per_step)
    if plans is None or (len(plans) == 1 and not plans[0].joins_history):
        return False
    results = executor.run_sweep(plans, x, y, resets, batch.start, keep_predictions)
    if results is None:
        return False
    for plan, result in zip(plans, results):
        loop.segment_done(batch, plan, result, out, swept=True)
    return True


def _segments(loop: LoopView, batch: BatchPlan, one_window_per_step: bool) -> list[SegmentPlan] | None:
    # The open window's segments as the loop will plan them (planning changes nothing), or None where the batch ends
    # inside it or one of them is not a program's.
    planner, step, plans = loop.planner, loop.stream.position, []
    while True:
        plan = planner.segment(step, batch.end, batch.stream_end, batch.next_start(step), one_window_per_step)
        if plan.own_loss_only:
            return None
        plans.append(plan)
        if plan.closes_window:
            return plans
        if plan.end >= batch.end:
            return None
        step = plan.end
