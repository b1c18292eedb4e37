"""How a window runs where windows may run as programs: whole as one program, or segment by segment, and why.

Where the trainer runs windows as programs (``cuda_graphs``), the stream loop asks here at every window boundary,
and nowhere else is it decided. A window runs whole as one program (a sweep program of its model calls and of the
retained segments it reaches, :mod:`ignite_tbptt.runtime.programs.sweep`) where its whole course is planned before
it runs: the batch holds all of it, every step gets the gradient of the whole window, and its gradient reach is not
recorded. Otherwise it runs segment by segment, eagerly, and :class:`Eager` says why. The rest of a batch runs as
one batch program (:mod:`ignite_tbptt.runtime.programs.batch`) where at least two of its windows from the stream's
position on are each one model call paid at once (:func:`batch_windows`) and nothing of the engine needs the host
between them; otherwise :class:`WindowByWindow` says why. What the runtime and the engine know (the model call's
first checks, torch's profiler, the handlers, the optimizer) reaches this module as the reason it gives; the window
sources say what they allow (:attr:`~ignite_tbptt.planning.WindowSource.allows_programs`), which the trainer checks
as a source is installed.
"""

from __future__ import annotations

import copy
import enum
from typing import NamedTuple

from .batch_plan import BatchPlan
from .close_plan import ClosePlan
from .segment_plan import SegmentPlan
from .stream_planner import StreamPlanner
from .walk import StreamWalk

__all__ = [
    "Eager",
    "WindowByWindow",
    "WindowExecution",
    "plan_window",
    "PlannedWindow",
    "BatchExecution",
    "batch_windows",
]


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


class WindowByWindow(enum.Enum):
    """Why the rest of a batch runs window by window rather than as one batch program; its value names its count.

    A user reads the counts as ``engine.state.programs.window_by_window``
    (:class:`~ignite_tbptt.runtime.ProgramCounts`), one per batch, asked at its first window boundary where a program
    may run.
    """

    #: Fewer than two of its next windows are each one model call paid at once of which nothing is retained, before
    #: one that is not (k2 > k1, a sequence start inside it, the batch ending inside it, its gradient reach recorded).
    WINDOWS = "windows"
    #: ``output_transform`` takes the predictions, which a batch program does not copy out.
    PREDICTIONS = "predictions"
    #: A ``GradScaler``: whether it skipped a step is read after each, to restart a hidden state that overflowed.
    SCALER = "scaler"
    #: ``target_count_fn`` before the first optimizer step: a first step without targets, skipped on the device, would
    #: leave the optimizer without its state.
    FIRST_STEP = "first_step"
    #: The optimizer step cannot run as a program: the optimizer does not skip its step on the device (fused SGD,
    #: Adam and AdamW do), or ``zero_grad`` is not torch's own.
    STEP = "step"
    #: A distributed run: each step sums the gradients over the processes first.
    DISTRIBUTED = "distributed"
    #: Windows reach retained segments (k2 > k1), which a batch program does not run again.
    RETAINED = "retained"
    #: A handler listens, on the host, to a window's or a step's events, which fire between the windows.
    HANDLERS = "handlers"


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


class PlannedWindow(NamedTuple):
    """A window of one segment, planned ahead with its close (:func:`batch_windows`)."""

    #: Its one segment.
    segment: SegmentPlan
    #: Its close: the stream loop carries it out as the program's windows are walked.
    close: ClosePlan


class BatchExecution(NamedTuple):
    """How the rest of a batch runs (:func:`batch_windows`)."""

    #: The windows one batch program runs, two or more; ``()`` where they run window by window.
    windows: tuple[PlannedWindow, ...]
    #: Why they run window by window; ``None`` where one batch program runs them.
    window_by_window: WindowByWindow | None


def batch_windows(
    planner: StreamPlanner,
    batch: BatchPlan,
    position: int,
    one_window_per_step: bool,
    number: int,
    blocked: WindowByWindow | None = None,
) -> BatchExecution:
    """The windows from ``position`` on that one batch program runs, each one segment, or why they run one by one.

    They run up to the first that is not a whole window of one model call paid at once of which nothing is
    retained (:attr:`~ignite_tbptt.planning.SegmentPlan.self_contained`), or whose gradient reach is recorded: a
    sequence start inside a window, or the batch ending inside one, ends the run; under two, they run window by
    window. The windows are planned on a copy of ``planner``, between windows; ``number``: the run's windows so far;
    ``blocked``: what the engine lacks for a batch program (the handlers, the optimizer, ...), or ``None``.

    Examples:
        >>> from ignite_tbptt.planning import Schedule, StreamPlanner, plan_batch
        >>> windows, _ = batch_windows(StreamPlanner(Schedule(4, 4)), plan_batch(0, 10, False, {}), 0, True, 0)
        >>> [(w.segment.start, w.segment.end, w.close.following.start) for w in windows]
        [(0, 4, 4), (4, 8, 8)]
        >>> batch_windows(StreamPlanner(Schedule(4, 6)), plan_batch(0, 10, False, {}), 0, True, 0).window_by_window
        <WindowByWindow.WINDOWS: 'windows'>
    """
    if blocked is not None:
        return BatchExecution((), blocked)
    walk = StreamWalk(copy.copy(planner), one_window_per_step, windows=number)
    windows: list[PlannedWindow] = []
    segment = None
    for planned in walk.run(batch, 0, position):
        plan = planned.plan
        if isinstance(plan, ClosePlan):  # it retains nothing: a self-contained window's
            assert segment is not None, "a close follows its window's segment"
            windows.append(PlannedWindow(segment, plan))
        elif walk.planner.recorded or not plan.self_contained:
            break
        else:
            segment = plan
    if len(windows) < 2:
        return BatchExecution((), WindowByWindow.WINDOWS)
    return BatchExecution(tuple(windows), None)
