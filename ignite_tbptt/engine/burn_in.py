"""Burn-in: the first steps after each fresh start run the model but carry no loss (SPEC.md, "Burn-in").

A fresh start is a stream's first step (every batch's, without ``carry_hidden``) and a column's sequence start
inside a batch. For ``m`` steps from there the column's targets are marked as padding, the mark the packers and
:func:`~ignite_tbptt.count_targets` already use (NaN for floating-point targets, ``ignore_index`` -100 for class
indices), so that the loss (a :func:`~ignite_tbptt.masked_loss`, or ``cross_entropy``'s ``ignore_index``) leaves
them out and the counted targets, which normalise every optimizer step, are those after the burn-in. The model still
runs those steps and carries its state on. With gradient (the default), later losses backpropagate through the
burn-in steps within k2, as through any other step; without, the gradient of each column stops at the state where
its burn-in ends, as though that state were detached there, and a segment over which every column is inside its
burn-in, all of them ending where it ends, runs without a graph (no gradient could reach it); other burn-in steps
build a graph that no gradient reaches through their own column.

A column's count of steps since its fresh start is carried from batch to batch along the stream, so a burn-in may
span batches; it is part of the stream's state in a checkpoint.

Sources: Schiller, Heinrich, Lopez, Müller, "Tuning the burn-in phase in training recurrent neural networks improves
their performance", ICLR 2026 (the loss cut, the graph kept); Kapturowski, Ostrovski, Quan, Munos, Dabney,
"Recurrent experience replay in distributed reinforcement learning" (R2D2), ICLR 2019, section 3 (a burn-in run
without gradient from a stored state).
"""

from __future__ import annotations

from typing import Any

import torch

from ..data.masks import IGNORE_INDEX
from ..layout import Layout
from ..runtime import Resets

__all__ = ["BurnIn", "mask_targets"]


class BurnIn:
    """The burn-in of a stream: which steps of each batch carry no loss, and where a column's gradient stops.

    Args:
        steps: the burn-in's length ``m`` in steps; 0 for none (then it changes nothing).
        gradient: whether later losses backpropagate through the burn-in steps (else each column's gradient stops
            where its burn-in ends).
    """

    def __init__(self, steps: int, gradient: bool) -> None:
        self.steps, self.gradient = steps, gradient
        #: ``(B,)``: each column's steps since its last fresh start, at the stream's position; ``None`` at its start.
        self.since: torch.Tensor | None = None
        # Without gradient, of the last batch: the columns whose gradient stops, by step; by step, whether every
        # column is inside its burn-in, and whether every column's burn-in ends there.
        self._stops: Resets = {}
        self._quiet: list[bool] = []
        self._all_end: list[bool] = []

    def reset(self) -> None:
        """A new stream: every column starts afresh."""
        self.since = None

    def apply(self, y: Any, length: int, resets: Resets, layout: Layout) -> tuple[Any, Resets]:
        """The batch's targets with the burn-in's as padding, and its resets; :meth:`segment` then tells its stops.

        Where a column's gradient stops, a segment must start: such steps join ``resets``, without columns to reset.
        """
        if not self.steps:
            return y, resets
        mask, self._stops = self.batch(length, layout.columns(y), resets, y.device)
        return mask_targets(y, mask, layout), {**dict.fromkeys(self._stops), **resets}

    def segment(self, start: int, end: int) -> tuple[torch.Tensor | None, bool]:
        """The burn-in of the last batch's segment ``[start, end)``: ``(stops, graph_free)``.

        ``stops``: the columns (``(B,)`` bool) whose gradient stops at the segment's input state, or ``None``.
        ``graph_free``: whether the segment needs no graph: every column is inside a burn-in run without gradient
        throughout, and every column's burn-in ends where the segment ends, so that the gradient stops there in
        all columns at once and none reaches the segment, even through a model that mixes its columns.
        """
        if self.gradient:
            return None, False
        quiet, all_end = self._quiet, self._all_end
        return self._stops.get(start), start < end < len(all_end) and all_end[end] and all(quiet[start:end])

    def batch(self, length: int, columns: int, resets: Resets, device: Any) -> tuple[torch.Tensor, Resets]:
        """The next batch's burn-in, and the stream's count advanced past it.

        Args:
            length: the batch's steps ``T``.
            columns: its columns ``B``.
            resets: the columns starting a sequence, by step of the batch.
            device: where the batch lives.

        Returns:
            ``(mask, stops)``: ``mask`` ``(T, B)`` bool, True at the burn-in steps; ``stops``, without gradient, the
            columns whose burn-in ends at each step where some does (their state entering that step is where their
            gradient stops), else empty.
        """
        step = torch.arange(length, device=device).unsqueeze(1)  # (T, 1)
        started = torch.full((length, columns), -1, dtype=torch.long, device=device)
        for t, starting in resets.items():
            if starting is not None:
                started[t].masked_fill_(starting.to(device), t)
        last = started.cummax(0).values  # the step of each column's latest start in the batch, -1 if none
        before = torch.zeros(columns, dtype=torch.long, device=device) if self.since is None else self.since.to(device)
        since = torch.where(last >= 0, step - last, before + step)  # (T, B): steps since the column's fresh start
        self.since = since[-1] + 1
        mask = since < self.steps
        if self.gradient:
            return mask, {}
        ends = since == self.steps
        flags = torch.stack([ends.any(1), mask.all(1), ends.all(1)]).tolist()  # one read
        self._quiet, self._all_end = flags[1], flags[2]
        return mask, {t: ends[t] for t, ending in enumerate(flags[0]) if ending}

    def hparams(self) -> dict[str, Any]:
        """Its length and variant, for logging (nothing without a burn-in)."""
        return {"burn_in": self.steps, "burn_in_gradient": self.gradient} if self.steps else {}

    def state_dict(self) -> dict[str, Any]:
        """The columns' counts since their fresh starts, carried along the stream (nothing without a burn-in)."""
        return {"burn_in_since": None if self.since is None else self.since.cpu()} if self.steps else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counts (a checkpoint without them: the stream's start)."""
        self.since = state.get("burn_in_since")


def mask_targets(y: torch.Tensor, mask: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``y`` with the targets of the burn-in steps (``mask``, ``(T, B)``) marked as padding: NaN, or -100.

    Raises:
        TypeError: if ``y`` is neither floating-point nor integer (nothing marks such a target as padding).
    """
    if y.is_floating_point():
        pad: float = float("nan")
    elif not y.dtype.is_complex and y.dtype != torch.bool:
        pad = IGNORE_INDEX
    else:
        raise TypeError(
            f"burn_in marks the targets of the burn-in steps as padding, NaN or {IGNORE_INDEX}, and y is {y.dtype}: "
            "give floating-point targets, or integer class indices."
        )
    shape = [1] * y.dim()
    time_axis, batch_axis = layout.time_dim % y.dim(), layout.batch_axis(y)
    shape[time_axis], shape[batch_axis] = mask.shape
    ordered = mask if time_axis < batch_axis else mask.t()
    return y.masked_fill(ordered.reshape(shape), pad)
