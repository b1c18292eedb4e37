"""Unbiased truncation: Anticipated Reweighted Truncated Backpropagation (ARTBP) as a window source.

Tallec & Ollivier 2017, "Unbiasing Truncated Backpropagation Through Time" (arXiv:1705.08209), section 3.
Truncation may happen at *candidate points* every ``grid`` steps of the stream; at each one it happens with
probability ``c``, drawn independently. The windows are the stretches between consecutive truncation points,
each backpropagated back to its own start. Where a candidate point ``p`` strictly inside a window was passed
without truncating, the hidden-state gradient crossing ``p`` is multiplied by ``1 / (1 - c_p)``: a dependency that
crosses ``m`` such points reaches the gradient with probability ``prod(1 - c)``, times ``prod(1 / (1 - c))``, so
that with the parameters held fixed the expected sum of the windows' gradients is the full-BPTT gradient of the
stream's summed loss. SPEC.md, "Unbiased truncation (ARTBP)", fixes these semantics.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable
from typing import Any, ClassVar

from ..checks import positive_int
from .window import Window, WindowSource

__all__ = ["ARTBP"]

_LONGEST = 10**6  # steps a window may be drawn over before c is taken to never truncate


class ARTBP(WindowSource):
    """Windows that end at random candidate points, with compensation factors that make the gradient unbiased.

    Pass it as ``k1``: ``create_tbptt_trainer(model, optimizer, loss_fn, ARTBP(grid=25, mean_length=50))``. A
    candidate point lies every ``grid`` steps of the stream (``grid=1`` is the paper's per-step form; ``grid=k``
    keeps fused model calls of ``k`` steps). At each, counted from the window's start, truncation happens with
    probability ``c(steps)``:

    - ``mean_length=L``: the constant ``c = grid / L``, so that window lengths are ``grid`` times a geometric
      number of cells, of mean ``L`` steps;
    - ``c=0.1``: a constant probability;
    - ``c=lambda steps: ...``: any probability of the steps since the window's start, in [0, 1].

    ``max_length`` forces a truncation (``c = 1``) at the first candidate point that many steps after a window's
    start: the memory of the retained history is then bounded, at the price of the bias for dependencies that
    cross it. The stream's start and end and, per column, each sequence start (its reset cuts the gradient)
    always truncate. A window's cut is its own start, so no backward pass reaches into an earlier window.

    The draws come from a ``random.Random`` seeded with ``seed``, in the order the trainer asks for windows, and
    are kept per window start until the stream ends; :meth:`state_dict` saves the generator and the drawn
    windows, so a resumed run draws what the uninterrupted one drew. After each window, ``engine.state.
    compensation`` holds ``{point: factor}`` for the candidate points it passed, and ``engine.state.window_bounds``
    its ``(start, end, cut)``: enough to rebuild its gradient by hand.

    Args:
        grid: steps between candidate points.
        c: truncation probability, a number in (0, 1) or a callable of the steps since the window's start.
        mean_length: instead of ``c``, the mean window length in steps (at least ``grid``).
        max_length: force a truncation this many steps after a window's start (or the next candidate point).
        seed: seed of the draws; default: drawn from the operating system.

    Raises:
        TypeError: if ``grid``, ``mean_length`` or ``max_length`` is not an int, or ``c`` neither a number nor a
            callable.
        ValueError: if they are not positive, both or neither of ``c`` and ``mean_length`` are given, a constant
            ``c`` lies outside (0, 1), or ``mean_length < grid``. During a run, if a callable ``c`` returns a
            value outside [0, 1], or 0 for a million steps.

    Examples:
        >>> source = ARTBP(grid=5, mean_length=20, seed=0)
        >>> first = source.window(0)
        >>> first.cut == first.start == 0 and first.end % 5 == 0
        True
        >>> all(p % 5 == 0 and factor == 1 / (1 - 0.25) for p, factor in source.compensation(0).items())
        True
    """

    #: The gradient crossing a candidate point is reweighted inside the sweep (the compensation).
    reweights: ClassVar[bool] = True

    def __init__(
        self,
        grid: int = 1,
        c: float | Callable[[int], float] | None = None,
        *,
        mean_length: int | None = None,
        max_length: int | None = None,
        seed: int | None = None,
    ) -> None:
        self.grid = positive_int("grid", grid, "steps between candidate points")
        if (c is None) == (mean_length is None):
            raise ValueError("give the truncation probability c or the mean window length mean_length, one of them.")
        if mean_length is not None:
            mean_length = positive_int("mean_length", mean_length, "steps")
            if mean_length < self.grid:
                raise ValueError(f"mean_length must be at least grid ({self.grid}) steps, got {mean_length}.")
            c = self.grid / mean_length
        if not callable(c):
            if isinstance(c, bool) or not isinstance(c, (int, float)):
                raise TypeError(f"c must be a probability or a callable of the steps, got {type(c).__name__}.")
            if not 0.0 < c < 1.0:
                raise ValueError(
                    f"c must lie in (0, 1), got {c!r}: c = 0 never truncates, and c = 1 everywhere would be fixed "
                    "windows of grid steps."
                )
        self.c, self.mean_length = c, mean_length
        self.max_length = None if max_length is None else positive_int("max_length", max_length, "steps")
        self.seed = seed
        self._random = random.Random(seed)
        self._drawn: dict[int, tuple[int, list[int], list[float]]] = {}  # start -> (end, points passed, factors)

    def probability(self, steps: int) -> float:
        """The truncation probability at a candidate point ``steps`` after the window's start.

        Raises:
            ValueError: if a callable ``c`` returns a value outside [0, 1].
        """
        if self.max_length is not None and steps >= self.max_length:
            return 1.0
        if not callable(self.c):
            return float(self.c)
        value = float(self.c(steps))
        if not 0.0 <= value <= 1.0 or math.isnan(value):
            raise ValueError(f"c({steps}) returned {value!r}; a truncation probability lies in [0, 1].")
        return value

    def _draw(self, start: int) -> tuple[int, list[int], list[float]]:
        if start not in self._drawn:
            points: list[int] = []
            factors: list[float] = []
            point = (start // self.grid + 1) * self.grid  # the first candidate point after the start
            while True:
                c = self.probability(point - start)
                if c >= 1.0 or self._random.random() < c:
                    break
                if c > 0.0:  # a point that could not truncate needs no compensation, and no segment boundary
                    points.append(point)
                    factors.append(1.0 / (1.0 - c))
                point += self.grid
                if point - start > _LONGEST:
                    raise ValueError(f"no truncation within {_LONGEST:,} steps: c(steps) must not stay at 0.")
            self._drawn[start] = (point, points, factors)
        return self._drawn[start]

    def window(self, start: int) -> Window:
        """The window from ``start`` to the next truncation point, drawn on the first request."""
        return Window(start, self._draw(start)[0], start)

    def cut(self, start: int, end: int) -> int:
        """A window reaches back to its own start."""
        return start

    def compensation(self, start: int) -> dict[int, float]:
        """``{point: 1 / (1 - c_point)}`` for the candidate points the window from ``start`` passes."""
        _, points, factors = self._draw(start)
        return dict(zip(points, factors))

    @property
    def spans_windows(self) -> bool:
        """No backward pass reaches into an earlier window."""
        return False

    def boundary(self, window: Window, step: int, stream_end: int | None = None) -> int:
        """The next compensated candidate point after ``step``, or the window's end: one model call between."""
        end = window.end if stream_end is None else min(window.end, stream_end)
        points = self._draw(window.start)[1]
        following = bisect_right(points, step)
        return min(points[following], end) if following < len(points) else end

    def reaches_back(self, window: Window, step: int) -> bool:
        """No later window reaches into this one."""
        return False

    def reset(self) -> None:
        """A new stream: forget its windows; the generator goes on."""
        self._drawn.clear()

    def observe(self, engine: Any) -> None:
        """Record the compensation factors of the window just completed in ``engine.state.compensation``."""
        start, end, _ = engine.state.window_bounds
        engine.state.compensation = {p: f for p, f in self.compensation(start).items() if p < end}

    def state_dict(self) -> dict[str, Any]:
        """The generator's state and the windows drawn in the current stream."""
        drawn = {start: [end, list(points), list(factors)] for start, (end, points, factors) in self._drawn.items()}
        return {"random": self._random.getstate(), "drawn": drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s draws."""
        if state:
            version, internal, gauss_next = state["random"]
            self._random.setstate((version, tuple(internal), gauss_next))
            self._drawn = {start: (end, list(p), list(f)) for start, (end, p, f) in state["drawn"].items()}

    def hparams(self) -> dict[str, Any]:
        """``grid``, ``c`` (its name if callable), ``mean_length`` and ``max_length`` (0 if none), ``seed``."""
        c = getattr(self.c, "__name__", "callable") if callable(self.c) else self.c
        return {
            "grid": self.grid,
            "c": c,
            "mean_length": self.mean_length or 0,
            "max_length": self.max_length or 0,
            "seed": -1 if self.seed is None else self.seed,
        }
