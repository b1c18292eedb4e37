"""Retained segments of a stream and the backward sweep of a window.

A *segment* is one model call over consecutive steps. Its graph starts at leaf copies of its input hidden
state and ends at its output hidden state and its predictions. A window's backward pass walks its segments
from the last to the cut, each exactly once: every segment is backpropagated with the sum of both gradients
that reach it, the loss gradient of its own predictions (if still owed) and the hidden-state gradient that
the later segments left on its successor's input leaves. By linearity of backpropagation this equals
backpropagating every step's loss separately to the window's cut (Williams & Peng, 1990, BPTT(h; h')), at
the cost of one traversal per segment and window: ``k2 / k1`` backward traversals per step on average.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from .rng import RNGState
from .schedule import Schedule
from .versions import WeightVersion

__all__ = ["Replay", "Segment", "History"]


@dataclass(eq=False)
class Replay:
    """What recomputing a segment's forward pass needs: its input, input hidden state, random state and weights.

    Attributes:
        x: the segment's input, ``x`` narrowed to its steps along the time dimension.
        hidden: the input hidden state (the leaves the segment ran from), or ``None`` at the stream's start.
        rng: the random state the forward pass started from.
        version: the weights it ran with (``None`` when no optimizer step can intervene, k2 <= k1).
        hidden_grad: whether a backward pass may carry gradient into the input hidden state.
    """

    x: torch.Tensor
    hidden: Any
    rng: RNGState
    version: WeightVersion | None
    hidden_grad: bool


@dataclass(eq=False)
class Segment:
    """One model call over the steps ``[start, end)`` of a stream.

    Attributes:
        start: first step of the segment in the stream.
        end: end (exclusive) of the segment.
        inputs: leaf tensors of the input hidden state (empty at the stream's start).
        outputs: tensors of the output hidden state, still attached to the segment's graph.
        y_pred: prediction tensors whose loss gradient is still owed (``None`` once paid).
        y_grad: the (possibly scaled) loss gradient for ``y_pred``, computed when the segment ran.
        replay: how to recompute the segment (to rebuild the history after a checkpoint is loaded, or in
            recomputation mode, where ``outputs`` is ``None`` until the backward sweep rebuilds the graph).
    """

    start: int
    end: int
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor] | None
    y_pred: list[torch.Tensor] | None = None
    y_grad: list[torch.Tensor | None] | None = None
    replay: Replay | None = None

    def backward(self, hidden_grad: list[torch.Tensor | None] | None, retain: bool) -> list[torch.Tensor | None]:
        """Backpropagate the owed loss gradient and ``hidden_grad`` (for ``outputs``) through the segment.

        Returns:
            The gradient reaching each input leaf (``None`` where none does), taken off the leaves so that
            nothing leaks into a later window's backward pass.
        """
        tensors, grads = [], []
        if self.y_pred is not None:
            tensors += self.y_pred
            grads += self.y_grad
            self.y_pred = self.y_grad = None
        if hidden_grad is not None:
            tensors += self.outputs
            grads += hidden_grad
        pairs = [(t, g) for t, g in zip(tensors, grads) if g is not None and t.requires_grad]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs], retain_graph=retain)
        reached = [leaf.grad for leaf in self.inputs]
        for leaf in self.inputs:
            leaf.grad = None
        return reached


@dataclass(eq=False)
class History:
    """The segments of the current stream that a backward pass may still traverse, oldest first.

    Args:
        schedule: the stream's windows and cuts.
        rebuild: in recomputation mode, a context manager factory that rebuilds a segment's graph for the
            duration of its backward pass (the ``with`` block), then frees it.
    """

    schedule: Schedule
    rebuild: Callable[[Segment], AbstractContextManager] | None = None
    segments: list[Segment] = field(default_factory=list)

    def _traverse(self, segment: Segment, hidden_grad: list | None, retain: bool) -> list[torch.Tensor | None]:
        if segment.outputs is not None:
            return segment.backward(hidden_grad, retain)
        with self.rebuild(segment) if self.rebuild is not None else nullcontext():
            return segment.backward(hidden_grad, retain=False)

    def append(self, segment: Segment) -> None:
        """Add the stream's newest segment."""
        self.segments.append(segment)

    def clear(self) -> None:
        """Drop every retained graph (at the end of a stream)."""
        self.segments.clear()

    def backward(self, start: int, end: int, stream_continues: bool) -> None:
        """Backward pass of the window ``[start, end)``, then drop what no later window reaches.

        Every step's loss in the window flows back to the window's cut; with ``k2 < k1`` the steps before
        the cut (their own segments) get their own loss only. Gradients accumulate in the parameters'
        ``.grad``.

        Args:
            start: first step of the window.
            end: end (exclusive) of the window; the window's last segment must have been appended.
            stream_continues: whether more steps follow, so that later windows may reach back.
        """
        cut = self.schedule.cut(start, end)
        hidden_grad = None
        for segment in reversed(self.segments):
            if segment.start < cut:
                if segment.start < start:
                    break
                self._traverse(segment, None, retain=False)
                continue
            retain = stream_continues and self.schedule.reached_later(segment.start, start)
            reached = self._traverse(segment, hidden_grad, retain)
            hidden_grad = reached if segment.start > cut else None
        if stream_continues:
            self.segments = [s for s in self.segments if self.schedule.reached_later(s.start, start)]
        else:
            self.segments.clear()
