"""Losses and target counts over padded targets, as the packers pad them.

:func:`~ignite_tbptt.data.pack_sequences` and :func:`~ignite_tbptt.data.pack_recordings` mark the steps no
sequence fills in the targets themselves: ``ignore_index`` (-100) for integer class indices, which PyTorch's
``cross_entropy`` and ``nll_loss`` skip already, and NaN for floating-point targets (real values, multi-hot
frames). These helpers read the same marks, so that padded batches need no mask of their own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

__all__ = ["is_target", "count_targets", "masked_loss"]

IGNORE_INDEX = -100  # PyTorch's default ignore_index, and the packers'


def is_target(y: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Which elements of ``y`` are real targets: not NaN (floating point), not ``ignore_index`` (integer).

    Args:
        y: targets of any shape, e.g. ``(T, B)`` class indices or ``(T, B, G)`` real values.
        ignore_index: the padding of integer targets.

    Returns:
        A bool tensor of ``y``'s shape.
    """
    if y.dtype.is_floating_point or y.dtype.is_complex:
        return ~torch.isnan(y)
    if y.dtype == torch.bool:
        return torch.ones_like(y)
    return y != ignore_index


def count_targets(*tensors: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The number of real targets (:func:`is_target`), a 0-dim int64 tensor on the targets' device.

    Called as ``count_targets(y)`` (ignite's ``batch_size(y)``, the per-target metrics' default) or as
    ``count_targets(y_pred, y)``, the trainer's ``target_count_fn(y_pred, y)``: the targets are the last tensor, so
    ``create_tbptt_trainer(..., target_count_fn=count_targets)`` counts ``y``, not the predictions. The trainer
    reads the count back from the device once per model call.

    Args:
        *tensors: ``y``, or ``y_pred, y``; ``y`` of any shape, e.g. ``(T, B)`` class indices or ``(T, B, G)`` real
            values.
        ignore_index: the padding of integer targets (keyword only).

    Returns:
        The count, 0-dim, int64.

    Raises:
        TypeError: if no tensor or more than two are given, or the last is not a tensor.

    Warns:
        DeprecationWarning: ``count_targets(y, ignore_index)``, the index by position, as before 0.5: it is counted
            so until 0.6; pass ``ignore_index=`` by keyword.

    Examples:
        >>> y = torch.tensor([[3, -100], [1, 2]])  # (T, B): one padded step
        >>> count_targets(y).item(), count_targets(torch.zeros(2, 2, 5), y).item()
        (3, 3)
    """
    if len(tensors) == 2 and isinstance(tensors[0], torch.Tensor) and isinstance(tensors[1], int):
        warnings.warn(
            "count_targets(y, ignore_index) is deprecated and will count (y_pred, y) only from 0.6: pass "
            f"count_targets(y, ignore_index={tensors[1]}).",
            DeprecationWarning,
            stacklevel=2,
        )
        tensors, ignore_index = tensors[:1], tensors[1]
    if not 1 <= len(tensors) <= 2 or not isinstance(tensors[-1], torch.Tensor):
        got = ", ".join(type(t).__name__ for t in tensors) or "nothing"
        raise TypeError(
            f"count_targets takes (y) or (y_pred, y), y a tensor, and ignore_index by keyword; got ({got}). "
            "E.g. count_targets(y, ignore_index=0), or target_count_fn=count_targets."
        )
    return is_target(tensors[-1], ignore_index).sum()


def masked_loss(loss_fn: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``loss_fn`` averaged over the real targets only, for targets that are not class indices.

    ``loss_fn(y_pred, y, reduction="none")`` must return one loss per element of ``y`` (PyTorch's element-wise
    losses do: ``mse_loss``, ``l1_loss``, ``binary_cross_entropy_with_logits``, ...). Padding (NaN in ``y``) is
    replaced by 0 before the call, so that it cannot turn the loss or its gradient into NaN, and its losses are
    left out of the mean. For class indices, ``cross_entropy``'s own ``ignore_index`` does this.

    Args:
        loss_fn: an element-wise loss taking ``reduction``.

    Returns:
        ``fn(y_pred, y)``: the mean of ``loss_fn`` over the real elements of ``y``, a 0-dim tensor (0.0, with a
        graph, where there are none). Use it with ``target_count_fn=count_targets``.

    Examples:
        >>> import torch.nn.functional as F
        >>> loss_fn = masked_loss(F.mse_loss)
        >>> y = torch.tensor([[1.0, float("nan")], [3.0, float("nan")]])  # (T, B): column 1 is padding
        >>> loss_fn(torch.zeros(2, 2), y).item(), count_targets(y).item()
        (5.0, 2)
    """

    def masked(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        real = is_target(y)
        losses = loss_fn(y_pred, torch.where(real, y, 0), reduction="none")
        if losses.shape != y.shape:
            raise ValueError(
                f"masked_loss needs one loss per target: loss_fn returned shape {tuple(losses.shape)} for targets "
                f"of shape {tuple(y.shape)} with reduction='none'."
            )
        return torch.where(real, losses, 0).sum() / real.sum().clamp(min=1)

    return masked
