"""One walk of a window source over a stream: every plan the trainer makes, in its order, without running anything.

The trainer's loop plans a stream batch by batch: it opens a window where the last one closed, plans each segment
from the batch (:func:`~ignite_tbptt.planning.plan_batch`, :meth:`StreamPlanner.segment
<ignite_tbptt.planning.StreamPlanner.segment>`), and where a segment closes its window it plans the close from the
retained segments (:meth:`StreamPlanner.close <ignite_tbptt.planning.StreamPlanner.close>`). :class:`StreamWalk` is
that order, written once: the stream loop trains on it, and the look-ahead of a window program runs it
ahead. :func:`walk` runs it over batches of a given length, and keeps the retained segments' first steps the way the
runtime's history keeps them (a segment whose plan joins the history is appended; after a close only those from the
plan's ``keep_from`` on stay), so that whatever needs to know where windows, segments and cuts fall (the evaluator's
pieces, the check of Mamba2's schedule, the schedule's picture) asks the trainer's own decisions rather than
computing them again.

Sources: Williams & Peng (1990), "An efficient gradient-based algorithm for on-line training of recurrent network
trajectories", Neural Computation 2(4), the BPTT(h; h') algorithm; Sutskever (2013), "Training recurrent neural
networks", PhD thesis, University of Toronto, section 2.8.6 ("every k1 timesteps, run BPTT for k2 timesteps").
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from ..checks import positive_int
from .batch_plan import BatchPlan, plan_batch
from .close_plan import ClosePlan
from .segment_plan import SegmentPlan
from .stream_planner import StreamPlanner
from .window import WindowSource

__all__ = ["Planned", "StreamWalk", "walk"]


class Planned(NamedTuple):
    """One plan of the walk: a segment's or a window's close, with the batch it is made in."""

    #: Index of the batch (from 0) that runs the segment, or whose last segment closes the window.
    batch: int
    #: The segment's :class:`~ignite_tbptt.planning.SegmentPlan` or the close's
    #: :class:`~ignite_tbptt.planning.ClosePlan`.
    plan: SegmentPlan | ClosePlan
    #: The first steps of the retained segments when the plan is made, oldest first: for a close, those it is
    #: planned from (the window's last segment included, if it joined the history).
    retained: tuple[int, ...]


def walk(
    source: WindowSource,
    length: int,
    *,
    batch_length: int | None = None,
    carry: bool = True,
    end_known: bool = True,
    sequence_starts: Iterable[int] = (),
    recompute: int | None = None,
    one_window_per_step: bool = False,
) -> Iterator[Planned]:
    """Walk ``source``'s windows over ``length`` steps cut into batches, as the trainer plans them.

    The trainer's decision code makes every plan: a :class:`~ignite_tbptt.planning.StreamPlanner` over ``source``,
    asked what :class:`~ignite_tbptt.engine.stream_loop.StreamLoop` asks it, with each batch planned by
    :func:`~ignite_tbptt.planning.plan_batch`. The source is reset at each stream's start, as the trainer resets it,
    and a random source draws from where its generator is: walk a source of its own, not one a trainer is using
    (two :class:`~ignite_tbptt.RandomWindows` with the same seed walk the same windows).

    Args:
        source: the window source.
        length: steps of the data walked over.
        batch_length: steps per batch (the last batch may be shorter); default: one batch of ``length`` steps.
        carry: the batches are consecutive pieces of one stream (``carry_hidden=True``); else each batch is a stream
            of its own, whose plans count steps from the batch's first.
        end_known: with ``carry``, the last batch is known to end the stream (an epoch of known length); else the
            stream's end is known only after it, and the window it leaves open closes then, as at an epoch's end.
        sequence_starts: steps of the data (from 0, across batches) where some column starts a sequence.
        recompute: the trainer's ``recompute``: rebuilt segments of at most this many steps.
        one_window_per_step: each optimizer step applies one window of one process (no accumulation).

    Yields:
        A :class:`Planned` for each segment, in order, and for each window's close, right after the segment that
        closes it (or, with ``end_known`` False, after the last batch).

    Raises:
        TypeError: if ``length``, ``batch_length`` or ``recompute`` is not an int.
        ValueError: if ``length``, ``batch_length`` or ``recompute`` is not positive.

    Examples:
        >>> from ignite_tbptt import Schedule
        >>> from ignite_tbptt.planning import ClosePlan
        >>> for planned in walk(Schedule(k1=2, k2=3), 5, batch_length=3):
        ...     plan = planned.plan
        ...     kind = "close" if isinstance(plan, ClosePlan) else "segment"
        ...     print(planned.batch, kind, plan.start, plan.end, planned.retained)
        0 segment 0 1 ()
        0 segment 1 2 (0,)
        0 close 0 2 (0, 1)
        0 segment 2 3 (1,)
        1 segment 3 4 (1, 2)
        1 close 2 4 (1, 2, 3)
        1 segment 4 5 (3,)
        1 close 4 5 (3, 4)
        >>> [(p.plan.start, p.plan.end, p.plan.cut) for p in walk(Schedule(2, 3), 5) if isinstance(p.plan, ClosePlan)]
        [(0, 2, 0), (2, 4, 1), (4, 5, 3)]
    """
    positive_int("length", length, "steps of the stream")
    size = length if batch_length is None else positive_int("batch_length", batch_length, "steps per batch")
    if recompute is not None:
        positive_int("recompute", recompute, "steps per rebuilt segment")
    starts = sorted(set(sequence_starts))
    # The retained segments' first steps, kept as the runtime's history keeps them: a segment whose plan joins the
    # history is appended; a close keeps those from its keep_from on; a stream starts with none.
    retained: list[int] = []
    stream = StreamWalk(StreamPlanner(source, recompute), one_window_per_step, retained.copy)
    for index, first in enumerate(range(0, length, size)):
        steps = min(size, length - first)
        if index == 0 or not carry:
            stream.planner.reset()
            retained.clear()
        ends_stream = not carry or (end_known and first + steps == length)
        in_batch = starts[bisect_left(starts, first) : bisect_left(starts, first + steps)]
        batch = plan_batch(first if carry else 0, steps, ends_stream, [t - first for t in in_batch])
        yield from _kept(stream.run(batch, index), retained)
    if stream.planner.window is not None:  # the stream's end, known only after its last batch, closes the open window
        yield from _kept(stream._planned_close(length, False, index), retained)


def _kept(plans: Iterator[Planned], retained: list[int]) -> Iterator[Planned]:
    for planned in plans:
        yield planned
        plan = planned.plan
        if isinstance(plan, ClosePlan):
            del retained[: plan.keep_from]
        elif plan.joins_history:
            retained.append(plan.start)


class StreamWalk:
    """The planning side of the trainer's loop over one stream: windows opened, their segments and their closes.

    What every walk of a schedule runs: the stream loop as it trains
    (:class:`~ignite_tbptt.engine.stream_loop.StreamLoop`, which asks for each plan as it goes, runs each segment and
    each window's backward sweep in between, and numbers windows by the run's events), :func:`walk` (:meth:`run`),
    and the look-ahead that decides how a window runs as a program (:func:`~ignite_tbptt.planning.plan_window`, on
    the stream's planner).

    Args:
        planner: the stream's planner (its open window, if any, where the walk starts).
        one_window_per_step: each optimizer step applies one window of one process (no accumulation).
        retained: the retained segments' first steps, oldest first, as each plan is made (a close is planned from
            them): in training, the runtime's history's (:meth:`RetainedHistory.starts
            <ignite_tbptt.runtime.RetainedHistory.starts>`); by default none.
        windows: the windows opened before the walk, numbered from 1 over the run as the trainer numbers them.
    """

    def __init__(
        self,
        planner: StreamPlanner,
        one_window_per_step: bool,
        retained: Callable[[], list[int]] = list,
        windows: int = 0,
    ) -> None:
        self.planner, self.one_window_per_step, self.retained = planner, one_window_per_step, retained
        self.windows = windows

    def run(self, batch: BatchPlan, index: int, step: int | None = None) -> Iterator[Planned]:
        """The plans of one batch from ``step`` (its first by default), as the trainer makes them.

        A window opens where none is; its segments are planned (:meth:`segments`), and where one closes it, its close
        (:meth:`close`), which is carried out (the planner told) as the next plan is asked for: a look-ahead that
        stops at a segment or a close leaves the planner where that plan was made.
        """
        planner, retained = self.planner, self.retained
        step = batch.start if step is None else step
        while step < batch.end:
            if planner.window is None:
                self.open(step)
            for plan in self.segments(batch, step):
                yield Planned(index, plan, tuple(retained()))
            step = plan.end
            if plan.closes_window:
                yield from self._planned_close(step, batch.stream_continues(step), index)

    def open(self, step: int, number: int | None = None) -> None:
        """Open the window that starts at ``step``: window ``number`` of the run (from 1), by default the next."""
        self.windows = self.windows + 1 if number is None else number
        self.planner.open_window(step, self.windows)

    def segments(self, batch: BatchPlan, step: int) -> Iterator[SegmentPlan]:
        """The open window's segments from ``step`` of ``batch`` on: up to the one that closes it, or the batch's end.

        Each is planned once the one before has run: the trainer runs each as it is given.
        """
        planner, one_window_per_step = self.planner, self.one_window_per_step
        while step < batch.end:
            plan = planner.segment(step, batch, one_window_per_step)
            yield plan
            if plan.closes_window:
                return
            step = plan.end

    def close(self, end: int, stream_continues: bool) -> ClosePlan:
        """The plan that closes the open window at ``end``, from the retained segments as they are now.

        The window stays open until the plan is carried out (:meth:`closed`): a checkpoint taken where its backward
        sweep failed resumes with it open.
        """
        return self.planner.close(end, stream_continues, self.retained())

    def closed(self, plan: ClosePlan) -> None:
        """The window ``plan`` closes is closed, its backward pass done: the next opens where it ended."""
        self.planner.closed(plan)

    def _planned_close(self, end: int, stream_continues: bool, index: int) -> Iterator[Planned]:
        plan = self.close(end, stream_continues)
        yield Planned(index, plan, tuple(self.retained()))
        self.closed(plan)
