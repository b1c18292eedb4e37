"""Windows and cuts of TBPTT(k1, k2), free of torch.

Positions count steps from the start of the stream (0-based). A window is the half-open range of steps
``[start, end)`` between two backward passes; its cut is the step whose *input* hidden state the window's
backward pass treats as a constant, so gradient flows through the steps ``[cut, end)``.

A :class:`WindowSource` decides where each window of a stream ends and where its cut lies; the trainer's loop
asks it, window after window, and never computes a window itself. :class:`Schedule` is the fixed TBPTT(k1, k2)
source. Every source keeps three rules, on which the retained history relies: windows tile the stream, a
window's cut lies at or after the stream's start and before the window's end, and cuts never move backwards
from one window to the next.

Sources: Williams & Peng (1990), "An efficient gradient-based algorithm for on-line training of recurrent
network trajectories", Neural Computation 2(4), the BPTT(h; h') algorithm; Sutskever (2013), "Training
recurrent neural networks", PhD thesis, University of Toronto, section 2.8.6 ("every k1 timesteps, run BPTT
for k2 timesteps"). The exact contract lives in the project's SPEC.md.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from .checks import positive_int

__all__ = ["Window", "WindowSource", "Schedule", "RandomWindows"]


@dataclass(frozen=True)
class Window:
    """One window of a stream as its source plans it.

    Attributes:
        start: first step of the window.
        end: end (exclusive) of the window if the stream lasts that long; a stream that ends earlier ends the
            window with it, and :meth:`WindowSource.cut` then gives the cut of the shorter window.
        cut: first step the window's backward pass reaches, ``0 <= cut < end``.
    """

    start: int
    end: int
    cut: int


class WindowSource(ABC):
    """Where the windows of a stream end and where their cuts lie.

    The trainer asks :meth:`window` for the window that starts where the last one ended, and may ask for
    windows further ahead (as far as the retained history reaches); a source that draws at random must
    therefore give the same window for the same ``start`` until :meth:`reset`. Cuts must never move
    backwards: the cut of a later window is at or after the cut of an earlier one, which is what lets the
    trainer drop the segments that the next window does not reach.
    """

    @abstractmethod
    def window(self, start: int) -> Window:
        """The window that starts at ``start`` (the previous window's end), in a stream that outlasts it."""

    @abstractmethod
    def cut(self, start: int, end: int) -> int:
        """Cut of the window ``[start, end)``, also when the stream's end cuts the planned window short."""

    @property
    def spans_windows(self) -> bool:
        """Whether a backward pass may reach into earlier windows, so that graphs outlive optimizer steps."""
        return True

    def reset(self) -> None:
        """A new stream starts (at step 0); sources with per-stream state forget it here."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """The source's state, for resuming mid-stream; stateless sources return ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state."""
        return None

    def hparams(self) -> dict[str, Any]:
        """The source's hyper-parameters, for logging."""
        return {}

    def connect(self, engine: Any, step: Any) -> None:
        """Called when the trainer ``step`` attaches to ``engine``: sources that learn from the run hook in here."""
        return None

    def observe(self, engine: Any) -> None:
        """Called after each window's backward pass and optimizer step, before ``WINDOW_COMPLETED`` fires.

        ``engine.state`` holds the window's bounds, loss and (if recorded) gradient reach; a source that learns
        from the run updates itself here, so that every handler of the event sees the update.
        """
        return None

    def boundary(self, window: Window, step: int, stream_end: int | None = None) -> int:
        """End (exclusive) of the longest run of steps from ``step`` that one model call may cover.

        No end and no cut of any window falls strictly inside ``[step, segment_end)``: the window's end, the
        cut of each later window that reaches into this one (so that a later backward pass starts at a
        segment's input), and, for steps before this window's own cut (k2 < k1), the next step, since each
        such step's loss must not reach the step before it. While the stream's end is unknown, the cut of the
        full window is used, which covers any earlier cut a shorter last window could have.

        Args:
            window: the window that holds ``step``.
            step: first step of the segment.
            stream_end: length of the stream, or ``None`` while unknown.
        """
        end = window.end if stream_end is None else min(window.end, stream_end)
        if step < self.cut(window.start, end):
            return step + 1
        if (stream_end is not None and end == stream_end) or not self.spans_windows:
            return end  # no later window, or none that reaches back into this one
        later = window
        while True:  # cuts never move backwards, so the first cut at or past `end` ends the search
            later = self.window(later.end)
            if later.cut >= end:
                return end
            if later.cut > step:
                return later.cut

    def compensation(self, start: int) -> dict[int, float]:
        """Factors for the hidden-state gradient crossing steps inside the window from ``start``: ``{step: factor}``.

        Empty (no reweighting) but for unbiased truncation (:class:`~ignite_tbptt.ARTBP`); each such step is a
        segment boundary (:meth:`boundary`).
        """
        return {}

    def reaches_back(self, window: Window, step: int) -> bool:
        """Whether a later window's backward pass reaches back to ``step`` of ``window``.

        Only the next window needs asking: if it does not reach ``step``, no later one does.
        """
        return self.spans_windows and self.window(window.end).cut <= step


class _K2Rule:
    """SPEC.md's cut for a window's own start and end, for sources with a ``k1`` and a ``k2``."""

    k1: int
    k2: int

    def cut(self, start: int, end: int) -> int:
        """Cut of the window ``[start, end)``: the first step its backward pass reaches.

        ``start - (k2 - k1)``, never before the stream's start, for ``k2 >= k1``; ``max(start, end - k2)`` for
        ``k2 < k1``.
        """
        if self.k2 >= self.k1:
            return max(0, start - (self.k2 - self.k1))
        return max(start, end - self.k2)

    @property
    def spans_windows(self) -> bool:
        """Only k2 > k1 reaches into earlier windows."""
        return self.k2 > self.k1


@dataclass(frozen=True)
class Schedule(_K2Rule, WindowSource):
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

    def window_start(self, step: int) -> int:
        """First step of the window that contains ``step``."""
        return step - step % self.k1

    def window_end(self, start: int, stream_end: int | None = None) -> int:
        """End (exclusive) of the window starting at ``start``; ``stream_end`` is ``None`` while unknown."""
        end = start + self.k1
        return end if stream_end is None else min(end, stream_end)

    def segment_end(self, step: int, stream_end: int | None = None) -> int:
        """:meth:`WindowSource.boundary` of ``step`` in its window: at most two segments per window for k2 >= k1.

        Cuts repeat every ``k1`` steps, so they share one offset inside every window; for ``k2 < k1`` each step
        before the cut is a segment of its own.
        """
        return self.boundary(self.window(self.window_start(step)), step, stream_end)

    def reached_later(self, step: int, start: int) -> bool:
        """Whether the window after the one starting at ``start`` reaches back to ``step`` (only if k2 > k1)."""
        return self.reaches_back(self.window(start), step)

    def hparams(self) -> dict[str, Any]:
        """``{"k1": k1, "k2": k2}``."""
        return {"k1": self.k1, "k2": self.k2}


class RandomWindows(_K2Rule, WindowSource):
    """Windows of random length, as AWD-LSTM draws its BPTT lengths, with the k2 rule applied to each window.

    Each window's length is drawn when the trainer first asks for it (Merity, Keskar & Socher, 2018,
    "Regularizing and optimizing LSTM language models", ICLR, section 4.1): a base of ``k1`` with probability
    ``p``, else ``k1 / 2``, then ``max(min_length, round(N(base, std)))``; the last window ends with the stream.
    Varying the length moves every step, now and then, far from its window's start, so that no step always
    gets the short reach of a window's first steps. The cut follows SPEC.md's rule for the window's own start
    and end: ``start - (k2 - k1)`` (never before the stream's start) for ``k2 >= k1``, ``max(start, end - k2)``
    for ``k2 < k1``. Cuts never move backwards, as every source's must.

    The draws come from a ``random.Random`` seeded with ``seed``, in the order the trainer asks for windows;
    a new stream keeps drawing from the same generator (so each epoch gets other lengths), and
    :meth:`state_dict` holds the generator's state and the windows already drawn, so that a run resumed
    mid-stream draws what the uninterrupted run drew.

    Args:
        k1: base window length in steps.
        k2: steps a window of length ``k1`` reaches back from its end; default ``k1``.
        p: probability of the base ``k1`` (else ``k1 / 2``).
        std: standard deviation of the length in steps.
        min_length: shortest window in steps.
        seed: seed of the draws; default: drawn from the operating system.

    Raises:
        TypeError: if ``k1``, ``k2`` or ``min_length`` is not an int.
        ValueError: if ``k1``, ``k2`` or ``min_length`` is not positive, ``p`` is not in [0, 1] or ``std`` is
            negative, infinite or NaN.

    Examples:
        >>> source = RandomWindows(k1=70, k2=90, seed=0)
        >>> first = source.window(0)
        >>> second = source.window(first.end)
        >>> second.cut == second.start - 20, source.window(0) == first  # the same window for the same start
        (True, True)
    """

    def __init__(
        self,
        k1: int,
        k2: int | None = None,
        *,
        p: float = 0.95,
        std: float = 5.0,
        min_length: int = 5,
        seed: int | None = None,
    ) -> None:
        self.k1 = positive_int("k1", k1, "a number of time steps")
        self.k2 = k1 if k2 is None else positive_int("k2", k2, "a number of time steps")
        self.min_length = positive_int("min_length", min_length, "a number of time steps")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p!r}.")
        if not 0 <= std < math.inf:  # NaN fails too, and would only fail at the first window
            raise ValueError(f"std must be a finite, non-negative number of steps, got {std!r}.")
        self.p, self.std, self.seed = p, std, seed
        self._random = random.Random(seed)
        self._ends: dict[int, int] = {}  # window start -> end, for the windows drawn in this stream

    def window(self, start: int) -> Window:
        """The window that starts at ``start``, drawn on the first request and the same afterwards."""
        if start not in self._ends:
            base = self.k1 if self._random.random() < self.p else self.k1 / 2
            self._ends[start] = start + max(self.min_length, round(self._random.gauss(base, self.std)))
        end = self._ends[start]
        return Window(start, end, self.cut(start, end))

    def reset(self) -> None:
        """A new stream: forget its windows; the generator goes on."""
        self._ends.clear()

    def state_dict(self) -> dict[str, Any]:
        """The generator's state and the windows drawn in the current stream."""
        return {"random": self._random.getstate(), "ends": dict(self._ends)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s draws."""
        if state:
            version, internal, gauss_next = state["random"]
            self._random.setstate((version, tuple(internal), gauss_next))
            self._ends = dict(state["ends"])

    def hparams(self) -> dict[str, Any]:
        """The source's arguments (``seed`` -1 when drawn from the operating system)."""
        seed = -1 if self.seed is None else self.seed
        return {"k1": self.k1, "k2": self.k2, "p": self.p, "std": self.std, "min_length": self.min_length, "seed": seed}
