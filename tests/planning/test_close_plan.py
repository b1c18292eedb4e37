"""The plan of a window's close against SPEC.md: every step's loss back to the cut, once, and nothing kept too long."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ignite_tbptt import ARTBP, RandomWindows, Schedule
from ignite_tbptt.planning import StreamPlanner, plan_batch

from ..reference import spec_cut


def closes(source, lengths, known=True):
    """Plan a carried stream in batches of ``lengths`` as the loop does: each close plan with the retained starts."""
    planner, retained, found = StreamPlanner(source), [], []
    position, number = 0, 0
    batch_end = 0
    for i, length in enumerate(lengths):
        batch = plan_batch(batch_end, length, known and i == len(lengths) - 1)
        batch_end, stream_end = batch.end, batch.stream_end
        while position < batch_end:
            if planner.window is None:
                number += 1
                planner.open_window(position, number)
            plan = planner.segment(position, batch)
            if plan.joins_history:
                retained.append(plan.start)
            position = plan.end
            if plan.closes_window:
                before = list(retained)
                close = planner.close(plan.end, plan.end != stream_end, retained)
                planner.closed(close)
                found.append((close, before))
                retained = retained[close.keep_from :]
    return found


@settings(max_examples=150, deadline=None)
@given(k1=st.integers(1, 6), k2=st.integers(1, 12), lengths=st.lists(st.integers(1, 15), min_size=1, max_size=4))
def test_each_retained_step_from_the_cut_is_swept_once_and_kept_while_a_later_window_reaches_it(k1, k2, lengths):
    found = closes(Schedule(k1, k2), lengths)
    for n, (close, retained) in enumerate(found):
        assert close.cut == spec_cut(k1, k2, close.start, close.end)
        following = found[n + 1][0] if n + 1 < len(found) else None
        next_cut = None if close.following is None else close.following.cut
        assert (next_cut is None) == (following is None)
        if following is not None and k2 >= k1:  # (k2 < k1: the planned full window's; nothing reaches back then)
            assert next_cut == following.cut
        swept = [s.start for s in close.sweep if not s.own_loss_only]
        # From the last segment back, each retained segment at or after the cut once; the cut starts one if any
        # segment of an earlier window is retained (an earlier window kept it for this one).
        assert swept == sorted((s for s in retained if s >= close.cut), reverse=True)
        if any(s < close.start for s in retained):
            assert close.cut in swept
        for step in close.sweep:
            assert step.segment == retained.index(step.start)
            assert step.own_loss_only == (close.start <= step.start < close.cut)  # k2 < k1: its own loss only
            assert step.passes_on == (step.start > close.cut)
            assert step.retain == (next_cut is not None and step.start >= next_cut)
            assert step.factor is None
        # What stays is exactly what the next window reaches.
        kept = retained[close.keep_from :]
        assert kept == ([] if next_cut is None else [s for s in retained if s >= next_cut])
        assert close.retains == any(step.retain for step in close.sweep)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 1000), lengths=st.lists(st.integers(1, 30), min_size=1, max_size=3))
def test_random_windows_and_artbp_closes_keep_the_same_rules(seed, lengths):
    for source in (RandomWindows(4, k2=9, std=2.0, seed=seed), ARTBP(grid=3, c=0.4, seed=seed)):
        found = closes(source, lengths)
        ends = [close.end for close, _ in found]
        assert ends == sorted(ends) and ends[-1] == sum(lengths)  # the windows tile the stream
        for close, _ in found:
            factors = source.compensation(close.start)
            for step in close.sweep:
                assert step.factor == (None if step.own_loss_only else factors.get(step.start))


def test_a_planner_resumes_its_open_window_and_its_sources_draws():
    planner = StreamPlanner(RandomWindows(4, k2=8, std=2.0, seed=3))
    planner.reach.ask(every=2)
    planner.open_window(0, 1)
    close = planner.close(planner.window.end, True, [])
    planner.closed(close)
    planner.open_window(close.end, 2)
    state = planner.state_dict()
    resumed = StreamPlanner(RandomWindows(4, k2=8, std=2.0, seed=99))
    resumed.reach.ask(every=2)
    resumed.load_state_dict(state, 2)
    assert (resumed.window, resumed.recorded) == (planner.window, True)
    assert resumed.source.window(40) == planner.source.window(40)
