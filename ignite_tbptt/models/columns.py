"""Per-column resets of a state whose tensors are all batch-first, ``(B, ...)``: what the adapters' resets share."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["zero_columns"]


def zero_columns(state: Any, starts: torch.Tensor, name: str) -> Any:
    """``state`` with every tensor's rows ``starts`` zeroed, new tensors; ``name`` is the reset the error names.

    ``masked_fill`` gives the replaced entries a zero gradient, so no gradient flows into a column's previous
    sequence.

    Raises:
        ValueError: if a tensor of ``state`` does not have ``B = len(starts)`` rows in dimension 0.
    """
    batch = starts.shape[0]

    def reset(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != batch:
            raise ValueError(
                f"{name} zeroes columns of (B, ...) tensors with B = {batch}, but the state holds a tensor of shape "
                f"{tuple(t.shape)}."
            )
        return t.masked_fill(starts.view(batch, *([1] * (t.dim() - 1))), 0)

    return pytree.tree_map_only(torch.Tensor, reset, state)
