"""Batches ``(x, y)`` and ``(x, y, starts)``: moving them to the device, their checks, and where sequences start.

A stream of many sequences (documents, episodes, recordings) is laid out in parallel columns, each column a
queue of sequences (:func:`~ignite_tbptt.data.pack_sequences`). ``starts[t, b]`` True says that a new sequence
starts at step ``t`` of column ``b``: the column's hidden state is reset before that step, and no gradient flows
from that step on back into the column's previous sequence (SPEC.md, "Sequence starts"). The trainer ends a
segment at every step where some column starts, so that each reset falls between two model calls; the reset
itself is :func:`~ignite_tbptt.runtime.default_reset_hidden`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from ignite.utils import convert_tensor

from ..layout import Layout

__all__ = [
    "prepare_batch",
    "split_batch",
    "check_pair",
    "check_starts",
    "start_steps",
    "starts_at",
    "resets_by_step",
]


def prepare_batch(
    batch: Sequence[Any], device: str | torch.device | None = None, non_blocking: bool = False
) -> tuple[Any, ...]:
    """Move a batch ``(x, y)`` or ``(x, y, starts)`` to ``device``: ignite's ``_prepare_batch``, with ``starts``.

    Raises:
        ValueError: if the batch has neither two nor three elements.
        TypeError: if ``starts`` is not a tensor.
    """
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise ValueError(
            f"a batch must be (x, y) or (x, y, starts), got {type(batch).__name__} of "
            f"{len(batch) if isinstance(batch, (tuple, list)) else 'unknown'} elements; pass prepare_batch to adapt it."
        )
    if len(batch) == 3 and not isinstance(batch[2], torch.Tensor):
        raise TypeError(
            f"starts must be a bool tensor (True where a sequence starts), got {type(batch[2]).__name__}; "
            "e.g. torch.tensor(starts, dtype=torch.bool)."
        )
    return tuple(convert_tensor(t, device=device, non_blocking=non_blocking) for t in batch)


def split_batch(prepared: Any) -> tuple[Any, Any, Any]:
    """``(x, y, starts)`` from what ``prepare_batch`` returned, ``starts`` None for a pair.

    Raises:
        TypeError: if ``prepared`` is neither a pair nor a triple.
    """
    if isinstance(prepared, (tuple, list)) and len(prepared) in (2, 3):
        return prepared[0], prepared[1], prepared[2] if len(prepared) == 3 else None
    raise TypeError(f"prepare_batch must return (x, y) or (x, y, starts), got {type(prepared).__name__}.")


def check_pair(x: Any, y: Any, layout: Layout) -> int:
    """Check that ``x`` and ``y`` are tensors of one non-zero length along the time dimension; return that length.

    Raises:
        TypeError: if ``x`` or ``y`` is not a tensor.
        ValueError: if ``time_dim`` is out of range, the lengths differ, or the batch is empty.
    """
    time_dim = layout.time_dim
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"prepare_batch must return tensors (x, y); {name} is a {type(t).__name__}.")
        if not -t.dim() <= time_dim < t.dim():
            raise ValueError(
                f"time_dim={time_dim} is out of range for {name} of shape {tuple(t.shape)}; "
                "pass the index of the time dimension (0 for (T, B, *), 1 for (B, T, *), -1 for the last axis)."
            )
    if x.shape[time_dim] != y.shape[time_dim]:
        raise ValueError(
            f"x and y must have the same length along time_dim={time_dim}, got {x.shape[time_dim]} and "
            f"{y.shape[time_dim]}."
        )
    if x.shape[time_dim] == 0 or x.numel() == 0:
        raise ValueError(f"empty batch: x has shape {tuple(x.shape)}; every batch needs at least one step.")
    return x.shape[time_dim]


def check_starts(starts: Any, x: torch.Tensor, layout: Layout) -> None:
    """Check that ``starts`` is a bool tensor over ``x``'s time and batch dimensions.

    ``starts`` has shape ``(T, B)`` when time is ``x``'s first axis, ``(T, B, *)``, and ``(B, T)`` otherwise
    (``(B, T, *)``, ``(B, C, T)``): :class:`~ignite_tbptt.layout.Layout`.

    Raises:
        TypeError: if ``starts`` is not a bool tensor.
        ValueError: if ``x`` has no batch dimension, ``starts`` has the wrong shape, or it is on another device
            than ``x``.
    """
    if not isinstance(starts, torch.Tensor) or starts.dtype != torch.bool:
        what = starts.dtype if isinstance(starts, torch.Tensor) else type(starts).__name__
        raise TypeError(f"starts must be a bool tensor (True where a sequence starts), got {what}.")
    if x.dim() < 2:
        raise ValueError(f"starts needs x with time and batch dimensions, got x of shape {tuple(x.shape)}.")
    time_first = layout.time_first(x)
    t, b = layout.length(x), layout.columns(x)
    expected = (t, b) if time_first else (b, t)
    if tuple(starts.shape) != expected:
        axes = "(T, B)" if time_first else "(B, T)"
        raise ValueError(
            f"starts must have shape {axes} = {expected} to match x of shape {tuple(x.shape)} with "
            f"time_dim={layout.time_dim}, got {tuple(starts.shape)}."
        )
    if starts.device != x.device:
        raise ValueError(
            f"starts is on {starts.device} and x on {x.device}; move both to one device (the default "
            "prepare_batch moves the whole batch (x, y, starts) to the trainer's device)."
        )


def start_steps(starts: torch.Tensor, batch_axis: int) -> list[int]:
    """The steps of the batch where some column starts a sequence, ascending (one read from the device).

    Args:
        starts: the batch's starts.
        batch_axis: the batch dimension of ``starts`` (:meth:`~ignite_tbptt.layout.Layout.starts_axes`).
    """
    return torch.nonzero(starts.any(dim=batch_axis)).flatten().tolist()


def starts_at(starts: torch.Tensor, step: int, time_axis: int) -> torch.Tensor:
    """The columns that start a sequence at ``step`` of the batch, shape ``(B,)``; ``time_axis``: starts' time dim."""
    return starts.select(time_axis, step)


def resets_by_step(starts: Any, x: torch.Tensor, layout: Layout) -> dict[int, torch.Tensor]:
    """Check ``starts`` against ``x`` (:func:`check_starts`); the starting columns at each step where any start.

    Returns:
        Step of the batch -> bool ``(B,)`` of the columns that start a sequence there, for the steps where some
        column does (one read from the device to find them).
    """
    check_starts(starts, x, layout)
    time_axis, batch_axis = layout.starts_axes(x)
    return {t: starts_at(starts, t, time_axis) for t in start_steps(starts, batch_axis)}
