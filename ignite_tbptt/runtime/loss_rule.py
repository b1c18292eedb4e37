"""How a segment's loss is computed and backpropagated: the one rule both executors follow.

``loss_fn`` returns the mean over the segment's targets, under the model's autocast. The trainer backpropagates
that mean where the segment is its optimizer step's only window (``SegmentPlan.backward_mean``), else the sum over
its targets, ``n`` times the mean, which the optimizer step divides by the target count of all its windows
(SPEC.md, "Normalisation"). Every backward pass starts from the loss multiplied by the ``GradScaler``'s scale,
where there is one. The eager :class:`~ignite_tbptt.runtime.SegmentExecutor` and the window programs
(:mod:`ignite_tbptt.runtime.programs.executor`) both take their losses from here, so that a program gives the eager
path's gradients bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import hidden as hs
from .model_call import ModelCall

__all__ = ["LossRule"]


class LossRule:
    """A segment's mean loss and the root its backward pass starts from.

    Args:
        loss_fn: ``loss_fn(y_pred, y)``, reducing by mean over its targets.
        model_call: the model call, whose autocast the loss runs under too.
        scaler: the ``GradScaler`` every backward is scaled by, or ``None``.
    """

    __slots__ = ("loss_fn", "model_call", "scaler")

    def __init__(
        self,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        model_call: ModelCall,
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        self.loss_fn, self.model_call, self.scaler = loss_fn, model_call, scaler

    def mean(self, predictions: Any, y: Any, targets: int) -> torch.Tensor:
        """``loss_fn``'s mean over the ``targets`` targets, checked to be a 0-dim tensor with a graph.

        Without targets (a segment of padding only that must still be backpropagated: a model sharded by FSDP2), a
        zero loss with the predictions' graph.

        Raises:
            TypeError: if ``loss_fn`` returns something other than a tensor.
            ValueError: if it returns a tensor of more than 0 dimensions, or one without a graph.
        """
        if not targets:
            parts = [t.sum() for t in hs.flatten(predictions) if t.requires_grad]
            return sum(parts[1:], parts[0]) * 0.0 if parts else torch.zeros(())
        if self.model_call.autocasts:
            with self.model_call.autocast():
                return _checked(self.loss_fn(predictions, y))
        return _checked(self.loss_fn(predictions, y))

    @staticmethod
    def backpropagated(mean: torch.Tensor, targets: int | torch.Tensor, backward_mean: bool) -> torch.Tensor:
        """The loss the segment backpropagates: its ``mean`` where ``backward_mean``, else the sum over its targets.

        ``targets``: their count, an int or (inside a program) a 0-dim integer tensor on the device.
        """
        return mean if backward_mean else mean * targets

    def root(self, loss: torch.Tensor) -> torch.Tensor:
        """Where the backward pass starts: ``loss`` times the scaler's scale, or ``loss`` without a scaler."""
        return self.scaler.scale(loss) if self.scaler is not None else loss


def _checked(loss: Any) -> torch.Tensor:
    """``loss_fn``'s value, if it is a 0-dim tensor with a graph: else an error before any backward runs."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"loss_fn must return a 0-dim tensor (the mean over the targets), got {type(loss).__name__}; do not "
            "call .item() or float() on it."
        )
    if loss.dim() != 0:
        raise ValueError(
            f"loss_fn must return a 0-dim tensor (the mean over the targets), got shape {tuple(loss.shape)}; use "
            "reduction='mean' (PyTorch's default) and target_count_fn for padded targets."
        )
    if not loss.requires_grad:
        raise ValueError(
            "loss_fn returned a tensor without a graph to the predictions (detached, or computed from something "
            "else); compute it from y_pred without .detach()."
        )
    return loss
