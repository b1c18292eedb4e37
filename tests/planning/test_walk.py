"""The walk of a window source over a stream: SPEC.md's windows and cuts, and the very plans a trainer makes."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ignite_tbptt import ARTBP, RandomWindows, Schedule, TBPTTProcessFunction, create_tbptt_trainer, walk
from ignite_tbptt.planning import ClosePlan, SegmentPlan, StreamPlanner, plan_batch

from ..reference import spec_cut


def segments_and_closes(planned):
    segments = [p for p in planned if isinstance(p.plan, SegmentPlan)]
    closes = [p for p in planned if isinstance(p.plan, ClosePlan)]
    return segments, closes


def batch_ends(length, batch_length):
    return list(range(batch_length or length, length, batch_length or length)) + [length]


walks = dict(
    k1=st.integers(1, 6),
    k2=st.integers(1, 13),
    length=st.integers(1, 40),
    batch_length=st.one_of(st.none(), st.integers(1, 12)),
    starts=st.sets(st.integers(0, 40), max_size=10),
    recompute=st.one_of(st.none(), st.integers(1, 4)),
    end_known=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(**walks)
def test_windows_tile_the_stream_with_the_spec_cuts_and_segments_tile_each_window(
    k1, k2, length, batch_length, starts, recompute, end_known
):
    planned = list(walk(Schedule(k1, k2), length, batch_length=batch_length, sequence_starts=starts,
                        recompute=recompute, end_known=end_known))  # fmt: skip
    segments, closes = segments_and_closes(planned)
    spec = [(a, min(a + k1, length), spec_cut(k1, k2, a, min(a + k1, length))) for a in range(0, length, k1)]
    assert [(c.plan.start, c.plan.end, c.plan.cut) for c in closes] == spec
    cuts = [c.plan.cut for c in closes]
    assert cuts == sorted(cuts)  # cuts never move backwards
    # Each close follows the segments of its window, which tile it.
    window = []
    for p in planned:
        if isinstance(p.plan, SegmentPlan):
            window.append(p.plan)
            continue
        close = p.plan
        assert [s.start for s in window] == [close.start] + [s.end for s in window[:-1]]
        assert window[-1].end == close.end and all(s.window.start == close.start for s in window)
        window = []
    assert window == []


@settings(max_examples=300, deadline=None)
@given(**walks)
def test_no_segment_crosses_a_batch_end_or_a_sequence_start_and_rebuilt_pieces_stay_short(
    k1, k2, length, batch_length, starts, recompute, end_known
):
    planned = list(walk(Schedule(k1, k2), length, batch_length=batch_length, sequence_starts=starts,
                        recompute=recompute, end_known=end_known))  # fmt: skip
    segments, _ = segments_and_closes(planned)
    ends = batch_ends(length, batch_length)
    assert [s.plan.start for s in segments] == [0] + [s.plan.end for s in segments[:-1]]
    assert segments[-1].plan.end == length
    for segment in segments:
        plan, first = segment.plan, ([0] + ends)[segment.batch]
        assert first <= plan.start < plan.end <= ends[segment.batch]  # inside its batch
        assert not any(plan.start < t < plan.end for t in starts), (plan, starts)
        if recompute is not None:
            assert plan.end - plan.start <= recompute
    assert {t for t in starts if t < length} <= {s.plan.start for s in segments}


@settings(max_examples=200, deadline=None)
@given(k1=st.integers(1, 6), k2=st.integers(1, 13), length=st.integers(1, 40), batch_length=st.integers(1, 12))
def test_each_batch_of_a_stream_without_carry_is_a_stream_of_its_own(k1, k2, length, batch_length):
    planned = list(walk(Schedule(k1, k2), length, batch_length=batch_length, carry=False))
    for index, group in itertools.groupby(planned, key=lambda p: p.batch):
        size = min(batch_length, length - index * batch_length)
        alone = [p._replace(batch=index) for p in walk(Schedule(k1, k2), size)]
        assert list(group) == alone


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 1000), length=st.integers(1, 60), batch_length=st.integers(1, 20), k2=st.integers(1, 9))
def test_random_windows_tile_the_stream_and_their_cuts_never_move_backwards(seed, length, batch_length, k2):
    source = RandomWindows(k1=5, k2=k2, std=3.0, min_length=1, seed=seed)
    _, closes = segments_and_closes(list(walk(source, length, batch_length=batch_length)))
    assert [c.plan.start for c in closes] == [0] + [c.plan.end for c in closes[:-1]]
    assert closes[-1].plan.end == length and closes[-1].plan.following is None
    assert all(c.plan.following == source.window(c.plan.end) for c in closes[:-1])
    cuts = [c.plan.cut for c in closes]
    assert cuts == sorted(cuts)


@settings(max_examples=200, deadline=None)
@given(k1=st.integers(1, 6), k2=st.integers(1, 13), length=st.integers(1, 40), batch_length=st.integers(1, 12))
def test_the_retained_starts_are_the_segments_that_joined_the_history_and_that_a_later_window_reaches(
    k1, k2, length, batch_length
):
    retained = []
    for planned in walk(Schedule(k1, k2), length, batch_length=batch_length):
        assert list(planned.retained) == retained
        plan = planned.plan
        if isinstance(plan, SegmentPlan):
            retained += [plan.start] if plan.joins_history else []
        else:  # the close drops what the following window does not reach
            kept = retained[plan.keep_from :]
            following = plan.following
            assert all(start >= following.cut for start in kept) if following else kept == []
            assert all(start < following.cut for start in retained[: plan.keep_from]) if following else True
            retained = kept


def test_the_batch_plan_is_the_trainers_rule_for_the_stream_end_and_sequence_starts():
    batch = plan_batch(8, 4, ends_stream=True, start_steps={3: None, 1: None})
    assert (batch.start, batch.end, batch.stream_end, batch.starts) == (8, 12, 12, (9, 11))
    assert [batch.next_start(t) for t in range(8, 12)] == [9, 11, 11, None]
    assert not batch.stream_continues(12) and batch.stream_continues(10)
    assert plan_batch(0, 4, ends_stream=False).stream_end is None


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="length must be a positive int"):
        next(walk(Schedule(2, 2), 0))
    with pytest.raises(TypeError, match="batch_length must be a positive int"):
        next(walk(Schedule(2, 2), 4, batch_length=1.5))
    with pytest.raises(ValueError, match="recompute must be a positive int"):
        next(walk(Schedule(2, 2), 4, recompute=0))


# -- the trainer's own plans -------------------------------------------------------------------------------------
def trainer_plans(monkeypatch, make_source, length, batch_length, *, starts=(), carry=True, sized=True, **options):
    """Train on ``length`` steps in batches of ``batch_length`` and record each plan the trainer's planner makes.

    Each segment's plan comes with the retained history's starts when it was planned, and each close's with those it
    was planned from, and both with the batch (the iteration, from 0) that made it.
    """
    torch.manual_seed(0)
    model = torch.nn.GRU(1, 3)
    source = make_source()

    def loss_fn(y_pred, y):
        return (y_pred[..., :1] - y).pow(2).mean()

    trainer = create_tbptt_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.01), loss_fn, source, carry_hidden=carry, **options
    )
    step = TBPTTProcessFunction.of(trainer)
    seen, segment, close = [], StreamPlanner.segment, StreamPlanner.close

    def spied_segment(planner, *args, **kwargs):
        plan = segment(planner, *args, **kwargs)
        seen.append((trainer.state.iteration - 1, plan, tuple(step.history.starts())))
        return plan

    def spied_close(planner, end, stream_continues, retained):
        plan = close(planner, end, stream_continues, retained)
        seen.append((trainer.state.iteration - 1, plan, tuple(retained)))
        return plan

    x = torch.randn(length, 2, 1)
    flags = torch.zeros(length, 2, dtype=torch.bool)
    flags[list(starts), 1] = True
    batches = [
        (x[a : a + batch_length], x[a : a + batch_length], flags[a : a + batch_length])
        for a in range(0, length, batch_length)
    ]
    with monkeypatch.context() as patched:  # the trainer's planner only, not the walk's after it
        patched.setattr(StreamPlanner, "segment", spied_segment)
        patched.setattr(StreamPlanner, "close", spied_close)
        trainer.run(batches if sized else (b for b in batches), max_epochs=1)
    return seen, step.optimizer_step.one_window_per_step


CASES = {
    "k1=k2": (lambda: Schedule(3, 3), 20, 7, {}),
    "k2>k1": (lambda: Schedule(3, 7), 23, 5, {}),
    "k2<k1": (lambda: Schedule(5, 2), 22, 6, {}),
    "k2>k1, starts": (lambda: Schedule(4, 6), 25, 6, {"starts": (0, 3, 9, 13, 14, 20)}),
    "k2<k1, starts": (lambda: Schedule(5, 3), 19, 8, {"starts": (2, 6, 11)}),
    "k2>k1, recompute": (lambda: Schedule(3, 8), 21, 7, {"recompute": 2}),
    "k2>k1, starts, recompute": (lambda: Schedule(4, 9), 26, 5, {"recompute": 3, "starts": (4, 7, 18)}),
    "k2>k1, accumulation": (lambda: Schedule(2, 5), 15, 4, {"gradient_accumulation_steps": 2}),
    "k2>k1, no carry": (lambda: Schedule(3, 5), 17, 7, {"carry": False, "starts": (5, 9)}),
    "k2>k1, end unknown": (lambda: Schedule(4, 6), 18, 5, {"sized": False}),
    "random windows": (lambda: RandomWindows(4, 6, std=2.0, min_length=1, seed=3), 30, 7, {"starts": (5, 12)}),
    "ARTBP": (lambda: ARTBP(grid=2, c=0.4, seed=2), 24, 5, {"starts": (7,)}),
}


@pytest.mark.parametrize("case", CASES)
def test_the_walk_makes_the_plans_a_trainer_makes_with_its_retained_history(monkeypatch, case):
    make_source, length, batch_length, options = CASES[case]
    seen, one_window_per_step = trainer_plans(monkeypatch, make_source, length, batch_length, **options)
    walked = walk(
        make_source(),
        length,
        batch_length=batch_length,
        carry=options.get("carry", True),
        end_known=options.get("sized", True),
        sequence_starts=options.get("starts", ()),
        recompute=options.get("recompute"),
        one_window_per_step=one_window_per_step,
    )
    assert [(p.batch, p.plan, p.retained) for p in walked] == seen
    assert any(isinstance(plan, ClosePlan) for _, plan, _ in seen)
