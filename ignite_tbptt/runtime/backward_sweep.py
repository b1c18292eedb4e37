"""The retained segments of a stream and the backward sweep of each window.

A *segment* is one model call over consecutive steps. Its graph starts at leaf copies of its input hidden
state and ends at its output hidden state and its predictions. A window's backward sweep visits its segments
from the last to the cut, each exactly once: every segment is backpropagated with the sum of both gradients
that reach it, the loss gradient of its own predictions (if still owed) and the hidden-state gradient that
the later segments left on its successor's input leaves. By linearity of backpropagation this equals
backpropagating every step's loss separately to the window's cut (Williams & Peng, 1990, BPTT(h; h')), at
the cost of one traversal per segment and window: ``k2 / k1`` backward traversals per step on average.

Graphs cannot be saved, so a checkpoint of the history holds what rebuilds them: each segment's input, input
hidden state, random state, owed loss gradient and the weights it ran with (one copy per optimizer step still
reached). Recomputation mode rebuilds each graph the same way, just before the sweep traverses it (Chen et
al., 2016, "Training deep nets with sublinear memory cost", arXiv:1604.06174, section 3; as
``torch.utils.checkpoint``, but with the weights of the segment's own optimizer step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ..planning import ClosePlan
from . import hidden as hs
from . import rng
from .compiled import retainable
from .model_call import ModelCall
from .reset import stop_gradient
from .weight_versions import ParameterVersions, WeightVersion

__all__ = ["Recomputation", "Segment", "RetainedHistory", "load_weights", "reach_profile"]


@dataclass(eq=False)
class Recomputation:
    """What recomputing a segment's forward pass needs: its input, input hidden state, random state and weights.

    Attributes:
        x: the segment's input, ``x`` narrowed to its steps along the time dimension.
        hidden: the input hidden state (the leaves the segment ran from), or ``None`` at the stream's start.
        rng: the random state the forward pass started from.
        version: the weights it ran with (``None`` when no optimizer step can intervene, k2 <= k1).
        hidden_requires_grad: whether a backward pass may carry gradient into the input hidden state.
        starts: the columns that start a sequence at the segment's first step, shape ``(B,)``, or ``None``.
        stops: the columns whose gradient stops at the segment's input state (a burn-in without gradient ends
            there), shape ``(B,)``, or ``None``.
        graph_free: whether no gradient can reach the segment (every column inside a burn-in run without
            gradient): it runs again without a graph.
    """

    x: torch.Tensor
    hidden: Any
    rng: rng.RNGState
    version: WeightVersion | None
    hidden_requires_grad: bool
    starts: torch.Tensor | None = None
    stops: torch.Tensor | None = None
    graph_free: bool = False


@dataclass(eq=False)
class Segment:
    """One model call over the steps ``[start, end)`` of a stream.

    Attributes:
        start: first step of the segment in the stream.
        end: end (exclusive) of the segment.
        inputs: leaf tensors of the input hidden state (empty at the stream's start).
        outputs: tensors of the output hidden state, still attached to the segment's graph (``None`` while a
            recomputed segment's graph is not built).
        y_pred: prediction tensors whose loss gradient is still owed (``None`` once paid).
        y_grad: the (possibly scaled) loss gradient for ``y_pred``, computed when the segment ran.
        recomputation: how to recompute the segment, for checkpoints and recomputation mode.
        loss: the (possibly scaled) loss of a window's last segment, still attached to its predictions: its
            window's sweep starts right after it ran, so the first traversal backpropagates the loss with it, in
            one call instead of two. The loss graph is freed with that traversal.
    """

    start: int
    end: int
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor] | None
    y_pred: list[torch.Tensor] | None = None
    y_grad: list[torch.Tensor | None] | None = None
    recomputation: Recomputation | None = None
    loss: torch.Tensor | None = None

    def backward(self, hidden_grad: list[torch.Tensor | None] | None, retain: bool) -> list[torch.Tensor | None]:
        """Backpropagate the owed loss gradient and ``hidden_grad`` (for ``outputs``) through the segment.

        Returns:
            The gradient reaching each input leaf (``None`` where none does), taken off the leaves so that
            nothing leaks into a later window's backward pass.
        """
        roots: list[torch.Tensor] = []
        grads: list[torch.Tensor | None] = []
        if self.y_pred is not None:
            assert self.y_grad is not None  # predictions are kept only with the gradient they are owed
            _add_roots(roots, grads, self.y_pred, self.y_grad)
            self.y_pred = self.y_grad = None
        if hidden_grad is not None:
            assert self.outputs is not None  # a segment is traversed with its graph, built or rebuilt
            _add_roots(roots, grads, self.outputs, hidden_grad)
        if self.loss is not None:
            roots.append(self.loss)
            grads.append(None)  # a 0-dim root: autograd seeds it with one
            self.loss = None
        if roots:
            torch.autograd.backward(roots, grads, retain_graph=retain)
        reached = [leaf.grad for leaf in self.inputs]
        for leaf in self.inputs:
            leaf.grad = None
        return reached


def _recomputation_of(segment: Segment) -> Recomputation:
    if segment.recomputation is None:  # every segment the history keeps has one; a Segment made by hand may not
        raise RuntimeError(f"the segment [{segment.start}, {segment.end}) was kept without what rebuilds it.")
    return segment.recomputation


def _add_roots(roots: list, grads: list, tensors: list[torch.Tensor], gradients: list) -> None:
    # The tensors that take a gradient, with it.
    for t, g in zip(tensors, gradients):
        if g is not None and t.requires_grad:
            roots.append(t)
            grads.append(g)


def reach_profile(
    gathered: list, end: int, targets: int, backpropagated_mean: bool, scaler: torch.amp.GradScaler | None
) -> dict[int, float]:
    """The gradient reach of a window: what :meth:`RetainedHistory.backward` gathered, as lag -> gradient norm.

    The norm is that of the gradient of the window's mean per-target loss (SPEC.md's normalisation), whatever the
    window backpropagated: its loss scaled by the ``GradScaler``, and the sum over its targets unless it
    backpropagated their mean.

    Args:
        gathered: ``(step, gradients)`` pairs from the sweep of the window ending at ``end``.
        end: end of the window.
        targets: the window's target count.
        backpropagated_mean: the window backpropagated its mean loss (``SegmentPlan.backward_mean``), not the sum.
        scaler: the ``GradScaler`` the backward passes were scaled by, or ``None`` (its scale is one host read).

    Returns:
        ``end - step`` -> L2 norm over all tensors of the hidden state, by increasing lag (one host read).
    """
    sums = []
    for _, grads in gathered:
        squares = [g.detach().double().pow(2).sum() for g in grads if g is not None]
        sums.append(torch.stack(squares).sum() if squares else None)
    if not sums:
        return {}
    scale = scaler.get_scale() if scaler is not None else 1.0
    divisor = 1 if backpropagated_mean else max(targets, 1)
    device = next((t.device for t in sums if t is not None), torch.device("cpu"))
    zero = torch.zeros((), dtype=torch.float64, device=device)
    norms = torch.stack([zero if t is None else t for t in sums]).sqrt().tolist()
    return dict(sorted((end - step, norm / scale / divisor) for (step, _), norm in zip(gathered, norms)))


@torch.no_grad()
def load_weights(params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    """Copy ``values`` into ``params`` in place (both in the optimizer's parameter order)."""
    for p, v in zip(params, values):
        p.copy_(v)


class RetainedHistory:
    """The segments of the current stream that a backward sweep may still traverse, oldest first.

    Args:
        model_call: runs the model, to rebuild graphs.
        parameters: the parameters the optimizer updates, in its order.
        versions: the weight versions of a trainer whose graphs outlive optimizer steps (k2 > k1), else ``None``
            (:meth:`keep_weight_versions` adds them later).
        rebuilds: recomputation mode: graphs are built only while the sweep traverses them.
    """

    def __init__(
        self,
        model_call: ModelCall,
        parameters: Callable[[], list[torch.Tensor]],
        versions: ParameterVersions | None,
        rebuilds: bool,
    ) -> None:
        self.model_call, self.parameters, self.versions, self.rebuilds = model_call, parameters, versions, rebuilds
        self.segments: list[Segment] = []

    def keep_weight_versions(self) -> None:
        """Keep the weights retained graphs need across optimizer steps from now on (a window source reaching back)."""
        if self.versions is None:
            self.versions = ParameterVersions(self.parameters, self.model_call.model)

    def _versions(self) -> ParameterVersions:
        if self.versions is None:  # only graphs that outlive an optimizer step have older weights
            raise RuntimeError("the retained history keeps no weight versions: its windows never reach back.")
        return self.versions

    def append(self, segment: Segment) -> None:
        """Add the stream's newest segment."""
        self.segments.append(segment)

    def clear(self) -> None:
        """Drop every retained graph (at the end of a stream, or after a skipped optimizer step)."""
        self.segments.clear()

    def starts(self) -> list[int]:
        """The first step of each retained segment, oldest first, as :func:`~ignite_tbptt.planning.plan_close` takes."""
        segments = self.segments
        return [segment.start for segment in segments] if segments else []  # none at k1 = k2: no comprehension

    def backward(self, plan: ClosePlan, reach: list | None = None) -> None:
        """The backward sweep of a window as ``plan`` says, then drop the segments the next window does not reach.

        Every step's loss in the window flows back to the window's cut; segments of the window that lie
        before the cut (k2 < k1) get their own loss only. Gradients accumulate in the parameters' ``.grad``.

        Args:
            plan: the window's close, planned from :meth:`starts` (its last segment must have been appended).
            reach: if a list, each traversed segment from the cut on appends ``(step, gradients)``: the gradient
                of the window's (scaled, summed) loss reaching its input hidden state, one entry per tensor.
        """
        if not self.segments:  # every segment was paid at once (k1 = k2, say): nothing to sweep or drop
            return
        segments = self.segments
        # Graphs the next window traverses again are backpropagated with retain_graph: one switch for the sweep.
        with retainable(plan.retains):
            hidden_grad = None
            for step in plan.sweep:
                segment = segments[step.segment]
                if step.own_loss_only:
                    self._traverse(segment, None, retain=False)
                    continue
                reached = self._traverse(segment, hidden_grad, step.retain)
                if step.factor is not None:
                    reached = [None if g is None else g * step.factor for g in reached]
                if reach is not None and reached:
                    reach.append((segment.start, reached))
                hidden_grad = reached if step.passes_on else None
        self.segments = segments[plan.keep_from :]

    def _traverse(self, segment: Segment, hidden_grad: list | None, retain: bool) -> list[torch.Tensor | None]:
        if segment.outputs is not None:
            return segment.backward(hidden_grad, retain)
        with self._rebuilt(segment):
            return segment.backward(hidden_grad, retain=False)

    def recompute(self, recomputation: Recomputation, keep_weights: bool) -> tuple[list[torch.Tensor], Any, Any]:
        """Run a segment's forward pass again from ``recomputation``, with the weights the model holds now.

        Returns:
            The new input hidden-state leaves, the predictions and the output hidden state.
        """
        r = recomputation
        hidden_in, inputs = (None, []) if r.hidden is None else hs.as_leaves(r.hidden, r.hidden_requires_grad)
        if r.stops is not None and hidden_in is not None:
            hidden_in = stop_gradient(hidden_in, r.stops)
        with rng.restored(r.rng, r.x.device), torch.no_grad() if r.graph_free else nullcontext():
            y_pred, hidden_out = self.model_call(r.x, hidden_in, self.versions, keep_weights, r.starts)
        return inputs, y_pred, hidden_out

    @contextmanager
    def _rebuilt(self, segment: Segment) -> Iterator[None]:
        """Recompute ``segment``'s graph with the weights and random state it first ran with, for one backward."""
        recomputation = _recomputation_of(segment)
        params = self.parameters()
        version = recomputation.version if recomputation.version is not None and recomputation.version.frozen else None
        old = version is not None
        current = [p.detach().clone() for p in params] if old else None
        # The parameters are borrowed and given back bit for bit: their version counters say so. Counted, the two
        # copies would read as a change to the graphs that saved the live parameters since the last step (the
        # window's own segments, kept for the next window: a window that a window program's segments reach).
        kept = torch.autograd._unsafe_preserve_version_counter(tuple(params)) if old else nullcontext()
        with kept:
            if version is not None:
                load_weights(params, self._versions().values(version))
            try:
                inputs, y_pred, hidden_out = self.recompute(recomputation, keep_weights=False)
                segment.inputs, segment.outputs = inputs, hs.flatten(hidden_out)
                if segment.y_grad is not None:
                    segment.y_pred = hs.flatten(y_pred)
                yield
            finally:
                segment.inputs, segment.outputs, segment.y_pred = [], None, None
                if current is not None:
                    load_weights(params, current)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What rebuilds the history: ``segments`` (input, hidden state, random state, owed gradient, weights)."""
        versions: list[WeightVersion] = []
        for segment in self.segments:
            version = _recomputation_of(segment).version
            if version is not None and all(version is not v for v in versions):
                versions.append(version)
        segments = []
        for segment in self.segments:
            recomputation = _recomputation_of(segment)
            segments.append(
                {
                    "start": segment.start,
                    "end": segment.end,
                    "x": recomputation.x,
                    "hidden": hs.detached(recomputation.hidden),
                    "hidden_requires_grad": recomputation.hidden_requires_grad,
                    "starts": recomputation.starts,
                    "stops": recomputation.stops,
                    "graph_free": recomputation.graph_free,
                    "rng": recomputation.rng,
                    "version": next((i for i, v in enumerate(versions) if v is recomputation.version), None),
                    "y_grad": segment.y_grad,
                }
            )
        return {
            "segments": segments,
            "weights": [[t.clone() for t in self._versions().values(v)] for v in versions] if versions else [],
            "current_weights": next((i for i, v in enumerate(versions) if not v.frozen), None),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rebuild the history of :meth:`state_dict` (once the model and the optimizer hold the checkpoint's values).

        The forward passes run again with their saved weights, random state and input, under the same hooks as
        in training, which on a deterministic device gives the graphs of the uninterrupted run bit for bit. The
        parameters are borrowed for this (older weights are copied in and out again) and end as they were, also
        when a forward pass raises: then no segment is kept.

        Raises:
            ValueError: if the history holds graphs of older weights (windows that reach back across optimizer
                steps, k2 > k1) and this trainer's windows never do.
        """
        self.clear()
        if not state["segments"]:
            return
        if state["weights"] and self.versions is None:
            raise ValueError(
                "the checkpoint retains graphs across optimizer steps (windows reaching back, k2 > k1), and this "
                "trainer's windows never reach back: build it with the checkpoint's k1 and k2 to resume."
            )
        params = self.parameters()
        current = [p.detach().clone() for p in params]
        loaded = state["current_weights"]  # the live parameters are the current weights
        self.model_call.model.train()
        try:
            for saved in state["segments"]:
                if saved["version"] != loaded:
                    if loaded is not None:
                        self._versions().freeze()
                    load_weights(params, state["weights"][saved["version"]])
                    loaded = saved["version"]
                self.append(self._rebuilt_segment(saved))
        except BaseException:
            self.clear()
            raise
        finally:
            if loaded != state["current_weights"]:
                self._versions().freeze()
                load_weights(params, current)

    def _rebuilt_segment(self, saved: dict[str, Any]) -> Segment:
        version = self.versions.current if self.versions is not None else None
        recomputation = Recomputation(
            saved["x"],
            saved["hidden"],
            saved["rng"],
            version,
            saved["hidden_requires_grad"],
            saved.get("starts"),
            saved.get("stops"),
            saved.get("graph_free", False),
        )
        segment = Segment(saved["start"], saved["end"], [], None, None, saved["y_grad"], recomputation)
        if not self.rebuilds:  # recomputation mode rebuilds graphs in the sweep anyway
            segment.inputs, y_pred, hidden_out = self.recompute(recomputation, keep_weights=self.versions is not None)
            segment.outputs = hs.flatten(hidden_out)
            segment.y_pred = hs.flatten(y_pred) if saved["y_grad"] is not None else None
        return segment
