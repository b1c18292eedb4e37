"""The torch side of a TBPTT trainer: run a stream's segments as their plans say, free of ignite.

The process function (:mod:`ignite_tbptt.process`) asks :func:`~ignite_tbptt.plan.plan_segment` what to do with
each segment and fires ignite's events around the answer; a :class:`SegmentExecutor` only carries the plan out:
the model call, the segment's per-token backward or the loss gradient it owes to its window's backward sweep, what
the retained history keeps, and the sweep when the window closes. As in ``torch.distributed.pipelining``, where a
schedule is data and one runtime executes it, another executor (CUDA graphs, say) can run the same plans.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from . import hidden as hs
from . import rng
from .backward_sweep import Replay, RetainedHistory, Segment
from .batch import check_resettable
from .forward import ModelCall
from .plan import SegmentPlan
from .stream import StreamState

__all__ = ["SegmentExecutor", "profiled"]

# Reentrant and stateless: one instance serves every "no context" of a window, without an allocation each time.
_NO_CONTEXT = nullcontext()


def profiled(name: str) -> AbstractContextManager:
    """A ``torch.profiler`` range ``name`` while a profiler runs, else nothing (a range costs about 10 µs)."""
    return torch.profiler.record_function(name) if torch.autograd._profiler_enabled() else _NO_CONTEXT


class SegmentExecutor:
    """Runs the segments of one stream and the backward sweeps of its windows.

    Args:
        model_call: runs the model on a segment.
        loss_fn: ``loss_fn(y_pred, y)``, reducing by mean over its targets.
        stream: the stream's state; the executor advances its position, hidden state, retained history and the
            open window's loss and target count.
        scaler: the ``GradScaler`` every backward is scaled by, or ``None``.
        target_count_fn: ``target_count_fn(y_pred, y) -> int``, or ``None`` for ``y.numel()``.
    """

    def __init__(
        self,
        model_call: ModelCall,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        stream: StreamState,
        scaler: torch.amp.GradScaler | None,
        target_count_fn: Callable[[Any, Any], int] | None,
    ) -> None:
        self.model_call, self.loss_fn, self.stream = model_call, loss_fn, stream
        self.scaler, self.target_count_fn = scaler, target_count_fn
        self.check_columns: int | None = None  # columns the default reset must handle, checked at the next call

    @property
    def history(self) -> RetainedHistory:
        """The stream's retained segments."""
        return self.stream.history

    def run(
        self,
        plan: SegmentPlan,
        x: Any,
        y: Any,
        resets: torch.Tensor | None,
        recording: bool = False,
        keep_predictions: bool = False,
        as_mean: bool = False,
    ) -> tuple[Any, int, bool, Any]:
        """Run the segment as ``plan`` says: forward, pay or owe its loss gradient, retain what is needed.

        Args:
            plan: the segment's plan.
            x: its input, ``(T, B, *)`` narrowed to the plan's steps along the time dimension.
            y: its targets, narrowed alike.
            resets: the columns (shape ``(B,)``, bool) that start a new sequence at its first step, or ``None``.
            recording: the window's gradient reach is recorded, which needs the gradient at its cut too.
            keep_predictions: return the detached predictions (for ``output_transform``).
            as_mean: backpropagate the loss as ``loss_fn`` returns it, the mean over the segment's targets, rather
                than their sum: for a segment that is its optimizer step's only one (``plan.whole_window``, one
                window per step, one process), where the step would divide the sum by the same count. The
                gradient is then the one a hand-written loop computes, without two multiplications and a
                division.

        Returns:
            The segment's per-target loss (a detached 0-dim tensor, or 0.0 without targets); its target count;
            whether that loss is the mean over the targets rather than their sum (with ``as_mean``, and for a
            window of one segment, whose mean is then read as it is); and its detached predictions if
            ``keep_predictions`` else ``None``.

        Raises:
            TypeError: if ``loss_fn`` returns something other than a tensor.
            ValueError: if it returns a tensor of more than 0 dimensions, or one without a graph.
        """
        stream = self.stream
        hidden, versions = stream.hidden, stream.history.versions
        # A recorded window also needs the gradient at its cut, which its sweep otherwise does not compute.
        requires_grad = plan.hidden_requires_grad or (recording and plan.retained)
        hidden_in, inputs = (None, []) if hidden is None else hs.as_leaves(hidden, requires_grad)
        replay = None
        if plan.loss_owed:
            version = versions.current if versions is not None else None
            replay = Replay(x, hidden_in, rng.capture(x.device), version, requires_grad, resets)
        with torch.no_grad() if plan.recompute else _NO_CONTEXT, profiled("tbptt.forward"):
            y_pred, hidden_out = self.model_call(x, hidden_in, versions, plan.keep_weights, resets)
        if self.check_columns is not None:  # before the first reset uses it, and before any backward
            check_resettable(hidden_out, self.check_columns)
            self.check_columns = None
        n = y.numel() if self.target_count_fn is None else int(self.target_count_fn(y_pred, y))
        # The window's sweep starts right after its last segment, so that segment's loss is backpropagated
        # with the sweep's first traversal of it: one backward call instead of two.
        with_sweep = plan.loss_owed and plan.closes_window and not plan.recompute
        y_owed = None
        if plan.loss_owed and not with_sweep:
            # Per-token backward: the loss graph (e.g. a large-vocabulary log-softmax) is freed right away;
            # only the gradient of the predictions waits for the window's backward sweep.
            y_owed = [t.detach().requires_grad_(t.requires_grad or plan.recompute) for t in hs.flatten(y_pred)]
        loss: Any = 0.0
        root = None
        is_mean = as_mean or plan.whole_window  # no division when the window's mean is read
        if n:
            with self.model_call.autocast():
                mean = _checked(self.loss_fn(y_pred if y_owed is None else hs.unflatten(y_pred, y_owed), y))
                # A sum over the targets, unless as_mean: the optimizer step divides by the count of all its windows.
                loss = mean if as_mean else mean * n
            root = self.scaler.scale(loss) if self.scaler is not None else loss
            if not with_sweep:
                with profiled("tbptt.segment_backward"):
                    root.backward()
                root = None
            loss = (mean if is_mean else loss).detach()
        if plan.retained and (plan.loss_owed or requires_grad):
            # Paid at once, a segment only hands the sweep the gradient its input leaves received (none when they
            # take none: a window of one segment from its cut, as every window at k1 = k2).
            segment = Segment(plan.start, plan.end, inputs, [])
            if with_sweep:
                segment.replay, segment.loss = replay, root
                segment.outputs = hs.flatten(hidden_out)
            elif plan.loss_owed:
                segment.replay, segment.y_grad = replay, [t.grad for t in y_owed] if n else None
                if plan.recompute:  # the sweep builds its graph again
                    segment.inputs, segment.outputs = [], None
                else:
                    segment.outputs, segment.y_pred = hs.flatten(hidden_out), hs.flatten(y_pred) if n else None
            stream.history.append(segment)
        stream.hidden, stream.position = hidden_out, plan.end
        stream.window_loss.add(loss, n, is_mean)
        return loss, n, is_mean, hs.detached(y_pred) if keep_predictions else None

    def close_window(self, start: int, cut: int, next_cut: int | None, recording: bool) -> list | None:
        """The backward sweep of the window that starts at ``start``; see :meth:`RetainedHistory.backward`.

        The stream's source gives the factors of the hidden-state gradient inside the window (ARTBP's
        compensation), asked only when a sweep runs.

        Returns:
            The ``(step, gradients)`` the sweep gathered if ``recording``, else ``None``.
        """
        if not recording and not self.stream.history.segments:  # every segment was paid at once (k1 = k2, say)
            return None
        reach: list | None = [] if recording else None
        with profiled("tbptt.sweep"):
            self.stream.history.backward(start, cut, next_cut, reach, self.stream.source.compensation(start))
        return reach


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
