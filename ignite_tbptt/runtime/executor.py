"""The torch side of a TBPTT trainer: run a stream's segments as their plans say, free of ignite.

The stream loop (:mod:`ignite_tbptt.engine.stream_loop`) asks :func:`~ignite_tbptt.planning.plan_segment` what to
do with each segment, and the process function fires ignite's events around it; a :class:`SegmentExecutor` only
carries the plan out: the model call, the segment's per-token backward or the loss gradient it owes to its window's
backward sweep, what the retained history keeps, and the sweep when the window closes. As in
``torch.distributed.pipelining``, where a schedule is data and one runtime executes it, a second executor runs the
same plans: :class:`~ignite_tbptt.runtime.programs.window.ProgramExecutor` (``cuda_graphs``) runs a window whole
as one program where :func:`~ignite_tbptt.planning.plan_window` says so, and the other segments as this one does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..planning import ClosePlan, SegmentPlan
from . import hidden as hs
from . import rng
from .backward_sweep import Recomputation, Segment
from .in_place import StateWrittenInPlace
from .loss_rule import LossRule
from .model_call import ModelCall
from .module_state import check_attributes, check_state_cut
from .profiling import NO_CONTEXT, profiled, profiling
from .reset import check_resettable, stop_gradient
from .stream import StreamState

__all__ = ["SegmentExecutor", "SegmentResult"]


class SegmentResult(NamedTuple):
    """What one segment gave (a named tuple: one is made per model call)."""

    #: Its per-target loss, a detached 0-dim tensor (0.0 without targets): the mean over its targets where the
    #: segment is its window (``plan.whole_window``), else their sum.
    loss: Any
    #: Its target count.
    targets: int
    #: Its detached predictions if asked for, else ``None``.
    predictions: Any


class SegmentExecutor:
    """Runs the segments of one stream and the backward sweeps of its windows.

    Args:
        model_call: runs the model on a segment.
        loss: how a segment's loss is computed and backpropagated (``loss_fn``, autocast, the scaler).
        stream: the stream's state; the executor advances its position, hidden state, retained history and the
            open window's loss and target count.
        target_count_fn: ``target_count_fn(y_pred, y) -> int``, or ``None`` for ``y.numel()``.
    """

    def __init__(
        self,
        model_call: ModelCall,
        loss: LossRule,
        stream: StreamState,
        target_count_fn: Callable[[Any, Any], int | torch.Tensor] | None,
    ) -> None:
        self.model_call, self.loss, self.stream, self.target_count_fn = model_call, loss, stream, target_count_fn
        #: Run a segment's backward pass even where it has no targets, on a zero loss: every process of a model
        #: sharded by FSDP2 must make the same backward calls, whose hooks gather weights and reduce gradients.
        self.backward_without_targets = False
        self._columns_to_check: int | None = None  # columns the default reset must handle, checked at the next call
        self._state_cut_checked = False  # whether a call's returned state was checked not to grow from the last one

    def expect_columns(self, columns: int) -> None:
        """Check at the next model call, before any reset or backward, that the default reset handles ``columns``."""
        self._columns_to_check = columns

    def run(
        self,
        plan: SegmentPlan,
        x: Any,
        y: Any,
        resets: torch.Tensor | None,
        keep_predictions: bool = False,
        stops: torch.Tensor | None = None,
        graph_free: bool = False,
    ) -> SegmentResult:
        """Run the segment as ``plan`` says: forward, pay or owe its loss gradient, retain what is needed.

        Args:
            plan: the segment's plan; every decision below is one of its fields.
            x: its input, ``(T, B, *)`` narrowed to the plan's steps along the time dimension.
            y: its targets, narrowed alike.
            resets: the columns (shape ``(B,)``, bool) that start a new sequence at its first step, or ``None``.
            keep_predictions: return the detached predictions (for ``output_transform``).
            stops: the columns (shape ``(B,)``, bool) whose gradient stops at the segment's input state (the end of
                a burn-in run without gradient, :func:`~ignite_tbptt.runtime.stop_gradient`), or ``None``.
            graph_free: no gradient can reach the segment (every column inside a burn-in run without gradient): its
                forward pass builds no graph. Ignored where every segment must make its backward call (FSDP2).

        Returns:
            A :class:`SegmentResult`. The stream's position, hidden state, retained history and open window's loss
            are advanced.

        Raises:
            TypeError: if ``loss_fn`` returns something other than a tensor.
            ValueError: if it returns a tensor of more than 0 dimensions, or one without a graph; if
                ``target_count_fn`` counts more targets than ``y`` has elements, or fewer than none.
            StateWrittenInPlace: if the model wrote into the hidden state it was given, naming the leaf, the segment
                and its window.
            RuntimeError: at the stream's second call, if the returned state's graph reaches the state the first
                returned: the model does not read the state it is given (:func:`check_state_cut`).
        """
        stream = self.stream
        hidden = stream.hidden
        hidden_in, inputs = (None, []) if hidden is None else hs.as_leaves(hidden, plan.hidden_requires_grad)
        # Not before the state-cut check has run once (it needs a graph), nor where every call must backpropagate.
        graph_free = graph_free and self._state_cut_checked and not self.backward_without_targets
        recomputation = None if plan.backward_now else self._rerun(plan, x, hidden_in, resets, stops, graph_free)
        y_pred, hidden_out = self._forward(plan, x, hidden_in, resets, stops, graph_free)
        if not self._state_cut_checked and not graph_free and hs.has_graph(hidden):  # once, before its backward
            check_state_cut(hidden_out, hidden)
            self._state_cut_checked = True
        if self._columns_to_check is not None:  # before the first reset uses it, and before any backward
            check_resettable(hidden_out, self._columns_to_check)
            self._columns_to_check = None
        n = y.numel() if self.target_count_fn is None else self._count(y_pred, y, graph_free)
        y_owed = None
        if plan.detaches_predictions:
            y_owed = [t.detach().requires_grad_(t.requires_grad or plan.rebuilt) for t in hs.flatten(y_pred)]
        loss: Any = 0.0
        root = None
        backward = n or self.backward_without_targets and any(t.requires_grad for t in hs.flatten(y_owed or y_pred))
        if backward:
            rule = self.loss
            mean = rule.mean(y_pred if y_owed is None else hs.unflatten(y_pred, y_owed), y, n, hidden_out)
            loss = rule.backpropagated(mean, n, plan.backward_mean)
            root = rule.root(loss)
            if not plan.loss_in_sweep:
                if profiling():
                    with profiled("tbptt.segment_backward"):
                        torch.autograd.backward(root)
                else:
                    torch.autograd.backward(root)
                root = None
            loss = (mean if plan.whole_window else loss).detach()  # a window's only loss is read as its mean
        if plan.joins_history:
            # Paid at once, a segment only hands the sweep the gradient its input leaves received (none when they
            # take none: a window of one segment from its cut, as every window at k1 = k2).
            segment = Segment(plan.start, plan.end, inputs, [])
            if plan.loss_in_sweep:
                segment.recomputation, segment.loss = recomputation, root
                segment.outputs = hs.flatten(hidden_out)
            elif y_owed is not None:  # not plan.backward_now (detaches_predictions, here): its gradient is owed
                segment.recomputation, segment.y_grad = recomputation, [t.grad for t in y_owed] if backward else None
                if plan.rebuilt:  # the sweep builds its graph again
                    segment.inputs, segment.outputs = [], None
                else:
                    segment.outputs, segment.y_pred = hs.flatten(hidden_out), hs.flatten(y_pred) if backward else None
            stream.history.append(segment)
        stream.hidden, stream.position = hidden_out, plan.end
        stream.window_loss.add(loss, n, plan.whole_window)
        return SegmentResult(loss, n, hs.detached(y_pred) if keep_predictions else None)

    def _rerun(
        self, plan: SegmentPlan, x: Any, hidden_in: Any, resets: Any, stops: Any, graph_free: bool
    ) -> Recomputation:
        # What runs a segment whose graph may be traversed later again: in the sweep, or from a checkpoint.
        versions = self.stream.history.versions
        version = versions.current if versions is not None else None
        requires_grad = plan.hidden_requires_grad
        return Recomputation(x, hidden_in, rng.capture(x.device), version, requires_grad, resets, stops, graph_free)

    def _count(self, y_pred: Any, y: Any, burn_in_only: bool = False) -> int:
        assert self.target_count_fn is not None, "called only with one"
        n = int(self.target_count_fn(y_pred, y))
        if burn_in_only and n:
            raise ValueError(
                f"target_count_fn counted {n} targets in a segment whose targets are all a burn-in's, marked as "
                "padding (NaN, or -100): count the targets that are not padding, as count_targets does."
            )
        if isinstance(y, torch.Tensor) and not 0 <= n <= y.numel():
            raise ValueError(
                f"target_count_fn counted {n} targets in a segment whose y has {y.numel()} elements: it is called as "
                "target_count_fn(y_pred, y) and must count y's targets; count_targets as it is does."
            )
        return n

    def _forward(
        self,
        plan: SegmentPlan,
        x: Any,
        hidden_in: Any,
        resets: torch.Tensor | None,
        stops: torch.Tensor | None = None,
        graph_free: bool = False,
    ) -> tuple[Any, Any]:
        versions = self.stream.history.versions
        if stops is not None and hidden_in is not None:  # a burn-in without gradient ends: the columns' gradient stops
            hidden_in = stop_gradient(hidden_in, stops)
        try:
            if plan.rebuilt or graph_free or profiling():
                with torch.no_grad() if plan.rebuilt or graph_free else NO_CONTEXT, profiled("tbptt.forward"):
                    return self.model_call(x, hidden_in, versions, plan.keep_weights, resets)
            # The usual call, without a context to enter (each costs about a microsecond).
            return self.model_call(x, hidden_in, versions, plan.keep_weights, resets)
        except StateWrittenInPlace as error:
            where = f"the segment [{plan.start}, {plan.end}) of the window [{plan.window.start}, {plan.window.end})"
            raise error.locate(where) from error.__cause__

    def check_attributes(self, model: torch.nn.Module) -> None:
        """Refuse a model that keeps a graph in an attribute after the first window (:func:`check_attributes`).

        The state the stream carries and the one the last model call returned (a segment rebuilt in the sweep, in
        recomputation mode) are the tensors a model may cache in its attributes; the call stops keeping the latter.

        Raises:
            RuntimeError: naming the attributes, with the fix.
        """
        model_call = self.model_call
        try:
            check_attributes(model, returned=(self.stream.hidden, model_call.returned))
        finally:
            model_call.forget_returned()

    def close_window(self, plan: ClosePlan) -> list | None:
        """The backward sweep of a window as its ``plan`` says; see :meth:`RetainedHistory.backward`.

        Returns:
            The ``(step, gradients)`` the sweep gathered if the plan records the window's reach, else ``None``.
        """
        history = self.stream.history
        if not plan.recorded and not history.segments:  # every segment was paid at once (k1 = k2, say)
            return None
        reach: list | None = [] if plan.recorded else None
        with profiled("tbptt.sweep"):
            history.backward(plan, reach)
        return reach
