"""How a window runs where windows may run as programs: whole as one program, or segment by segment, and why.

Where the trainer runs windows as programs (``cuda_graphs``), the stream loop asks here at every window boundary,
and nowhere else is it decided. A window runs whole as one program (a sweep program of its model calls and of the
retained segments it reaches, :mod:`ignite_tbptt.runtime.programs.sweep`) where its whole course is planned before
it runs: the batch holds all of it, every step gets the gradient of the whole window, and its gradient reach is not
recorded. Otherwise it runs segment by segment, eagerly, and :class:`Eager` says why. One window per replay: no
program runs several windows (SPEC.md, "One window per replay"). What the runtime knows (the model call's first
checks, torch's profiler) reaches this module as the reason it gives; the window
sources say what they allow (:attr:`~ignite_tbptt.planning.WindowSource.allows_programs`), which the trainer checks
as a source is installed.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from .batch_plan import BatchPlan
from .segment_plan import SegmentPlan
from .stream_planner import StreamPlanner
from .walk import StreamWalk

__all__ = ["Eager", "WindowExecution", "plan_window"]


class Eager(enum.Enum):
    """Why a window runs segment by segment where windows may run as programs; its value names its count.

    A user reads the counts as ``engine.state.programs.eager`` (:class:`~ignite_tbptt.runtime.ProgramCounts`).
    """

    #: A stream's first windows: the model call's checks that need an eager call (the state returned was read from
    #: the state given, the columns a reset handles) are not yet done, or there is no hidden state yet.
    CHECKS = "checks"
    #: torch's profiler is running, whose ranges a program would not show.
    PROFILER = "profiler"
    #: The window's gradient reach is recorded (:class:`~ignite_tbptt.GradientReach`), a read on the host per segment.
    RECORDED = "recorded"
    #: The batch ends inside the window: its course depends on the next batch.
    BATCH_ENDS_INSIDE = "batch_ends_inside"
    #: Some steps of the window get their own loss only (a k2 < k1 cut).
    OWN_LOSS_ONLY = "own_loss_only"
    #: The retained segments the window reaches are not all kept as what recomputes them (after a resumed run, or
    #: a step the scaler skipped, cut the history).
    REACH_NOT_RETAINED = "reach_not_retained"


class WindowExecution(NamedTuple):
    """How the window that just opened runs (:func:`plan_window`)."""

    #: Its segments, planned, where it runs whole as one program; ``()`` where it runs segment by segment.
    segments: tuple[SegmentPlan, ...]
    #: Why it runs segment by segment; ``None`` where it runs as a program.
    eager: Eager | None


def plan_window(
    planner: StreamPlanner, batch: BatchPlan, position: int, one_window_per_step: bool, blocked: Eager | None
) -> WindowExecution:
    """How the window ``planner`` just opened at step ``position`` runs: as one program, or eagerly and why.

    Args:
        planner: the stream's planner, its window open; planning changes nothing.
        batch: the batch at hand.
        position: the stream's step, the window's first.
        one_window_per_step: as :func:`~ignite_tbptt.planning.plan_segment` takes it.
        blocked: why no program may run now, as the runtime says (the model call's first checks, the profiler), or
            ``None``.

    Examples:
        >>> from ignite_tbptt.planning import Schedule, StreamPlanner, plan_batch
        >>> planner = StreamPlanner(Schedule(k1=4, k2=6))
        >>> batch = plan_batch(0, 10, True, {})
        >>> _ = planner.open_window(4, 2)
        >>> [(s.start, s.end) for s in plan_window(planner, batch, 4, False, None).segments]
        [(4, 6), (6, 8)]
        >>> _ = planner.open_window(8, 3)
        >>> plan_window(planner, plan_batch(8, 1, False, {}), 8, False, None).eager
        <Eager.BATCH_ENDS_INSIDE: 'batch_ends_inside'>
    """
    if blocked is not None:
        return WindowExecution((), blocked)
    if planner.recorded:
        return WindowExecution((), Eager.RECORDED)
    segments = _window_segments(planner, batch, position, one_window_per_step)
    if isinstance(segments, Eager):
        return WindowExecution((), segments)
    return WindowExecution(segments, None)


def _window_segments(
    planner: StreamPlanner, batch: BatchPlan, step: int, one_window_per_step: bool
) -> tuple[SegmentPlan, ...] | Eager:
    # The open window's segments as the walk plans them, up to the one that closes it (its close is not planned:
    # the planner is left as it is), or why it cannot run whole.
    plans: list[SegmentPlan] = []
    for plan in StreamWalk(planner, one_window_per_step).segments(batch, step):
        if plan.own_loss_only:
            return Eager.OWN_LOSS_ONLY
        plans.append(plan)
        if plan.closes_window:
            return tuple(plans)
    return Eager.BATCH_ENDS_INSIDE
