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

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["Window", "WindowSource"]


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

    #: Whether the source can be passed to the trainer as ``k1``; a source that plans the cuts of the trainer's own
    #: windows (:class:`~ignite_tbptt.AdaptiveTruncation`) attaches to it as a handler instead.
    standalone: ClassVar[bool] = True

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

    #: Whether every window has one length (but where the stream ends): reaching back (``spans_windows``), the cuts
    #: then fall at a few places inside earlier windows, so that the windows have a few shapes.
    fixed_length: ClassVar[bool] = False
    #: Whether the backward sweep reweights the gradient crossing some steps (ARTBP's compensation).
    reweights: ClassVar[bool] = False

    @property
    def cuts_inside_windows(self) -> bool:
        """Whether a window's cut may fall after its start (k2 < k1): the steps before it get their own loss only."""
        return False

    @property
    def allows_programs(self) -> bool:
        """Whether the windows may run as programs (``cuda_graphs``), from what the source states of them.

        A program runs a window whose every step gets the gradient of the whole window (no cut inside it), not
        reweighted inside the sweep, and, where windows reach back into earlier ones, windows of a few shapes (one
        length). A source says so through :attr:`fixed_length`, :attr:`reweights`, :attr:`cuts_inside_windows` and
        :attr:`spans_windows`; nothing else decides.
        """
        return not self.reweights and not self.cuts_inside_windows and (self.fixed_length or not self.spans_windows)

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
