"""What the trainer does with each segment of a window, decided once, free of torch.

A *segment* is one model call over consecutive steps of a window. Before running it, the loop asks
:func:`plan_segment` where it ends and how its gradient is paid, and then only acts on the answer, a
:class:`SegmentPlan`. The rules follow from SPEC.md and from the cost of each choice:

- Steps before a k2 < k1 cut get only the gradient of their own loss: one step per segment, backpropagated
  at once, nothing retained.
- A segment that closes its window and that no later window reaches is backpropagated whole at once, as a
  hand-written loop does (every segment when k1 = k2).
- Any other segment's loss is backpropagated to its predictions at once (the loss graph, e.g. a large
  vocabulary's log-softmax, is freed) and the predictions' gradient is owed to the window's backward sweep,
  which traverses each segment once with the sum of that gradient and the hidden-state gradient of the
  segments after it (Williams & Peng 1990, BPTT(h; h'), by linearity). The window's last segment, whose
  sweep starts right after it, keeps its loss for the sweep's first traversal instead: one backward call
  fewer, and its loss graph is freed at the same point of the window.
- A segment that a later window reaches keeps its graph past this window's sweep and, since an optimizer
  step may come in between, the weights it ran with (:mod:`ignite_tbptt.runtime.weight_versions`).
- A segment also ends where some column of the batch starts a new sequence, so that the hidden-state reset
  falls between two model calls; batches without starts are run exactly as without them.
- A window whose gradient reach is recorded with a stride also ends a segment every ``stride`` steps.
- In recomputation mode (Chen et al. 2016, arXiv:1604.06174) segments that are not paid at once run without
  a graph and are rebuilt in the sweep, at most ``recompute`` steps at a time.
"""

from __future__ import annotations

from typing import NamedTuple

from .window import Window, WindowSource

__all__ = ["SegmentPlan", "plan_segment"]


class SegmentPlan(NamedTuple):
    """The decisions for one segment, ``[start, end)`` of a window (a named tuple: one is made per model call)."""

    #: First step of the segment (the stream's position when it runs).
    start: int
    #: End (exclusive) of the segment.
    end: int
    #: The segment's window as its source planned it (a stream's end may end it earlier).
    window: Window
    #: The window's backward sweep runs right after this segment.
    closes_window: bool
    #: The segment lies before the window's cut (k2 < k1): it gets only its own loss's gradient.
    own_loss_only: bool
    #: Its loss is backpropagated through the whole segment at once, so no loss gradient is owed.
    backward_now: bool
    #: It runs without a graph, and the backward sweep rebuilds it (recomputation mode).
    rebuilt: bool
    #: A later window's backward pass reaches it, if the stream goes on past it.
    reached_later: bool
    #: Its graph must keep the weights it ran with across optimizer steps.
    keep_weights: bool
    #: Gradient flows into its input hidden state: it starts after the lowest cut its window can have, or the
    #: window's gradient reach is recorded, which needs the gradient at the cut too.
    hidden_requires_grad: bool
    #: Its loss waits for the window's backward sweep, which starts right after it: its first traversal of the
    #: segment backpropagates the loss too, one backward call instead of two.
    loss_in_sweep: bool
    #: The loss is backpropagated as ``loss_fn`` returns it, the mean over the segment's targets, rather than
    #: their sum: the segment is its window and the window its optimizer step's only gradient (one window per
    #: step, one process), so the step would divide the sum by the same count. The gradient is then the one a
    #: hand-written loop computes.
    backward_mean: bool
    #: The window's backward sweep passes through it, so it joins the retained history: it owes its loss's
    #: gradient, or gradient flows into its input hidden state.
    joins_history: bool
    #: The segment is its window: its loss is the only one the window backpropagates. Paid at once or in the
    #: window's sweep alike: retained segments of earlier windows that the sweep passes through bring no loss of
    #: their own, their windows paid it.
    whole_window: bool
    #: Its loss is backpropagated to its predictions at once and their gradient owed to the sweep (per-token
    #: backward: the loss graph, a large vocabulary's log-softmax say, is freed right away).
    detaches_predictions: bool


