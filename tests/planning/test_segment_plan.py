"""The segment plan against SPEC.md's windows and cuts, written out here again (``spec_cut``)."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ignite_tbptt import Schedule
from ignite_tbptt.planning import plan_segment

from ..reference import spec_cut


def spec_windows(k1, k2, length):
    """SPEC.md: a window ends after every k1 steps of the stream and at its end; (start, end, cut) each."""
    return [(a, min(a + k1, length), spec_cut(k1, k2, a, min(a + k1, length))) for a in range(0, length, k1)]


def plan_stream(k1, k2, lengths, known, recompute, starts=(), stride=None, one_window_per_step=False, ends=None):
    """Plan a carried stream cut into batches of ``lengths`` as the trainer's loop does, window by window.

    The stream's end is known in its last batch when the epoch's length is (``known``), else only after it.
    ``starts``: the steps where some column starts a sequence; ``stride``: every window's reach is recorded
    with that stride; ``one_window_per_step``: each optimizer step applies one window of one process. ``ends``, a
    list, receives each plan's window end where it is known when the segment runs (else ``None``).
    """
    source = Schedule(k1, k2)
    plans, windows = [], []
    position, window = 0, None
    bounds = list(itertools.accumulate(lengths))
    for i, batch_end in enumerate(bounds):
        stream_end = batch_end if known and i == len(bounds) - 1 else None
        while position < batch_end:
            window = window or source.window(position)
            next_start = min((t for t in starts if t > position), default=None)
            plan = plan_segment(
                source,
                window,
                position,
                batch_end,
                stream_end,
                recompute,
                next_start,
                stride,
                recorded=stride is not None,
                one_window_per_step=one_window_per_step,
            )
            assert plan.start == position < plan.end <= batch_end
            if ends is not None:
                known_end = min(window.end, stream_end) if stream_end is not None else window.end
                ends.append(known_end if stream_end is not None or batch_end >= window.end else None)
            plans.append((plan, window.start))
            position = plan.end
            if plan.closes_window:
                windows.append((window.start, plan.end))
                window = None
    if window is not None:  # the epoch ends the window it leaves open
        windows.append((window.start, position))
    return plans, windows


stream = dict(
    k1=st.integers(1, 6),
    k2=st.integers(1, 13),
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    known=st.booleans(),
    recompute=st.one_of(st.none(), st.integers(1, 4)),
    starts=st.one_of(st.just(()), st.sets(st.integers(0, 48), max_size=12)),
    stride=st.one_of(st.none(), st.integers(1, 4)),
)


@settings(max_examples=300, deadline=None)
@given(**stream)
def test_windows_tile_the_stream_as_the_spec_says(k1, k2, lengths, known, recompute, starts, stride):
    _, windows = plan_stream(k1, k2, lengths, known, recompute, starts, stride)
    assert windows == [(a, b) for a, b, _ in spec_windows(k1, k2, sum(lengths))]


@settings(max_examples=300, deadline=None)
@given(**stream)
def test_no_segment_straddles_a_window_end_a_cut_a_batch_end_a_start_or_a_stride(
    k1, k2, lengths, known, recompute, starts, stride
):
    length = sum(lengths)
    plans, _ = plan_stream(k1, k2, lengths, known, recompute, starts, stride)
    forbidden = {b for _, b, _ in spec_windows(k1, k2, length)} | {c for *_, c in spec_windows(k1, k2, length)}
    forbidden |= set(itertools.accumulate(lengths)) | set(starts)
    if stride is not None:  # a recorded window's extra points, counted from its start
        forbidden |= {a + j for a, *_ in spec_windows(k1, k2, length) for j in range(0, k1, stride)}
    assert {t for t in starts if t < length} <= {plan.start for plan, _ in plans}  # each reset opens a call
    for plan, window_start in plans:
        assert not any(plan.start < f < plan.end for f in forbidden), plan
        assert window_start <= plan.start and plan.end <= window_start + k1
        if recompute is not None:
            assert plan.end - plan.start <= recompute


@settings(max_examples=300, deadline=None)
@given(**stream)
def test_each_segment_is_paid_and_retained_as_its_gradient_needs(k1, k2, lengths, known, recompute, starts, stride):
    length = sum(lengths)
    windows = spec_windows(k1, k2, length)
    ends = []
    plans, _ = plan_stream(k1, k2, lengths, known, recompute, starts, stride, ends=ends)
    for (plan, window_start), window_end in zip(plans, ends):
        w = window_start // k1
        start, end, cut = windows[w]
        later_reach = any(c <= plan.start for _, _, c in windows[w + 1 :])
        # Steps before the cut get their own loss only, one step per call, paid at once.
        assert plan.own_loss_only <= (plan.start < cut)
        if window_end is not None:
            assert window_end == end and plan.own_loss_only == (plan.start < cut)
            # A recorded window (a stride here) also needs the gradient at its cut.
            assert plan.hidden_requires_grad == (plan.start > cut or (stride is not None and plan.start >= cut))
        if plan.start < cut and window_end is not None:
            assert plan.end == plan.start + 1
        assert plan.hidden_requires_grad >= (plan.start > cut)  # gradient may flow into its input
        # A later window that reaches the segment needs its graph, and its weights across optimizer steps.
        assert plan.reached_later >= later_reach
        assert plan.keep_weights == (plan.reached_later and recompute is None)
        assert not plan.reached_later or spec_cut(k1, k2, start + k1, start + 2 * k1) <= plan.start
        # Paid at once only if nothing later needs it: before the cut, or closing its window unreached.
        # (A start does not change this: the reset cuts only some columns, the others still need the graph.)
        if plan.backward_now and not plan.own_loss_only:
            assert plan.closes_window and not later_reach and recompute is None
        assert plan.rebuilt == (recompute is not None and not plan.own_loss_only)
        owed = not plan.backward_now
        # The sweep starts right after a window's last segment: one that owes its loss pays it in the sweep, unless
        # the sweep rebuilds it (recomputation).
        assert plan.loss_in_sweep == (owed and plan.closes_window and recompute is None)
        assert plan.detaches_predictions == (owed and not plan.loss_in_sweep)
        # What the sweep passes through joins the history: all that owes its loss, never the steps before the cut.
        assert owed <= plan.joins_history <= (not plan.own_loss_only)
        assert plan.joins_history == (owed or (plan.hidden_requires_grad and not plan.own_loss_only))
        assert not plan.backward_mean  # only with one window per optimizer step
        # A window never lies wholly before its cut: a segment that is its window is whole, its loss the window's.
        assert plan.whole_window == (plan.start == window_start and plan.closes_window)


@given(k1=st.integers(1, 40), k2=st.integers(1, 40), windows=st.integers(1, 5))
def test_at_most_two_model_calls_per_window_when_k2_at_least_k1(k1, k2, windows):
    k2 = max(k1, k2)
    plans, _ = plan_stream(k1, k2, [k1 * windows + 3], known=True, recompute=None)
    calls = [sum(1 for _, s in plans if s == start) for start in range(0, k1 * windows, k1)]
    assert max(calls) <= 2 and (max(calls) == 1) == ((k2 - k1) % k1 == 0)


def test_k1_equal_k2_is_one_call_paid_at_once_per_window():
    plans, _ = plan_stream(4, 4, [10], known=True, recompute=None)
    assert [(p.start, p.end) for p, _ in plans] == [(0, 4), (4, 8), (8, 10)]
    assert all(p.backward_now and not p.reached_later and not p.keep_weights for p, _ in plans)


def test_a_window_of_one_segment_is_whole_whether_paid_at_once_or_in_its_sweep():
    # The trainer backpropagates such a window's mean loss when it is its optimizer step's only window.
    # TBPTT(4, 8): one model call per window; its loss waits for the sweep that reaches 4 steps further back,
    # except in the stream's last window, which nothing reaches.
    plans, _ = plan_stream(4, 8, [12], known=True, recompute=None)
    assert [(p.start, p.whole_window, p.backward_now) for p, _ in plans] == [
        (0, True, False),
        (4, True, False),
        (8, True, True),
    ]
    # TBPTT(4, 6): the next window's cut splits each window in two, two losses; the stream's last window is one.
    plans, _ = plan_stream(4, 6, [9], known=True, recompute=None)
    assert [p.whole_window for p, _ in plans] == [False, False, False, False, True]
    # TBPTT(4, 2): the steps before the cut are segments of their own loss only.
    plans, _ = plan_stream(4, 2, [8], known=True, recompute=None)
    assert not any(p.whole_window for p, _ in plans)


@pytest.mark.parametrize("known", [True, False])
def test_k2_above_k1_splits_at_the_next_windows_cut_and_keeps_only_what_it_reaches(known):
    # TBPTT(4, 6): window [4, 8) reaches back to 2, window [8, 12) to 6.
    plans, _ = plan_stream(4, 6, [9], known=known, recompute=None)
    expected = [(0, 2, False), (2, 4, True), (4, 6, False), (6, 8, True), (8, 9, False)]
    assert [(p.start, p.end, p.reached_later) for p, _ in plans] == expected
    assert [p.backward_now for p, _ in plans] == [False, False, False, False, known]


@settings(max_examples=200, deadline=None)
@given(**stream)
def test_with_one_window_per_step_a_window_of_one_segment_backpropagates_its_mean(
    k1, k2, lengths, known, recompute, starts, stride
):
    plans, _ = plan_stream(k1, k2, lengths, known, recompute, starts, stride, one_window_per_step=True)
    for plan, _ in plans:
        assert plan.backward_mean == plan.whole_window


def test_a_recorded_window_needs_the_gradient_at_its_cut():
    # TBPTT(4, 4): a window runs from its cut, so its input hidden state takes no gradient unless recorded.
    source = Schedule(4, 4)
    plain = plan_segment(source, source.window(4), 4, 8, 8)
    recorded = plan_segment(source, source.window(4), 4, 8, 8, recorded=True)
    assert not plain.hidden_requires_grad and not plain.joins_history
    assert recorded.hidden_requires_grad and recorded.joins_history and recorded.backward_now
