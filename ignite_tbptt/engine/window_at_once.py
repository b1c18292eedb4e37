"""The window that just opened, run whole as one program where planning says it runs so.

The stream loop runs a window segment by segment, and the eager executor backpropagates it in a sweep when it
closes. Where windows run as programs (``cuda_graphs``), :func:`~ignite_tbptt.planning.plan_window` decides, as
the window opens, whether it runs whole as one sweep program (:mod:`~ignite_tbptt.runtime.programs.sweep`: its model
calls, their losses and its backward pass through the retained segments it reaches; a window program where it is
one call reaching nothing); the loop then takes its segments' results as it takes an eager segment's, and its close
only drops what no later window reaches. A window that runs eagerly is counted with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..planning import BatchPlan, Eager, plan_window
from ..runtime import ProgramExecutor
from .loop_protocols import LoopView

__all__ = ["run_window"]


def run_window(
    loop: LoopView,
    executor: ProgramExecutor,
    batch: BatchPlan,
    x: Any,
    y: Any,
    resets: Mapping[int, torch.Tensor | None],
    blocked: Eager | None,
    keep_predictions: bool,
    out: Any,
) -> bool:
    """Run the window that just opened as one program where planning says so, and walk its segments; whether it ran.

    ``blocked``: why the runtime runs no program now (:meth:`ProgramExecutor.blocked
    <ignite_tbptt.runtime.ProgramExecutor.blocked>`), or ``None``. The loop takes each segment's result as an eager
    segment's (:meth:`StreamLoop.segment_done <ignite_tbptt.engine.stream_loop.StreamLoop.segment_done>`, into
    ``out``, the batch's :class:`~ignite_tbptt.engine.stream_loop.BatchResult`); where it did not run, the loop
    runs the window segment by segment, counted in ``engine.state.programs`` with its reason.
    """
    position, one_window_per_step = loop.stream.position, loop.optimizer_step.one_window_per_step
    plans, eager = plan_window(loop.planner, batch, position, one_window_per_step, blocked)
    if eager is None:
        results = executor.run_sweep(list(plans), x, y, resets, batch.start, keep_predictions)
        if results is not None:
            for plan, result in zip(plans, results):
                loop.segment_done(batch, plan, result, out, swept=True)
            return True
        eager = Eager.REACH_NOT_RETAINED
    executor.counts.ran_eagerly(eager)
    return False