def plan_segment(
    source: WindowSource,
    window: Window,
    step: int,
    batch_end: int,
    stream_end: int | None,
    recompute: int | None = None,
    next_start: int | None = None,
    stride: int | None = None,
    recorded: bool = False,
    one_window_per_step: bool = False,
) -> SegmentPlan:
    """Plan the segment that starts at ``step`` in ``window``.

    Args:
        source: the window source of the stream.
        window: the window that holds ``step``, as ``source`` planned it.
        step: first step of the segment, ``window.start <= step < window.end``.
        batch_end: end (exclusive) of the steps the current batch holds; a segment never passes it.
        stream_end: length of the stream, or ``None`` while unknown (a carried stream whose epoch length is
            unknown, before its last batch).
        recompute: in recomputation mode, the most steps a rebuilt segment may have; ``None`` otherwise.
        next_start: the first step after ``step`` where some column starts a new sequence, or ``None``.
        stride: if given, a segment also ends every ``stride`` steps from the window's start (a window whose
            gradient reach is recorded with a stride); the gradients do not change.
        recorded: the window's gradient reach is recorded (:class:`~ignite_tbptt.GradientReach`), which needs the
            gradient at its cut.
        one_window_per_step: each optimizer step applies one window of one process (no accumulation, no other
            process), so that a window of one segment may backpropagate its mean loss.

    Returns:
        The segment's :class:`SegmentPlan`.

    Examples:
        >>> from ignite_tbptt import Schedule, Window
        >>> s = Schedule(k1=4, k2=6)  # the next window's cut lies 2 steps before its start
        >>> first = plan_segment(s, s.window(0), 0, batch_end=10, stream_end=10)
        >>> first.end, first.backward_now, first.reached_later
        (2, False, False)
        >>> second = plan_segment(s, s.window(0), 2, batch_end=10, stream_end=10)
        >>> second.end, second.closes_window, second.keep_weights, second.loss_in_sweep
        (4, True, True, True)
        >>> whole = plan_segment(Schedule(4, 4), Window(0, 4, 0), 0, 10, 10, one_window_per_step=True)
        >>> whole.whole_window, whole.backward_now, whole.backward_mean, whole.joins_history
        (True, True, True, False)
    """
    if stream_end is not None:
        window_end: int | None = min(window.end, stream_end)
    else:  # known once the batch holds the whole window, since the stream goes on at least to the batch's end
        window_end = window.end if batch_end >= window.end else None
    end = min(source.boundary(window, step, stream_end), batch_end)
    if recompute is not None:  # segments of at most `recompute` steps bound the rebuilt graph
        end = min(end, step + recompute)
    if next_start is not None:  # the reset before a sequence's first step falls between two model calls
        end = min(end, next_start)
    if stride is not None:  # more segment starts, more points of the gradient-reach profile
        end = min(end, step + stride - (step - window.start) % stride)
    # The cut only moves forward as a window grows, so while the window's end is unknown, the cut of the
    # window cut short at the batch's end bounds it from below.
    lowest_cut = source.cut(window.start, window_end if window_end is not None else batch_end)
    own_loss_only = step < lowest_cut
    deferred = recompute is not None and not own_loss_only
    reached_later = end != stream_end and source.reaches_back(window, step)
    closes_window = end == window_end
    backward_now = own_loss_only or (not deferred and closes_window and not reached_later)
    keep_weights = reached_later and not deferred
    hidden_requires_grad = step > lowest_cut or (recorded and not own_loss_only)
    loss_in_sweep = not backward_now and closes_window and not deferred
    whole_window = step == window.start and closes_window and not own_loss_only
    joins_history = not own_loss_only and (not backward_now or hidden_requires_grad)
    # In the fields' order: keyword arguments would double the cost of the tuple, made once per model call.
    return SegmentPlan(
        step,
        end,
        window,
        closes_window,
        own_loss_only,
        backward_now,
        deferred,
        reached_later,
        keep_weights,
        hidden_requires_grad,
        loss_in_sweep,
        one_window_per_step and whole_window,
        joins_history,
        whole_window,
        not backward_now and not loss_in_sweep,
    )
