"""How a segment's loss is computed and backpropagated: the one rule both executors follow.

``loss_fn`` returns the mean over the segment's targets, under the model's autocast. The trainer backpropagates
that mean where the segment is its optimizer step's only window (``SegmentPlan.backward_mean``), else the sum over
its targets, ``n`` times the mean, which the optimizer step divides by the target count of all its windows
(SPEC.md, "Normalisation"). Every backward pass starts from the loss multiplied by the ``GradScaler``'s scale,
where there is one. The eager :class:`~ignite_tbptt.runtime.SegmentExecutor` and the window programs
(:mod:`ignite_tbptt.runtime.programs.window`) both take their losses from here, so that a program gives the eager
path's gradients bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..layout import Layout
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

    def mean(self, predictions: Any, y: Any, targets: int, hidden: Any = None) -> torch.Tensor:
        """``loss_fn``'s mean over the ``targets`` targets, checked to be a 0-dim tensor with a graph.

        Without targets (a segment of padding only that must still be backpropagated: a model sharded by FSDP2), a
        zero loss with the predictions' graph.

        Args:
            predictions: the model call's ``y_pred``.
            y: the segment's targets.
            targets: their count.
            hidden: the state the call returned, named in the error where ``loss_fn`` fails on ``y_pred`` and the
                two look swapped.

        Raises:
            TypeError: if ``loss_fn`` returns something other than a tensor; if it fails on predictions that are
                not a tensor, or not as long as ``y`` in time, while the returned state is: the model returned
                ``(hidden, y_pred)`` (the error ``loss_fn`` raised is its cause).
            ValueError: if it returns a tensor of more than 0 dimensions, or one without a graph.
        """
        if not targets:
            parts = [t.sum() for t in hs.flatten(predictions) if t.requires_grad]
            return sum(parts[1:], parts[0]) * 0.0 if parts else torch.zeros(())
        try:
            if self.model_call.autocasts:
                with self.model_call.autocast():
                    loss = self.loss_fn(predictions, y)
            else:
                loss = self.loss_fn(predictions, y)
        except Exception as error:
            swapped = _swapped(predictions, y, hidden, self.model_call.layout)
            if swapped is None:
                raise
            raise TypeError(swapped) from error
        return _checked(loss)

    @staticmethod
    def backpropagated(mean: torch.Tensor, targets: int | torch.Tensor, backward_mean: bool) -> torch.Tensor:
        """The loss the segment backpropagates: its ``mean`` where ``backward_mean``, else the sum over its targets.

        ``targets``: their count, an int or (inside a program) a 0-dim integer tensor on the device.
        """
        return mean if backward_mean else mean * targets

    def root(self, loss: torch.Tensor) -> torch.Tensor:
        """Where the backward pass starts: ``loss`` times the scaler's scale, or ``loss`` without a scaler."""
        return self.scaler.scale(loss) if self.scaler is not None else loss


def _swapped(predictions: Any, y: Any, hidden: Any, layout: Layout) -> str | None:
    """Why ``loss_fn`` may have failed, where the model looks to return ``(hidden, y_pred)``; else ``None``."""
    if not (isinstance(y, torch.Tensor) and isinstance(hidden, torch.Tensor)) or min(y.dim(), hidden.dim()) == 0:
        return None
    if _length(hidden, layout) != _length(y, layout):
        return None
    if isinstance(predictions, torch.Tensor) and _length(predictions, layout) == _length(y, layout):
        return None  # as long as the targets in time: the predictions may well be what they look
    return (
        f"loss_fn failed on y_pred {hs.signature(predictions)} and y of shape {tuple(y.shape)}, while the state the "
        f"model returned, {hs.signature(hidden)}, is as long as y in time: the model may return (hidden, y_pred). "
        "The trainer takes (y_pred, hidden) = model(x, hidden); swap them in forward, or pass model_fn=lambda "
        "model, x, hidden: (model(x) if hidden is None else model(x, hidden))[::-1]."
    )


def _length(t: torch.Tensor, layout: Layout) -> int | None:
    """``t``'s steps along the time axis, or ``None`` for a tensor without one."""
    try:
        return layout.length(t)
    except IndexError:
        return None


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
