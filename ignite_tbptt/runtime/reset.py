"""Resetting the hidden state of the columns where a new sequence starts (SPEC.md, "Sequence starts")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import hidden as hs

__all__ = ["Resets", "default_reset_hidden", "check_resettable", "reset_to", "stop_gradient"]

#: The columns that start a sequence (``(B,)`` bool), by step of the batch; ``None`` at a step where only another
#: process's do (a model sharded by FSDP2, which runs no program).
Resets = Mapping[int, torch.Tensor | None]


def _batch_dim(t: torch.Tensor, batch: int) -> int:
    if t.dim() == 3 and t.shape[1] == batch:
        return 1
    if t.dim() == 2 and t.shape[0] == batch:
        return 0
    raise ValueError(
        f"the default reset_hidden zeroes columns of (layers * directions, B, H) and (B, H) hidden tensors, with "
        f"B = {batch}, but the hidden state holds a tensor of shape {tuple(t.shape)}. Pass "
        "reset_hidden=fn, fn(hidden, starts) -> hidden with starts of shape (B,), to reset it."
    )


def check_resettable(hidden: Any, batch: int) -> None:
    """Check, from shapes alone, that :func:`default_reset_hidden` can reset ``hidden`` of ``batch`` columns.

    Raises:
        ValueError: if a tensor of ``hidden`` is neither 3-D with ``batch`` in dimension 1 nor 2-D with ``batch``
            in dimension 0.
    """
    for t in hs.flatten(hidden):
        _batch_dim(t, batch)


def default_reset_hidden(hidden: Any, starts: torch.Tensor) -> Any:
    """Zero the hidden state of the columns where a sequence starts; the default ``reset_hidden``.

    Every tensor of the hidden tree is reset in its batch dimension: dimension 1 of 3-D tensors (the
    ``(num_layers * num_directions, B, H)`` state of ``nn.RNN``, ``nn.GRU`` and ``nn.LSTM``, ``batch_first`` or
    not) and dimension 0 of 2-D ones (the ``(B, H)`` state of a cell). Zeros are the initial state those modules
    start from when called without one. ``masked_fill`` both replaces the values (NaN included) and gives the
    replaced entries a zero gradient, so no gradient flows into the columns' previous sequences.

    Args:
        hidden: the hidden state, a tensor or a tree of tensors.
        starts: bool tensor of shape ``(B,)``, True for the columns to reset.

    Returns:
        The hidden state with the starting columns zeroed; the other columns are the same values.

    Raises:
        ValueError: if a tensor of ``hidden`` has another shape (pass ``reset_hidden`` for such states).

    Examples:
        >>> h = torch.ones(1, 3, 2)  # (layers, B, H)
        >>> default_reset_hidden(h, torch.tensor([False, True, False]))[0, :, 0].tolist()
        [1.0, 0.0, 1.0]
    """
    batch = starts.shape[0]

    def reset(t: torch.Tensor) -> torch.Tensor:
        dim = _batch_dim(t, batch)
        return t.masked_fill(starts.view(1, -1, 1) if dim == 1 else starts.view(-1, 1), 0)

    return pytree.tree_map_only(torch.Tensor, reset, hidden)


def reset_to(hidden: Any, starts: torch.Tensor, initial: Any) -> Any:
    """The hidden state with the starting columns replaced by ``initial``'s: the reset of a learned initial state.

    ``torch.where`` passes the gradient of a starting column to ``initial`` (whose parameters learn from it) and none
    to the column's old value. Tensors are matched in their batch dimension as :func:`default_reset_hidden`
    matches them; ``initial`` has the structure and shapes of ``hidden``.

    Args:
        hidden: the hidden state, a tensor or a tree of tensors.
        starts: bool tensor of shape ``(B,)``, True for the columns to reset.
        initial: the initial state for ``B`` columns, the same tree as ``hidden``.

    Raises:
        ValueError: if a tensor of ``hidden`` has no batch dimension of ``B`` where the default reset looks.
    """
    batch = starts.shape[0]

    def reset(t: torch.Tensor, init: torch.Tensor) -> torch.Tensor:
        dim = _batch_dim(t, batch)
        return torch.where(starts.view(1, -1, 1) if dim == 1 else starts.view(-1, 1), init.to(t.dtype), t)

    return pytree.tree_map(reset, hidden, initial)


def stop_gradient(hidden: Any, columns: torch.Tensor) -> Any:
    """The hidden state with no gradient flowing back through the ``columns`` (``(B,)`` bool): the same values.

    Where a burn-in run without gradient ends (SPEC.md, "Burn-in"), the state of the columns whose burn-in ends is
    where their gradient stops, as a detached state would be; the other columns' gradient flows on. Tensors are
    matched in their batch dimension as :func:`default_reset_hidden` matches them.

    Raises:
        ValueError: if a tensor of ``hidden`` has no batch dimension of ``B`` where the default reset looks.
    """
    batch = columns.shape[0]

    def stop(t: torch.Tensor) -> torch.Tensor:
        dim = _batch_dim(t, batch)
        return torch.where(columns.view(1, -1, 1) if dim == 1 else columns.view(-1, 1), t.detach(), t)

    return pytree.tree_map_only(torch.Tensor, stop, hidden)
