"""Adaptive truncation: k2 follows the measured decay of the hidden-state gradient.

Aicher, Foti & Fox (2019), "Adaptively truncating backpropagation through time to control gradient bias"
(UAI): the gradient of a loss with respect to the hidden state ``k`` steps back decays roughly geometrically,
``|dL/dh_{t-k}| ~ C beta^k`` with ``beta < 1``; truncating after ``K`` steps then drops a fraction of about
``beta^K`` of the gradient, the relative bias. Choosing the smallest ``K`` with ``beta^K <= delta`` bounds
it by ``delta``. Here ``beta`` is estimated from the gradient reach of recorded windows
(:class:`~ignite_tbptt.GradientReach`): the slope of the log norm against the lag between each window's
start and its cut, a median over the last few recorded windows.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import TYPE_CHECKING, Any

from ignite.engine import Engine

from .checks import positive_int
from .events import TBPTTEvents
from .schedule import Window, WindowSource

if TYPE_CHECKING:
    from .loop import TBPTTStep

__all__ = ["AdaptiveTruncation"]


class AdaptiveTruncation(WindowSource):
    """TBPTT(k1, k2) whose k2 is chosen as the run goes, so that the estimated truncation bias stays under ``delta``.

    Pass it in place of ``k1``: ``create_tbptt_trainer(model, optimizer, loss_fn, AdaptiveTruncation(...))``.
    It records the gradient reach of every ``every``-th window (as ``GradientReach(every)``; the profile is
    in ``engine.state.gradient_reach``), estimates the geometric decay rate ``beta`` per step of the
    hidden-state gradient from the last ``memory`` recorded windows, and sets k2 to the smallest value with
    ``beta ** k2 <= delta``, within ``[k2_min, k2_max]``. A new k2 applies to windows not yet planned: a
    window keeps the cut it was planned with, and cuts never move backwards (a k2 that grows by more than k1
    reaches its new length over the following windows). The retained history never reaches more than
    ``k2_max`` steps back from a window's end. ``engine.state.k2`` holds the current k2; the state (k2, the
    recent estimates and the planned windows) is part of the trainer's ``state_dict``.

    Args:
        k1: steps between backward passes (window length).
        delta: the largest relative bias accepted, in (0, 1).
        k2_min: the shortest k2; more than ``k1``, so that a recorded window's profile has two points (its
            start and its cut) to measure the decay between.
        k2_max: the longest k2, which bounds the retained history.
        every: record the reach of every ``every``-th window.
        k2: k2 to start with; default ``k2_min``.
        memory: recorded windows the estimate is the median over.

    Raises:
        TypeError: if ``k1``, ``k2_min``, ``k2_max``, ``every``, ``k2`` or ``memory`` is not an int.
        ValueError: if ``delta`` is not in (0, 1), ``k2_min <= k1``, ``k2_max < k2_min``, a count is not
            positive, or ``k2`` lies outside ``[k2_min, k2_max]``.
    """

    def __init__(
        self,
        k1: int,
        delta: float,
        k2_min: int,
        k2_max: int,
        *,
        every: int = 10,
        k2: int | None = None,
        memory: int = 10,
    ) -> None:
        self.k1 = positive_int("k1", k1, "a number of time steps")
        self.k2_min = positive_int("k2_min", k2_min, "a number of time steps")
        self.k2_max = positive_int("k2_max", k2_max, "a number of time steps")
        self.every = positive_int("every", every, "windows between recordings")
        self.memory = positive_int("memory", memory, "recorded windows")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be a relative bias in (0, 1), got {delta!r}.")
        if k2_min <= k1:
            raise ValueError(
                f"k2_min must exceed k1 ({k2_min} <= {k1}): the decay is measured between a window's start and its "
                "cut, which coincide when k2 = k1."
            )
        if k2_max < k2_min:
            raise ValueError(f"k2_max must be at least k2_min, got {k2_max} < {k2_min}.")
        self.k2 = k2_min if k2 is None else positive_int("k2", k2, "a number of time steps")
        if not k2_min <= self.k2 <= k2_max:
            raise ValueError(f"k2 must lie in [k2_min, k2_max] = [{k2_min}, {k2_max}], got {self.k2}.")
        self.delta = delta
        self.rates: deque[float] = deque(maxlen=memory)  # log of the decay per step, one per recorded window
        self._planned: dict[int, tuple[int, int]] = {}  # window start -> (k2 it was planned with, lowest cut)
        self._last_cut = 0

    # -- the window source ------------------------------------------------------------------------------------
    def window(self, start: int) -> Window:
        """The window starting at ``start``, planned with the current k2 on the first request."""
        if start not in self._planned:
            self._planned[start] = (self.k2, self._last_cut)
        end = start + self.k1
        cut = self.cut(start, end)
        self._last_cut = max(self._last_cut, cut)
        return Window(start, end, cut)

    def cut(self, start: int, end: int) -> int:
        """``start - (k2 - k1)`` for the k2 the window was planned with, never before an earlier window's cut."""
        k2, lowest = self._planned.get(start, (self.k2, self._last_cut))
        return max(lowest, start - (k2 - self.k1), 0)

    def reset(self) -> None:
        """A new stream: forget its planned windows; k2 and the estimate go on."""
        self._planned.clear()
        self._last_cut = 0

    def state_dict(self) -> dict[str, Any]:
        """k2, the recent decay estimates and the windows planned in the current stream."""
        return {"k2": self.k2, "rates": list(self.rates), "planned": dict(self._planned), "last_cut": self._last_cut}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state."""
        if state:
            self.k2, self._last_cut = state["k2"], state["last_cut"]
            self.rates = deque(state["rates"], maxlen=self.memory)
            self._planned = {start: tuple(v) for start, v in state["planned"].items()}

    def hparams(self) -> dict[str, Any]:
        """k1, delta, the bounds of k2 and the recording period."""
        return {"k1": self.k1, "delta": self.delta, "k2_min": self.k2_min, "k2_max": self.k2_max, "every": self.every}

    # -- learning from the run ----------------------------------------------------------------------------------
    def attach(self, engine: Engine, step: TBPTTStep) -> None:
        """Record the reach of every ``every``-th window of ``engine`` and update k2 after each."""
        step.reach_every = self.every
        engine.state.k2 = self.k2
        engine.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, self._observe)

    def _observe(self, engine: Engine) -> None:
        reach = engine.state.gradient_reach
        points = [(lag, math.log(norm)) for lag, norm in (reach or {}).items() if norm > 0]
        if len(points) >= 2:
            # Least-squares slope of log norm against lag: the log of the decay per step.
            mean_lag = statistics.fmean(lag for lag, _ in points)
            mean_log = statistics.fmean(value for _, value in points)
            spread = sum((lag - mean_lag) ** 2 for lag, _ in points)
            self.rates.append(sum((lag - mean_lag) * (v - mean_log) for lag, v in points) / spread)
            self.k2 = self.choose(statistics.median(self.rates))
        engine.state.k2 = self.k2

    def choose(self, log_rate: float) -> int:
        """The smallest k2 in ``[k2_min, k2_max]`` with ``exp(log_rate) ** k2 <= delta``.

        Examples:
            >>> source = AdaptiveTruncation(10, delta=0.01, k2_min=20, k2_max=200)
            >>> source.choose(math.log(0.9)), source.choose(math.log(0.5)), source.choose(0.0)
            (44, 20, 200)
        """
        if log_rate >= 0:  # no decay measured: reach as far as allowed
            return self.k2_max
        return min(self.k2_max, max(self.k2_min, math.ceil(math.log(self.delta) / log_rate)))
