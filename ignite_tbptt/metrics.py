"""Per-target metrics for sequence models: bits per target (bits per character) and perplexity."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from ignite.metrics import Loss
from ignite.metrics.metric import reinit__is_reduced

__all__ = ["BitsPerTarget", "Perplexity"]


def _numel(y: torch.Tensor) -> int:
    return y.numel()


class BitsPerTarget(Loss):
    """Mean loss per target in bits: ignite's ``Loss`` weighted by target count, divided by ln 2.

    With a cross-entropy ``loss_fn`` over characters this is bits per character. Every target weighs the
    same, whatever the batch shapes (ignite's ``Loss`` weighs by ``len(y)``, the first dimension), and the
    sum is kept in float64.

    Args:
        loss_fn: ``loss_fn(y_pred, y)``, mean over its targets, in nats.
        output_transform: maps the engine's output to ``(y_pred, y)``.
        batch_size: number of targets in ``y``; default ``y.numel()`` (count non-padding targets for padded data).
        device: where the running sums live.
    """

    def __init__(
        self,
        loss_fn: Callable,
        output_transform: Callable = lambda x: x,
        batch_size: Callable = _numel,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(loss_fn, output_transform=output_transform, batch_size=batch_size, device=device)

    def reset(self) -> None:
        """Start a new sum, in float64: a validation stream of millions of targets outgrows float32's precision."""
        super().reset()
        if self._device.type != "mps":
            self._sum = self._sum.double()

    @reinit__is_reduced
    def update(self, output: Sequence[Any]) -> None:
        """Add a batch's ``(y_pred, y)`` or ``(y_pred, y, kwargs)`` as ignite's ``Loss`` does.

        Its targets are counted once; a batch with none (all padding) adds nothing, not its NaN mean.

        Raises:
            ValueError: if ``loss_fn`` does not return a 0-dim mean.
        """
        y_pred, y, *kwargs = output
        n = self._batch_size(y)
        if n == 0:
            return
        mean = self._loss_fn(y_pred, y, **(kwargs[0] if kwargs else {})).detach()
        if mean.dim() != 0:
            raise ValueError("loss_fn did not return the average loss.")
        self._sum += mean.to(self._device) * n
        self._num_examples += n

    def compute(self) -> float:
        """The mean loss per target, in bits."""
        return super().compute() / math.log(2)


class Perplexity(BitsPerTarget):
    """``exp`` of the mean per-target loss (``2 ** BitsPerTarget``); arguments as :class:`BitsPerTarget`."""

    def compute(self) -> float:
        """The perplexity."""
        return 2.0 ** super().compute()
