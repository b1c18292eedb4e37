"""Window and cut arithmetic of TBPTT(k1, k2), free of torch.

Positions count steps from the start of the stream (0-based). A window is the half-open range of steps
``[start, end)`` between two backward passes; its cut is the step whose *input* hidden state the window's
backward pass treats as a constant, so gradient flows through the steps ``[cut, end)``.

Sources: Williams & Peng (1990), "An efficient gradient-based algorithm for on-line training of recurrent
network trajectories", Neural Computation 2(4), the BPTT(h; h') algorithm; Sutskever (2013), "Training
recurrent neural networks", PhD thesis, University of Toronto, section 2.8.6 ("every k1 timesteps, run BPTT
for k2 timesteps"). The exact contract lives in the project's SPEC.md.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Schedule"]


def _check_length(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int (a number of time steps), got {type(value).__name__}.")
    if value < 1:
        raise ValueError(f"{name} must be a positive int (a number of time steps), got {value!r}.")
    return value


@dataclass(frozen=True)
class Schedule:
    """Where TBPTT(k1, k2) puts its windows and cuts along one stream.

    A window ends after every ``k1`` steps of the stream and at the end of the stream, so the last window
    may be shorter. For ``k2 >= k1`` the cut lies ``k2 - k1`` steps before the window's first step (a full
    window reaches ``k2`` steps back from its end), never before the stream's start. For ``k2 < k1`` the cut
    lies ``k2`` steps before the window's end, never before its start, and each step before the cut gets
    only the gradient of its own loss.

    Args:
        k1: steps between two backward passes (the forward length of a window).
        k2: steps a full window's backward pass reaches back from its end.

    Raises:
        TypeError: if ``k1`` or ``k2`` is not an int.
        ValueError: if ``k1`` or ``k2`` is not positive.

    Examples:
        >>> s = Schedule(k1=2, k2=5)
        >>> [(start, s.cut(start, start + 2)) for start in (0, 2, 4, 6)]
        [(0, 0), (2, 0), (4, 1), (6, 3)]
        >>> Schedule(k1=5, k2=2).cut(0, 5)
        3
    """

    k1: int
    k2: int

    def __post_init__(self) -> None:
        _check_length("k1", self.k1)
        _check_length("k2", self.k2)

    def window_start(self, step: int) -> int:
        """First step of the window that contains ``step``."""
        return step - step % self.k1

    def window_end(self, start: int, stream_end: int | None = None) -> int:
        """End (exclusive) of the window starting at ``start``; ``stream_end`` is ``None`` while unknown."""
        end = start + self.k1
        return end if stream_end is None else min(end, stream_end)

    def cut(self, start: int, end: int) -> int:
        """Cut of the window ``[start, end)``: the first step its backward pass reaches."""
        if self.k2 >= self.k1:
            return max(0, start - (self.k2 - self.k1))
        return max(start, end - self.k2)

    def segment_end(self, step: int, stream_end: int | None = None) -> int:
        """End (exclusive) of the longest run of steps from ``step`` that one model call may cover.

        No window end and no cut of any window falls strictly inside ``[step, segment_end)``. For
        ``k2 >= k1`` that leaves at most two segments per window (cuts repeat every ``k1`` steps, so they
        share one offset inside every window). For ``k2 < k1`` each step before the cut is its own segment,
        since its loss must not reach the step before it; while the stream's end is unknown, that is every
        step before the cut of a full window, which covers any earlier cut a shorter last window could have.

        Args:
            step: first step of the segment.
            stream_end: length of the stream, or ``None`` while unknown.
        """
        start = self.window_start(step)
        end = self.window_end(start, stream_end)
        if self.k2 >= self.k1:
            offset = (self.k2 - self.k1) % self.k1
            later_cut = start + self.k1 - offset
            return later_cut if offset and step < later_cut < end else end
        return step + 1 if step < self.cut(start, end) else end

    def reached_later(self, step: int, start: int) -> bool:
        """Whether the window after the one starting at ``start`` reaches back to ``step``.

        If it does not, no later window does: cuts only move forward. Only ``k2 > k1`` reaches back into
        earlier windows.
        """
        return self.k2 > self.k1 and step >= self.cut(start + self.k1, start + 2 * self.k1)
