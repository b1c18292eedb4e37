"""The truncations the study compares, built from one task's five window lengths.

Every task names five lengths ``ks = (a, b, c, d, e)``, short to long, scaled to its data (10 to 200 characters
for text). From them come, for every task alike:

- fixed windows with k1 = k2, at each of the five lengths: the classic TBPTT(k, k);
- k2 > k1 at the same k2: TBPTT(a, c) and TBPTT(b, c) against TBPTT(c, c), TBPTT(b, d) and TBPTT(c, d) against
  TBPTT(d, d): as much reach, more frequent updates, more backward work per step;
- random windows of mean length ``c`` (:class:`~ignite_tbptt.RandomWindows`, AWD-LSTM's draw, std ``c / 10``);
- unbiased truncation (:class:`~ignite_tbptt.ARTBP`): candidate points every ``b`` steps, windows of mean ``c``;
- adaptive k2 (:class:`~ignite_tbptt.AdaptiveTruncation`): windows of ``b``, k2 starting at ``c`` and kept
  in ``(b, e]`` so that the estimated truncation bias stays under 10%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ignite_tbptt import ARTBP, AdaptiveTruncation, RandomWindows

FAMILIES = ("k1 = k2", "k2 > k1", "random", "unbiased", "adaptive")
ADAPTIVE_DELTA = 0.1  # the relative truncation bias AdaptiveTruncation keeps k2 under


@dataclass(frozen=True)
class Truncation:
    """One way of choosing windows and cuts; ``build`` makes the trainer's arguments for a run.

    Attributes:
        name: the label in tables and figures.
        family: one of :data:`FAMILIES`.
        k1: steps between backward passes (the mean window length for random windows and ARTBP).
        k2: steps each backward pass reaches back (the first k2 for adaptive truncation).
        k2_max: the longest k2 adaptive truncation may choose.
        grid: ARTBP's steps between candidate points.
    """

    name: str
    family: str
    k1: int
    k2: int
    k2_max: int = 0
    grid: int = 0

    def build(self, seed: int) -> tuple[Any, int | None, Any]:
        """The trainer's arguments for one run.

        Args:
            seed: seeds the random draws of random windows and ARTBP.

        Returns:
            ``(k1 or window source, k2 or None, handler to attach or None)``: the first two go to
            ``create_tbptt_trainer`` as its ``k1`` and ``k2``, the handler (adaptive k2's) is attached to it.
        """
        if self.family == "random":
            return RandomWindows(self.k1, self.k2, std=max(1.0, self.k1 / 10), min_length=1, seed=seed), None, None
        if self.family == "unbiased":
            return ARTBP(grid=self.grid, mean_length=self.k1, seed=seed), None, None
        if self.family == "adaptive":
            handler = AdaptiveTruncation(ADAPTIVE_DELTA, self.k1 + 1, self.k2_max, every=10, k2=self.k2)
            return self.k1, self.k2, handler
        return self.k1, self.k2, None


def truncations(ks: tuple[int, int, int, int, int]) -> list[Truncation]:
    """The study's truncations for a task whose five window lengths are ``ks`` (see the module's docstring)."""
    a, b, c, d, e = ks
    fixed = [Truncation(f"TBPTT({k}, {k})", "k1 = k2", k, k) for k in ks]
    longer = [Truncation(f"TBPTT({k1}, {k2})", "k2 > k1", k1, k2) for k1, k2 in ((a, c), (b, c), (b, d), (c, d))]
    return [
        *fixed,
        *longer,
        Truncation(f"random, mean {c}", "random", c, c),
        Truncation(f"ARTBP, mean {c}", "unbiased", c, c, grid=b),
        Truncation(f"adaptive k2, k1 = {b}", "adaptive", b, c, k2_max=e),
    ]
