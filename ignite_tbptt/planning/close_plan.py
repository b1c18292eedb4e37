"""What closing a window does, decided once, free of torch: its cut, the next window, and the backward sweep.

When a window's last segment has run, :func:`plan_close` decides everything that happens before the next window
opens, from the window source and the starts of the retained segments alone: the window's cut, the window that
follows it, and, for each retained segment from the last back to the cut, whether it gets its own loss only
(before a k2 < k1 cut), whether its graph is kept for the next window (``retain_graph``), the factor of the
hidden-state gradient that leaves it (ARTBP's compensation), and whether that gradient goes on to the segment
before it. Then which segments stay retained. The runtime executes the :class:`ClosePlan` without asking the
window source anything (:meth:`~ignite_tbptt.runtime.RetainedHistory.backward`).

The sweep is Williams & Peng's BPTT(h; h') (1990) by linearity: each segment is traversed once per window, with
the sum of its owed loss gradient and the hidden-state gradient of the segments after it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import NamedTuple

from .window import Window, WindowSource

__all__ = ["SweepStep", "ClosePlan", "plan_close"]


class SweepStep(NamedTuple):
    """One traversal of the backward sweep: a retained segment and how it is backpropagated."""

    #: The segment's index in the retained history (oldest first).
    segment: int
    #: First step of the segment.
    start: int
    #: The segment lies before the window's cut (k2 < k1): its own loss only, no hidden-state gradient in or out.
    own_loss_only: bool
    #: The next window's sweep traverses it again: its graph is kept (``retain_graph=True``).
    retain: bool
    #: The hidden-state gradient reaching its input is multiplied by this (ARTBP's compensation), or ``None``.
    factor: float | None
    #: That gradient goes on to the segment before it (the segment starts after the cut).
    passes_on: bool


class ClosePlan(NamedTuple):
    """The decisions for closing one window ``[start, end)`` (a named tuple: one is made per window)."""

    #: First step of the window.
    start: int
    #: End (exclusive) of the window.
    end: int
    #: Its cut: the first step its backward pass reaches.
    cut: int
    #: The window that follows it, or ``None`` if the stream ends with it.
    following: Window | None
    #: The traversals of the backward sweep, from the last retained segment back (empty: nothing retained).
    sweep: tuple[SweepStep, ...]
    #: The retained segments from this index on stay for later windows; those before it are dropped.
    keep_from: int
    #: Some graph is kept past this sweep, so compiled graphs must allow a second backward pass.
    retains: bool
    #: The window's gradient reach is recorded: the sweep hands back the gradient reaching each segment's input.
    recorded: bool


def plan_close(
    source: WindowSource,
    start: int,
    end: int,
    stream_continues: bool,
    retained: Sequence[int] = (),
    recorded: bool = False,
) -> ClosePlan:
    """Plan the close of the window ``[start, end)``.

    Args:
        source: the window source of the stream.
        start: first step of the window.
        end: its end, where its last segment ended (the stream's end may cut the planned window short).
        stream_continues: whether the stream goes on past ``end``.
        retained: the first step of each retained segment, oldest first, the window's own last segment included.
        recorded: the window's gradient reach is recorded.

    Returns:
        The window's :class:`ClosePlan`.

    Examples:
        >>> from ignite_tbptt import Schedule
        >>> plan = plan_close(Schedule(2, 5), start=4, end=6, stream_continues=True, retained=[0, 1, 2, 3, 4])
        >>> plan.cut, plan.following, plan.keep_from
        (1, Window(start=6, end=8, cut=3), 3)
        >>> [(s.start, s.retain, s.passes_on) for s in plan.sweep]
        [(4, True, True), (3, True, True), (2, False, True), (1, False, False)]
        >>> [(s.start, s.own_loss_only) for s in plan_close(Schedule(5, 2), 0, 5, False, [0, 1, 2, 3]).sweep]
        [(3, False), (2, True), (1, True), (0, True)]
    """
    cut = source.cut(start, end)
    following = source.window(end) if stream_continues else None
    if not retained:  # every segment was paid at once (k1 = k2, say): nothing to sweep or drop
        return ClosePlan(start, end, cut, following, (), 0, False, recorded)
    next_cut = None if following is None else following.cut
    factors = source.compensation(start)
    sweep = []
    for index in range(len(retained) - 1, -1, -1):
        step = retained[index]
        if step < cut:
            if step < start:  # an earlier window's segment before the cut: the sweep ends here
                break
            sweep.append(SweepStep(index, step, True, False, None, False))
            continue
        retain = next_cut is not None and step >= next_cut
        sweep.append(SweepStep(index, step, False, retain, factors.get(step), step > cut))
    keep_from = len(retained) if next_cut is None else bisect_left(retained, next_cut)
    retains = next_cut is not None and retained[-1] >= next_cut
    return ClosePlan(start, end, cut, following, tuple(sweep), keep_from, retains, recorded)
