"""What a batch tells the planning of its segments, decided once per batch, free of torch.

A batch holds the steps ``[start, end)`` of its stream. Three things about it bound the segments planned inside it
(:func:`~ignite_tbptt.planning.plan_segment`): no segment passes the batch's end; the stream's end is known only in
the batch that ends the stream (the epoch's last batch, when the epoch's length is known, or every batch when each
batch is a stream of its own); and a segment also ends where some column starts a new sequence, so that the reset of
that column's hidden state falls between two model calls (SPEC.md, "Sequence starts"). A window closes at the
stream's end without a window after it, and anywhere else with one. The trainer's loop and
:func:`~ignite_tbptt.planning.walk` both take these rules from :func:`plan_batch`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["BatchPlan", "plan_batch"]


class BatchPlan(NamedTuple):
    """The steps of one batch and what bounds the segments inside it, in the stream's steps."""

    #: First step of the batch (the stream's position when it starts).
    start: int
    #: End (exclusive) of the batch: no segment passes it.
    end: int
    #: The stream's end if the batch ends the stream, else ``None`` (the stream goes on, or its length is unknown).
    stream_end: int | None
    #: The steps of the batch where some column starts a sequence, ascending.
    starts: tuple[int, ...]

    def next_start(self, step: int) -> int | None:
        """The first step after ``step`` where some column starts a sequence, or ``None``.

        A start at ``step`` itself is the reset before the segment from ``step``, so it does not end that segment.
        """
        starts = self.starts
        if not starts:
            return None
        following = bisect_right(starts, step)
        return starts[following] if following < len(starts) else None

    def stream_continues(self, end: int) -> bool:
        """Whether the stream goes on past ``end``, a step of the batch (a window closing there has a following one)."""
        return end != self.stream_end


def plan_batch(start: int, length: int, ends_stream: bool, start_steps: Iterable[int] = ()) -> BatchPlan:
    """Plan the batch of ``length`` steps that starts at step ``start`` of its stream.

    Args:
        start: the stream's position at the batch's first step.
        length: steps of the batch.
        ends_stream: the batch ends its stream: it is the epoch's last (with the epoch's length known), or every
            batch is a stream of its own (``carry_hidden=False``).
        start_steps: the steps of the batch, counted from its first (0), where some column starts a sequence, in
            any order.

    Returns:
        The batch's :class:`BatchPlan`.

    Examples:
        >>> batch = plan_batch(10, 5, ends_stream=False, start_steps=[3, 0])
        >>> batch.end, batch.stream_end, batch.starts
        (15, None, (10, 13))
        >>> batch.next_start(10), batch.next_start(13), batch.stream_continues(15)
        (13, None, True)
        >>> plan_batch(10, 5, ends_stream=True).stream_continues(15)
        False
    """
    end = start + length
    starts = tuple(sorted(start + t for t in start_steps)) if start_steps else ()
    return BatchPlan(start, end, end if ends_stream else None, starts)
