"""How windows run where programs may run: planning decides, with the reason where a window runs eagerly."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ignite_tbptt import Schedule
from ignite_tbptt.planning import EagerReason, RuntimeFacts, StreamPlanner, plan_batch, plan_step, plan_window

NONE = RuntimeFacts()  # nothing the runtime knows refuses a program


@settings(max_examples=200, deadline=None)
@given(
    k1=st.integers(1, 6),
    extra=st.integers(0, 12),
    window=st.integers(1, 6),
    batch_length=st.integers(1, 20),
    starts=st.sets(st.integers(1, 19), max_size=4),
)
def test_a_window_runs_whole_where_the_batch_holds_it_and_it_reaches_no_other(k1, extra, window, batch_length, starts):
    k2 = k1 + extra
    planner = StreamPlanner(Schedule(k1, k2))
    position = (window - 1) * k1
    batch = plan_batch(position, batch_length, False, {s: None for s in starts if s < batch_length})
    planner.open_window(position, window)
    plans, eager = plan_window(planner, batch, position, False, NONE)
    if position + k1 > batch.end:
        assert (plans, eager) == ((), EagerReason.BATCH_ENDS_INSIDE)
        return
    if k2 > k1:  # it reaches back into earlier windows, or (the stream's first) the next reaches into it
        assert (plans, eager) == ((), EagerReason.REACHES_BACK)
        return
    assert eager is None
    # The segments tile the window, each as the walk plans it: split at each sequence start.
    assert plans[0].start == position and plans[-1].end == position + k1 and plans[-1].closes_window
    assert all(a.end == b.start for a, b in zip(plans, plans[1:]))
    assert [p.start for p in plans[1:]] == sorted(position + s for s in starts if 0 < s < min(k1, batch_length))
    for plan in plans:
        assert plan == planner.segment(plan.start, batch)
    assert planner.window is not None and planner.window.start == position  # planning changed nothing


def test_why_a_window_runs_eagerly():
    batch = plan_batch(0, 20, False, {})
    planner = StreamPlanner(Schedule(4, 4))
    planner.open_window(0, 1)
    # What the runtime says first: the first checks, the profiler.
    assert plan_window(planner, batch, 0, False, NONE._replace(checks_pending=True)) == ((), EagerReason.CHECKS)
    assert plan_window(planner, batch, 0, False, NONE._replace(profiling=True)) == ((), EagerReason.PROFILER)
    # A window whose gradient reach is recorded.
    planner.reach.ask(every=2)
    planner.open_window(4, 2)
    assert plan_window(planner, batch, 4, False, NONE) == ((), EagerReason.RECORDED)
    # k2 < k1: the steps before the cut get their own loss only.
    planner = StreamPlanner(Schedule(5, 2))
    planner.open_window(0, 1)
    assert plan_window(planner, batch, 0, False, NONE) == ((), EagerReason.OWN_LOSS_ONLY)
    # The batch ends inside the window.
    planner = StreamPlanner(Schedule(4, 6))
    planner.open_window(16, 5)
    assert plan_window(planner, plan_batch(16, 3, False, {}), 16, False, NONE) == ((), EagerReason.BATCH_ENDS_INSIDE)
    # k2 > k1: the window at 8 reaches back to 6; the stream's first, at 0, reaches nothing but the next reaches it.
    for start in (8, 0):
        planner.open_window(start, 1 + start // 4)
        assert plan_window(planner, batch, start, False, NONE) == ((), EagerReason.REACHES_BACK)
    # Its last window, which nothing reaches, reaches back all the same.
    planner.open_window(16, 5)
    assert plan_window(planner, plan_batch(16, 4, True, {}), 16, False, NONE) == ((), EagerReason.REACHES_BACK)
    # Recomputation mode, at k1 = k2.
    planner = StreamPlanner(Schedule(4, 4), recompute=2)
    planner.open_window(0, 1)
    assert plan_window(planner, batch, 0, False, NONE) == ((), EagerReason.RECOMPUTE)


def test_which_sources_allow_programs_follows_from_what_they_state():
    from ignite_tbptt import ARTBP, AdaptiveTruncation, RandomWindows

    # Fixed windows: every k2 >= k1 (a cut k2 - k1 before a window's start falls at a few places); k2 < k1 cuts inside.
    assert [Schedule(4, k2).allows_programs for k2 in (2, 4, 6, 9)] == [False, True, True, True]
    # Windows of varying length: only where no window reaches back (k1 = k2, each cut at its window's start).
    assert [RandomWindows(6, k2, seed=0).allows_programs for k2 in (3, 6, 9)] == [False, True, False]
    assert not ARTBP(grid=2, mean_length=6, seed=0).allows_programs  # the sweep reweights the gradient
    assert not AdaptiveTruncation(0.1, 4, 16).allows_programs  # windows reach back, and its k2 moves


def test_why_an_optimizer_step_runs_eagerly():
    assert plan_step(RuntimeFacts()) is None
    assert plan_step(RuntimeFacts(profiling=True)) is EagerReason.PROFILER
    assert plan_step(RuntimeFacts(optimizer_skips=False)) is EagerReason.OPTIMIZER
    assert plan_step(RuntimeFacts(distributed=True)) is EagerReason.DISTRIBUTED
    assert plan_step(RuntimeFacts(host_handlers=True)) is EagerReason.HOST_HANDLERS
    # The model call's first checks concern windows only.
    assert plan_step(RuntimeFacts(checks_pending=True)) is None


def test_the_reason_plan_window_took_before_facts_still_answers_with_a_warning():
    import pytest

    planner = StreamPlanner(Schedule(4, 4))
    planner.open_window(0, 1)
    batch = plan_batch(0, 8, False, {})
    with pytest.warns(DeprecationWarning, match="RuntimeFacts"):
        assert plan_window(planner, batch, 0, False, EagerReason.CHECKS) == ((), EagerReason.CHECKS)
    with pytest.warns(DeprecationWarning, match="RuntimeFacts"):
        assert plan_window(planner, batch, 0, False, None) == plan_window(planner, batch, 0, False, NONE)
