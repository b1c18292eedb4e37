import pytest
from hypothesis import given
from hypothesis import strategies as st

from ignite_tbptt import Schedule, WindowSource

lengths = st.integers(1, 40)


def windows(s, length):
    return [(a, min(a + s.k1, length)) for a in range(0, length, s.k1)]


def window_start(s, step):
    """First step of the fixed window that holds ``step``."""
    return step - step % s.k1


def segment_end(s, step, stream_end=None):
    """End of the longest model call from ``step``: the source's boundary inside the window that holds it."""
    return s.boundary(s.window(window_start(s, step)), step, stream_end)


def segments(s, length, stream_end):
    bounds, step = [0], 0
    while step < length:
        step = min(segment_end(s, step, stream_end), length)
        bounds.append(step)
    return bounds


@pytest.mark.parametrize(
    "k1,k2,start,end,cut",
    [
        (4, 4, 8, 12, 8),  # k1 = k2: the window's own start
        (2, 5, 6, 8, 3),  # k2 > k1: k2 - k1 = 3 steps before the start
        (2, 5, 2, 4, 0),  # ... never before the stream's start
        (2, 5, 6, 7, 3),  # a short last window reaches as far before its start as a full one
        (5, 2, 10, 15, 13),  # k2 < k1: k2 steps before the end
        (5, 2, 10, 11, 10),  # ... never before the window's start
    ],
)
def test_cut_follows_the_spec(k1, k2, start, end, cut):
    assert Schedule(k1, k2).cut(start, end) == cut


@given(k1=lengths, k2=lengths, length=lengths, known=st.booleans())
def test_segments_never_straddle_a_window_end_or_a_cut(k1, k2, length, known):
    s = Schedule(k1, k2)
    bounds = set(segments(s, length, length if known else None))
    for start, end in windows(s, length):
        assert end in bounds
        assert s.cut(start, end) in bounds  # whether or not the stream's end was known in advance
        if k2 < k1:  # each step before the cut runs alone
            assert set(range(start, s.cut(start, end) + 1)) <= bounds


@given(k1=lengths, k2=lengths, length=lengths)
def test_windows_cover_every_step_once_and_reach_at_most_k2_back(k1, k2, length):
    s = Schedule(k1, k2)
    ws = windows(s, length)
    assert [step for a, b in ws for step in range(a, b)] == list(range(length))
    for start, end in ws:
        assert window_start(s, start) == start and s.window_end(start, length) == end
        cut = s.cut(start, end)
        assert 0 <= cut <= end and end - cut <= k2
        if end - start == k1 and start - (k2 - k1) >= 0:
            assert end - cut == k2  # a full window reaches exactly k2 steps back


@given(k1=lengths, k2=lengths, start_window=st.integers(0, 10), offset=st.integers(0, 39), known=st.booleans())
def test_the_closed_form_boundary_equals_the_walk_over_later_windows(k1, k2, start_window, offset, known):
    s = Schedule(k1, k2)
    window = s.window(start_window * k1)
    step = window.start + offset % k1
    for stream_end in [step + 1, window.end, window.end + 3 * k1] if known else [None]:
        assert s.boundary(window, step, stream_end) == WindowSource.boundary(s, window, step, stream_end)


@given(k1=lengths, k2=lengths, steps=st.integers(0, 80))
def test_at_most_two_model_calls_per_window_when_k2_at_least_k1(k1, k2, steps):
    s = Schedule(k1, max(k1, k2))
    start = window_start(s, steps)
    calls, step = 0, start
    while step < start + k1:
        step = segment_end(s, step)
        calls += 1
    assert calls <= 2 and (calls == 1) == ((s.k2 - k1) % k1 == 0)


@given(k1=lengths, k2=lengths, start_window=st.integers(0, 10), step=st.integers(0, 200))
def test_reaching_back_means_inside_the_next_windows_backward_pass(k1, k2, start_window, step):
    s = Schedule(k1, k2)
    start = start_window * k1
    step = min(step, start + k1 - 1)
    next_start = start + k1
    assert s.reaches_back(s.window(start), step) == (s.cut(next_start, next_start + k1) <= step)


@pytest.mark.parametrize(
    "k1,k2,error",
    [(0, 1, ValueError), (1, 0, ValueError), (-2, 3, ValueError), (2.0, 3, TypeError), (True, 2, TypeError)],
)
def test_non_positive_or_non_int_lengths_are_rejected(k1, k2, error):
    with pytest.raises(error, match="must be a positive int"):
        Schedule(k1, k2)
