"""Hidden states as nested tuples, lists, dicts and namedtuples of tensors.

A segment's input hidden state is a fresh leaf, detached from the segment before it, so that each
segment's graph ends at its own boundary; the backward sweep carries gradients across boundaries by hand.
"""

from __future__ import annotations

from typing import Any

import torch
from ignite.utils import apply_to_tensor

__all__ = ["flatten", "unflatten", "as_leaves", "signature", "cat"]


def flatten(tree: Any) -> list[torch.Tensor]:
    """Tensors of ``tree`` in a fixed traversal order (the order ``unflatten`` fills them back)."""
    leaves: list[torch.Tensor] = []
    apply_to_tensor(tree, leaves.append)
    return leaves


def unflatten(tree: Any, leaves: list[torch.Tensor]) -> Any:
    """A copy of ``tree``'s nesting with its tensors replaced, in order, by ``leaves``."""
    it = iter(leaves)
    return apply_to_tensor(tree, lambda _: next(it))


def as_leaves(tree: Any, requires_grad: bool) -> tuple[Any, list[torch.Tensor]]:
    """Detached copy of ``tree`` whose floating-point tensors are leaves that may require grad.

    Returns:
        The new tree and its tensors in ``flatten`` order.
    """

    def leaf(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t.requires_grad_() if requires_grad and (t.is_floating_point() or t.is_complex()) else t

    new = apply_to_tensor(tree, leaf)
    return new, flatten(new)


def signature(tree: Any) -> Any:
    """Nesting, shapes and dtypes of ``tree``; equal signatures mean interchangeable hidden states."""
    return apply_to_tensor(tree, lambda t: (tuple(t.shape), t.dtype))


def cat(parts: list[Any], dim: int) -> Any:
    """Join same-structured ``parts`` (e.g. the predictions of consecutive segments) along ``dim``."""
    if len(parts) == 1:
        return parts[0]
    leaves = [flatten(p) for p in parts]
    return unflatten(parts[0], [torch.cat(ts, dim=dim) for ts in zip(*leaves)])
