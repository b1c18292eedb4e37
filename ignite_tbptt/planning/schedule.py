"""The fixed TBPTT(k1, k2) windows: a window every ``k1`` steps, reaching ``k2`` steps back.

Sources: Williams & Peng (1990), Neural Computation 2(4), the BPTT(h; h') algorithm; Sutskever (2013), PhD thesis,
University of Toronto, section 2.8.6. The cut rule is SPEC.md's, shared with :class:`~ignite_tbptt.RandomWindows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..checks import positive_int
from .window import Window, WindowSource

__all__ = ["Schedule", "K2Rule", "k2_cut"]


def k2_cut(k1: int, k2: int, start: int, end: int) -> int:
    """SPEC.md's cut of the window ``[start, end)`` under TBPTT(k1, k2): the first step its backward pass reaches.

    For ``k2 >= k1`` the cut lies ``k2 - k1`` steps before the window's start, never before the stream's start (a
    full window of ``k1`` steps reaches ``k2`` steps back from its end, a shorter one as far before its start); for
    ``k2 < k1`` it lies ``k2`` steps before the window's end, never before its start (Williams & Peng 1990, BPTT(h;
    h'), with h = k2 and h' = k1; Sutskever 2013, section 2.8.6). Every source with a k2 rule applies this one.

    Args:
        k1: steps between two backward passes.
        k2: steps a full window's backward pass reaches back from its end.
        start: first step of the window.
        end: its end (exclusive).

    Returns:
        The cut, ``0 <= cut < end`` for a window of at least one step.

    Examples:
        >>> k2_cut(2, 5, 6, 8), k2_cut(2, 5, 2, 4), k2_cut(5, 2, 0, 5), k2_cut(5, 2, 10, 11)
        (3, 0, 3, 10)
    """
    if k2 >= k1:
        return max(0, start - (k2 - k1))
    return max(start, end - k2)


class K2Rule:
    """SPEC.md's cut for a window's own start and end, for sources with a ``k1`` and a ``k2``."""

    k1: int
    k2: int

    def cut(self, start: int, end: int) -> int:
        """Cut of the window ``[start, end)``: the first step its backward pass reaches (:func:`k2_cut`).

        ``start - (k2 - k1)``, never before the stream's start, for ``k2 >= k1``; ``max(start, end - k2)`` for
        ``k2 < k1``.
        """
        return k2_cut(self.k1, self.k2, start, end)

    @property
    def spans_windows(self) -> bool:
        """Only k2 > k1 reaches into earlier windows."""
        return self.k2 > self.k1

    @property
    def cuts_inside_windows(self) -> bool:
        """Only k2 < k1 cuts inside a window: ``k2`` steps before its end."""
        return self.k2 < self.k1


@dataclass(frozen=True)
class Schedule(K2Rule, WindowSource):
    """The windows and cuts of TBPTT(k1, k2): a window every ``k1`` steps, reaching ``k2`` steps back.

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
        >>> s.window(6)
        Window(start=6, end=8, cut=3)
        >>> Schedule(k1=5, k2=2).cut(0, 5)
        3
    """

    k1: int
    k2: int
    #: Every window is ``k1`` steps long but the stream's last.
    fixed_length: ClassVar[bool] = True

    def __post_init__(self) -> None:
        positive_int("k1", self.k1, "a number of time steps")
        positive_int("k2", self.k2, "a number of time steps")

    def window(self, start: int) -> Window:
        """The full window that starts at ``start``: ``[start, start + k1)`` and its cut."""
        end = start + self.k1
        return Window(start, end, self.cut(start, end))

    def boundary(self, window: Window, step: int, stream_end: int | None = None) -> int:
        """:meth:`WindowSource.boundary` in closed form: later cuts lie ``k2 - k1`` before their windows' starts.

        The general rule walks the later windows one by one, ``k2 / k1`` of them per segment (eight at k1 = 1,
        k2 = 8); here the first later cut past ``step`` is computed directly.
        """
        end = window.end if stream_end is None else min(window.end, stream_end)
        if step < self.cut(window.start, end):  # k2 < k1: each step before the cut alone
            return step + 1
        if self.k2 <= self.k1 or end == stream_end:
            return end  # no later window reaches back into this one
        reach = self.k2 - self.k1
        # The window starting `later * k1` after this one has its cut at start + later * k1 - reach.
        later = (step - window.start + reach) // self.k1 + 1
        cut = window.start + later * self.k1 - reach
        return min(cut, end)

    def window_end(self, start: int, stream_end: int | None = None) -> int:
        """End (exclusive) of the window starting at ``start``; ``stream_end`` is ``None`` while unknown."""
        end = start + self.k1
        return end if stream_end is None else min(end, stream_end)

    def hparams(self) -> dict[str, Any]:
        """``{"k1": k1, "k2": k2}``."""
        return {"k1": self.k1, "k2": self.k2}
