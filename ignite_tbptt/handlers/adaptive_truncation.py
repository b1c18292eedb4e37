"""Adaptive truncation: k2 follows the measured decay of the hidden-state gradient.

Aicher, Foti & Fox (2019), "Adaptively truncating backpropagation through time to control gradient bias"
(UAI): the gradient of a loss with respect to the hidden state ``k`` steps back decays roughly geometrically,
``|dL/dh_{t-k}| ~ C beta^k`` with ``beta < 1``; truncating a loss's backward pass after ``K`` steps then
drops a fraction of about ``beta^K`` of its gradient, the relative bias, and choosing the smallest ``K`` with
``beta^K <= delta`` bounds it by ``delta``. In TBPTT(k1, k2) the losses of a window reach back ``k2`` steps
(its last step) down to ``k2 - k1 + 1`` (its first), so bounding the bias of every loss of a full window
asks for ``beta ** (k2 - k1 + 1) <= delta``. Here ``beta`` is estimated from the gradient reach of recorded
windows (:class:`~ignite_tbptt.GradientReach`): the slope of the log norm against the lag between each
window's start and its cut, a median over the last few recorded windows. Aicher et al. measure the decay
from a single loss; inside a window each step back also adds a step's loss to the gradient, so only the
steps between a window's start and its cut, which add none, show the decay alone. The ratio of the norm at
the cut to the norm at the window's start, ``beta ** (k2 - k1)``, is about what TensorBoard shows as
``train/reach_at_cut``.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections import deque
from typing import Any

from ignite.engine import Engine

from ..checks import positive_int
from ..engine import TBPTTProcessFunction, tbptt_state
from ..planning import RandomWindows, Schedule, Window, WindowSource, k2_cut

__all__ = ["AdaptiveTruncation"]


class AdaptiveTruncation(WindowSource):
    """Handler that chooses k2 as the run goes, so that the estimated truncation bias stays under ``delta``.

    Attach it to a trainer: ``AdaptiveTruncation(delta=0.01, k2_min=30, k2_max=200).attach(trainer)``. The
    trainer keeps its windows (every ``k1`` steps, or :class:`~ignite_tbptt.RandomWindows`'s lengths) and
    this handler decides their cuts from then on; the trainer's own ``k2`` is no longer used. It records
    the gradient reach of every ``every``-th window (as ``GradientReach(every)``, and also those any attached
    ``GradientReach`` records; the profile is in ``engine.state.gradient_reach``), estimates the geometric
    decay rate ``beta`` per step of the hidden-state gradient from the last ``memory`` recorded windows, and
    sets k2 to the smallest value with ``beta ** (k2 - k1 + 1) <= delta``, within ``[k2_min, k2_max]``: the
    first step of a window, whose loss reaches back the least, ``k2 - k1 + 1`` steps, then loses about a
    fraction ``delta`` of its gradient.
    A window's cut follows SPEC.md's rule for k2 >= k1, ``start - (k2 - k1)``, with the k2 of when the window
    was planned: a new k2 applies to windows not yet planned, and cuts never move backwards (a k2 that grows
    by more than k1 reaches its new length over the following windows). The retained history never reaches
    more than ``k2_max`` steps back from the end of a window of length ``k1``.

    ``engine.state.k2`` holds the current k2 (logged by :func:`~ignite_tbptt.attach_tensorboard` as
    ``train/k2``). The handler's state (k2, the recent estimates, the planned windows) is part of the
    trainer's ``state_dict``, so a checkpoint of the trainer resumes it; the handler's own
    :meth:`state_dict` gives the same. Attach it before the run, and before ``attach_tensorboard`` for its
    hyper-parameters to be recorded.

    Args:
        delta: the largest relative bias accepted, in (0, 1).
        k2_min: the shortest k2; more than the trainer's ``k1``, so that a recorded window's profile has two
            points (its start and its cut) to measure the decay between.
        k2_max: the longest k2, which bounds the retained history.
        every: record the reach of every ``every``-th window.
        k2: k2 to start with; default ``k2_min``.
        memory: recorded windows the estimate is the median over.

    Raises:
        TypeError: if ``k2_min``, ``k2_max``, ``every``, ``k2`` or ``memory`` is not an int, or (from
            :meth:`attach`) the engine is not a TBPTT trainer with fixed or random windows.
        ValueError: if ``delta`` is not in (0, 1), ``k2_max < k2_min``, a count is not positive, ``k2`` lies
            outside ``[k2_min, k2_max]``, or (from :meth:`attach`) ``k2_min`` does not exceed the trainer's k1.

    Examples:
        >>> import torch
        >>> from ignite_tbptt import AdaptiveTruncation, create_tbptt_trainer
        >>> model = torch.nn.GRU(1, 4)
        >>> trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                lambda y_pred, y: (y_pred[..., :1] - y).pow(2).mean(), k1=3)
        >>> adaptive = AdaptiveTruncation(delta=0.1, k2_min=4, k2_max=12, every=1).attach(trainer)
        >>> x = torch.randn(30, 2, 1)
        >>> 4 <= trainer.run([(x, x)]).k2 <= 12
        True
    """

    standalone = False  # it plans the cuts of the trainer's own windows: attach(trainer), not k1=

    def __init__(
        self,
        delta: float,
        k2_min: int,
        k2_max: int,
        *,
        every: int = 10,
        k2: int | None = None,
        memory: int = 10,
    ) -> None:
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be a relative bias in (0, 1), got {delta!r}.")
        self.k2_min: int = positive_int("k2_min", k2_min, "a number of time steps")
        self.k2_max: int = positive_int("k2_max", k2_max, "a number of time steps")
        self.every: int = positive_int("every", every, "windows between recordings")
        self.memory: int = positive_int("memory", memory, "recorded windows")
        if k2_max < k2_min:
            raise ValueError(f"k2_max must be at least k2_min, got {k2_max} < {k2_min}.")
        self.k2: int = k2_min if k2 is None else positive_int("k2", k2, "a number of time steps")
        if not k2_min <= self.k2 <= k2_max:
            raise ValueError(f"k2 must lie in [k2_min, k2_max] = [{k2_min}, {k2_max}], got {self.k2}.")
        self.delta: float = delta
        self.rates: deque[float] = deque(maxlen=memory)  # log of the decay per step, one per recorded window
        self.base: Schedule | RandomWindows | None = None  # the trainer's own source: its windows, this one's cuts
        self._planned: dict[int, tuple[int, int]] = {}  # window start -> (k2 it was planned with, lowest cut)
        self._last_cut: int = 0

    def attach(self, engine: Engine) -> AdaptiveTruncation:
        """Decide the cuts of ``engine``'s windows from its next stream on; returns ``self``.

        Raises:
            TypeError: if ``engine`` is not a TBPTT trainer, or its windows come from another source than
                fixed ``k1`` or :class:`~ignite_tbptt.RandomWindows`.
            ValueError: if ``k2_min`` does not exceed the trainer's k1.
            RuntimeError: if the trainer is inside a stream (attach before the run, or between epochs).
        """
        step = TBPTTProcessFunction.of(engine, "AdaptiveTruncation")
        windows = step.window_source
        if not isinstance(windows, (Schedule, RandomWindows)):
            raise TypeError(
                "AdaptiveTruncation chooses k2 for a trainer with fixed windows (k1=...) or RandomWindows; this "
                f"trainer's windows come from {type(windows).__name__}."
            )
        if self.k2_min <= windows.k1:
            raise ValueError(
                f"k2_min must exceed the trainer's k1 ({self.k2_min} <= {windows.k1}): the decay is measured "
                "between a window's start and its cut, which coincide when k2 = k1. Use k2_min > k1."
            )
        self.base = windows
        step.use_source(self)
        return self

    @property
    def k1(self) -> int:
        """The trainer's k1 (its base window length for random windows)."""
        return self._base().k1

    def _base(self) -> Schedule | RandomWindows:
        if self.base is None:
            raise TypeError("AdaptiveTruncation is a handler: AdaptiveTruncation(...).attach(trainer).")
        return self.base

    # -- the window source ------------------------------------------------------------------------------------
    def window(self, start: int) -> Window:
        """The trainer's window starting at ``start``, with the cut of the k2 current on the first request."""
        end = self._base().window(start).end
        if start not in self._planned:
            self._planned[start] = (self.k2, self._last_cut)
        cut = self.cut(start, end)
        self._last_cut = max(self._last_cut, cut)
        return Window(start, end, cut)

    def cut(self, start: int, end: int) -> int:
        """SPEC.md's cut (:func:`~ignite_tbptt.planning.k2_cut`) for the k2 the window was planned with.

        ``start - (k2 - k1)``, since k2 exceeds k1, never before the stream's start nor an earlier window's cut.
        """
        k2, lowest = self._planned.get(start, (self.k2, self._last_cut))
        return max(lowest, k2_cut(self.k1, k2, start, end))

    def reset(self) -> None:
        """A new stream: forget its planned windows; k2 and the estimate go on."""
        self._planned.clear()
        self._last_cut = 0
        self._base().reset()

    def state_dict(self) -> dict[str, Any]:
        """k2, the recent decay estimates, the windows planned in the current stream and the trainer's windows."""
        return {
            "k2": self.k2,
            "rates": list(self.rates),
            "planned": dict(self._planned),
            "last_cut": self._last_cut,
            "windows": {} if self.base is None else self.base.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state."""
        if state:
            self.k2, self._last_cut = state["k2"], state["last_cut"]
            self.rates = deque(state["rates"], maxlen=self.memory)
            self._planned = {start: tuple(v) for start, v in state["planned"].items()}
            if self.base is not None:
                self.base.load_state_dict(state.get("windows", {}))

    def hparams(self) -> dict[str, Any]:
        """The trainer's window hyper-parameters but its k2, then delta, the bounds of k2 and the recording period."""
        windows = {} if self.base is None else self.base.hparams()
        windows.pop("k2", None)
        return {**windows, "delta": self.delta, "k2_min": self.k2_min, "k2_max": self.k2_max, "every": self.every}

    # -- learning from the run ----------------------------------------------------------------------------------
    def connect(self, engine: Engine, step: TBPTTProcessFunction) -> None:
        """Record the reach of every ``every``-th window of ``engine``."""
        step.record_reach(self.every)
        tbptt_state(engine).k2 = self.k2

    def observe(self, engine: Engine) -> None:
        """Update the decay estimate and k2 from the window just completed, if its reach was recorded."""
        state = tbptt_state(engine)
        reach, bounds = state.gradient_reach, state.window_bounds
        assert bounds is not None, "set by the trainer before a window's handlers run"
        start, end, _ = bounds
        # Only lags at or past the window's start: closer to its end, each step back adds a step's loss.
        points = [(lag, math.log(norm)) for lag, norm in (reach or {}).items() if norm > 0 and lag >= end - start]
        if len(points) >= 2:
            # Least-squares slope of log norm against lag: the log of the decay per step.
            mean_lag = statistics.fmean(lag for lag, _ in points)
            mean_log = statistics.fmean(value for _, value in points)
            spread = sum((lag - mean_lag) ** 2 for lag, _ in points)
            self.rates.append(sum((lag - mean_lag) * (v - mean_log) for lag, v in points) / spread)
            self.k2 = self.choose(statistics.median(self.rates))
        state.k2 = self.k2

    def choose(self, log_rate: float) -> int:
        """The smallest k2 in ``[k2_min, k2_max]`` with ``exp(log_rate) ** (k2 - k1 + 1) <= delta``.

        Args:
            log_rate: the log of the decay per step of the hidden-state gradient, ``log(beta)``.

        Raises:
            TypeError: before :meth:`attach` (k1 comes from the trainer).
        """
        if log_rate >= 0:  # no decay measured: reach as far as allowed
            return self.k2_max
        reach = math.ceil(math.log(self.delta) / log_rate)  # steps back the first step's loss needs
        return min(self.k2_max, max(self.k2_min, self.k1 - 1 + reach))
