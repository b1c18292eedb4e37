"""Per-target metrics for sequence models: mean loss per target (nats), bits per target (per character), perplexity."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from ignite.metrics import Loss
from ignite.metrics.metric import reinit__is_reduced

from .data import count_targets

__all__ = ["LossPerTarget", "BitsPerTarget", "Perplexity"]


class LossPerTarget(Loss):
    """Mean loss per target, in the loss's own units (nats for cross-entropy): ignite's ``Loss`` by target count.

    Every target weighs the same, whatever the batch shapes (ignite's ``Loss`` weighs by ``len(y)``, the first
    dimension), padding weighs nothing, and the sum is kept in float64.

    Args:
        loss_fn: ``loss_fn(y_pred, y)``, mean over its real targets (e.g. ``cross_entropy`` with its
            ``ignore_index``, or :func:`~ignite_tbptt.masked_loss` for real-valued targets).
        output_transform: maps the engine's output to ``(y_pred, y)``.
        batch_size: ``batch_size(y)``, the number of targets in ``y``; default
            :func:`~ignite_tbptt.count_targets`: all but the padding (NaN, or -100 for class indices), as
            the packers mark it.
        device: where the running sums live.
    """

    def __init__(
        self,
        loss_fn: Callable,
        output_transform: Callable = lambda x: x,
        batch_size: Callable = count_targets,
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
        n = int(self._batch_size(y))
        if n == 0:
            return
        mean = self._loss_fn(y_pred, y, **(kwargs[0] if kwargs else {})).detach()
        if mean.dim() != 0:
            raise ValueError("loss_fn did not return the average loss.")
        self._sum += mean.to(self._device) * n
        self._num_examples += n


class BitsPerTarget(LossPerTarget):
    """Mean loss per target in bits: :class:`LossPerTarget` in nats divided by ln 2; arguments as there.

    With a cross-entropy ``loss_fn`` over characters this is bits per character.
    """

    def compute(self) -> float:
        """The mean loss per target, in bits."""
        return super().compute() / math.log(2)


class Perplexity(BitsPerTarget):
    """``exp`` of the mean per-target loss (``2 ** BitsPerTarget``); arguments as :class:`BitsPerTarget`."""

    def compute(self) -> float:
        """The perplexity."""
        return 2.0 ** super().compute()
