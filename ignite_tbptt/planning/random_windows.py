"""Windows of random length, as AWD-LSTM draws its BPTT lengths, with SPEC.md's cut for each window."""

from __future__ import annotations

import math
import random
from typing import Any

from ..checks import positive_int
from .schedule import K2Rule
from .window import Window, WindowSource

__all__ = ["RandomWindows"]


class RandomWindows(K2Rule, WindowSource):
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
