"""AdaptiveTruncation: k2 from the measured gradient decay; exact for the windows it plans, bounded, resumable."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ignite.engine import Engine

from ignite_tbptt import (
    AdaptiveTruncation,
    GradientReach,
    RandomWindows,
    Schedule,
    TBPTTEvents,
    create_tbptt_trainer,
    tbptt_training_step,
)

from ..helpers import assert_resume_is_bit_identical, compare_with_reference, make_batches
from ..reference import Net, cross_entropy


def sgd_trainer(model, k1=2, k2=None, **options):
    return create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, k1, k2, **options)


def test_adaptive_k2_matches_the_reference_for_the_windows_it_planned():
    adaptive = AdaptiveTruncation(delta=0.02, k2_min=4, k2_max=9, every=1, memory=1)
    options = dict(carry_hidden=True, accumulation=2, lengths=(11, 17, 8), handlers=[adaptive])
    trainer = compare_with_reference(3, None, **options)
    reaches = {end - cut for start, end, cut in trainer.recorded_windows if cut > 0 and end - start == 3}
    assert len(reaches) > 1  # k2 changed during the run
    assert all(4 <= r <= 9 for r in reaches)
    cuts = [cut for _, _, cut in trainer.recorded_windows[:12]]  # the first epoch's windows
    assert cuts == sorted(cuts)  # cuts never move backwards


def test_adaptive_k2_over_random_windows_matches_the_reference():
    adaptive = AdaptiveTruncation(delta=0.02, k2_min=5, k2_max=11, every=1, memory=1)
    windows = RandomWindows(4, std=1.5, min_length=2, seed=3)
    trainer = compare_with_reference(windows, None, carry_hidden=True, lengths=(13, 17), handlers=[adaptive])
    lengths = {end - start for start, end, _ in trainer.recorded_windows}
    assert len(lengths) > 2  # the random lengths are kept
    assert any(start - cut not in (0, 1) for start, _, cut in trainer.recorded_windows)  # k2 - k1 moved


def test_a_trainer_built_with_k2_equal_to_k1_gets_the_weight_versions_k2_above_k1_needs():
    # Adam changes every weight at every step; without the old weights, the next window's backward pass
    # through the retained segments would raise (a modified saved tensor) or use the new weights.
    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(model, torch.optim.Adam(model.parameters(), lr=0.01), cross_entropy, 3)
    assert trainer.tbptt.history.versions is None
    AdaptiveTruncation(delta=0.2, k2_min=5, k2_max=8, every=1).attach(trainer)
    assert trainer.tbptt.history.versions is not None
    trainer.run(make_batches((20,)))
    assert trainer.state.window == 7


def test_engine_of_a_process_function_takes_the_handler_too():
    torch.manual_seed(0)
    model = Net().double()
    trainer = Engine(tbptt_training_step(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, 3))
    adaptive = AdaptiveTruncation(delta=0.02, k2_min=4, k2_max=9, every=1).attach(trainer)
    trainer.run(make_batches((30,)))  # the process function attaches itself to the engine here
    assert len(adaptive.rates) == 9  # every window but the first (no step before its start) measured the decay
    assert trainer.state.k2 == adaptive.k2


@pytest.mark.parametrize("adaptive_first", [True, False])
def test_with_a_gradient_reach_attached_the_windows_either_asks_for_are_recorded(adaptive_first):
    torch.manual_seed(0)
    trainer = sgd_trainer(Net().double(), 3)
    adaptive = AdaptiveTruncation(delta=0.02, k2_min=4, k2_max=9, every=2, memory=100)
    handlers = [adaptive, GradientReach(every=3)]
    for handler in handlers if adaptive_first else handlers[::-1]:
        handler.attach(trainer)
    recorded = []
    trainer.add_event_handler(
        TBPTTEvents.WINDOW_COMPLETED, lambda e: recorded.append(e.state.gradient_reach is not None)
    )
    trainer.run(make_batches((30,)))
    assert recorded == [w % 2 == 0 or w % 3 == 0 for w in range(1, 11)]
    assert len(adaptive.rates) == sum(recorded)  # the handler learns from every recorded window


def test_the_retained_history_stays_within_k2_max():
    torch.manual_seed(0)
    model = Net().double()
    trainer = sgd_trainer(model, 2)
    AdaptiveTruncation(delta=1e-6, k2_min=3, k2_max=7, every=1, memory=1).attach(trainer)
    spans, k2s = [], []

    def measure(engine):
        segments = engine.tbptt.history.segments
        if segments:
            spans.append(segments[-1].end - segments[0].start)
        k2s.append(engine.state.k2)

    trainer.add_event_handler(TBPTTEvents.WINDOW_STARTED, measure)
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, measure)
    trainer.run(make_batches((30, 30)), max_epochs=2)
    assert max(spans) <= 7 and max(k2s) == 7  # delta = 1e-6 asks for more than k2_max allows


def test_the_decay_is_fitted_between_the_window_start_and_the_cut_only():
    adaptive = AdaptiveTruncation(delta=0.01, k2_min=6, k2_max=100, every=1, memory=1)
    engine = Engine(lambda e, b: None)
    # A window of 4 steps: the lags 1 and 2 inside it carry fewer losses and must not enter the fit.
    engine.state.window_bounds = (10, 14, 6)
    engine.state.gradient_reach = {1: 1e-9, 2: 1e-6, 4: 1.0, 8: 0.5**4}
    adaptive.base = Schedule(4, 4)  # as attach() sets it, k1 = 4
    adaptive.observe(engine)
    assert adaptive.rates[0] == pytest.approx(math.log(0.5))
    assert adaptive.k2 == engine.state.k2 == 10  # 0.5 ** (10 - 4 + 1) <= 0.01 < 0.5 ** 6


def test_choose_picks_the_smallest_k2_with_the_bias_of_a_windows_first_step_under_delta():
    adaptive = AdaptiveTruncation(delta=0.05, k2_min=12, k2_max=100).attach(sgd_trainer(Net(), 10))
    for rate in (0.5, 0.8, 0.9, 0.95):
        k2 = adaptive.choose(math.log(rate))
        reach = k2 - 10 + 1  # the window's first step reaches back k2 - k1 + 1 steps
        assert rate**reach <= 0.05 or k2 == 100
        assert k2 == 12 or rate ** (reach - 1) > 0.05
    assert [adaptive.choose(math.log(r)) for r in (0.5, 0.9, 1.0)] == [14, 38, 100]  # 0.5 ** 5, 0.9 ** 29
    with pytest.raises(TypeError, match="attach"):
        AdaptiveTruncation(delta=0.05, k2_min=12, k2_max=100).choose(-1.0)


def test_resuming_mid_epoch_goes_on_with_the_same_k2(tmp_path):
    def build():
        torch.manual_seed(0)
        model = Net(dropout=0.2)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        trainer = create_tbptt_trainer(model, optimizer, cross_entropy, 3, carry_hidden=True, deterministic=True)
        AdaptiveTruncation(delta=0.02, k2_min=4, k2_max=9, every=2, memory=2).attach(trainer)
        return model, optimizer, trainer

    assert_resume_is_bit_identical(tmp_path, build, [(x.float(), y) for x, y in make_batches([7, 12, 5, 9])])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(delta=1.5), "delta"),
        (dict(delta=True), "delta"),
        (dict(k2_max=4), "k2_max must be at least"),
        (dict(k2=20), "k2 must lie in"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveTruncation(**(dict(delta=0.1, k2_min=5, k2_max=10) | kwargs))


def test_bad_attachments_leave_the_trainer_as_it_was():
    model = Net().double()
    trainer = sgd_trainer(model, 5)
    with pytest.raises(ValueError, match="k2_min must exceed the trainer's k1"):
        AdaptiveTruncation(delta=0.1, k2_min=5, k2_max=10).attach(trainer)
    assert trainer.tbptt.window_source.k2 == 5 and trainer.tbptt.history.versions is None
    with pytest.raises(TypeError, match="attaches to a TBPTT trainer"):
        AdaptiveTruncation(delta=0.1, k2_min=6, k2_max=10).attach(Engine(lambda e, b: None))
    with pytest.raises(TypeError, match="is a handler"):
        sgd_trainer(model, AdaptiveTruncation(delta=0.1, k2_min=6, k2_max=10))
    adaptive = AdaptiveTruncation(delta=0.1, k2_min=6, k2_max=10).attach(trainer)
    with pytest.raises(TypeError, match="fixed windows"):
        AdaptiveTruncation(delta=0.1, k2_min=6, k2_max=10).attach(trainer)  # its windows are adaptive already
    assert trainer.tbptt.window_source is adaptive


def test_attaching_inside_a_stream_is_refused_before_anything_changes():
    # The windows so far kept only what k2 = k1 needed: a longer reach from here on would find no history.
    model = Net().double()
    trainer = sgd_trainer(model, 3)
    errors = []

    def attach(engine):
        try:
            AdaptiveTruncation(delta=0.1, k2_min=5, k2_max=10).attach(engine)
        except RuntimeError as error:
            errors.append(str(error))

    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED(once=2), attach)
    trainer.run(make_batches((12,)))
    assert errors and "a stream is at step 6" in errors[0]
    assert trainer.tbptt.window_source.k2 == 3 and trainer.tbptt.history.versions is None


@pytest.mark.parametrize("tensorboard_first", [False, True])
def test_k2_is_logged_to_tensorboard_after_each_update_whatever_the_order_of_attachment(tmp_path, tensorboard_first):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ignite_tbptt import attach_tensorboard

    torch.manual_seed(0)
    trainer = sgd_trainer(Net(), 3)
    chosen = []
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda e: chosen.append(e.state.k2))
    adaptive = AdaptiveTruncation(delta=0.02, k2_min=4, k2_max=9, every=1, memory=1)
    if tensorboard_first:
        logger = attach_tensorboard(trainer, tmp_path)
        adaptive.attach(trainer)
    else:
        adaptive.attach(trainer)
        logger = attach_tensorboard(trainer, tmp_path)
    trainer.run([(x.float(), y) for x, y in make_batches([12, 12])])
    logger.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.value for e in events.Scalars("train/k2")] == chosen
    assert len(set(chosen)) > 1 and chosen[-1] == adaptive.k2  # the value after the window's update


@settings(max_examples=200, deadline=None)
@given(
    k1=st.integers(1, 8),
    bounds=st.tuples(st.integers(1, 10), st.integers(0, 30)),
    k2s=st.lists(st.integers(0, 60), min_size=1, max_size=30),
    random_lengths=st.booleans(),
)
def test_planned_windows_tile_never_move_their_cuts_back_and_stay_within_k2_max(k1, bounds, k2s, random_lengths):
    # Whatever k2 the estimate asks for between windows, the source keeps the rules the retained history needs.
    k2_min, k2_max = k1 + bounds[0], k1 + bounds[0] + bounds[1]
    adaptive = AdaptiveTruncation(delta=0.1, k2_min=k2_min, k2_max=k2_max)
    adaptive.base = RandomWindows(k1, std=2.0, min_length=1, seed=0) if random_lengths else Schedule(k1, k1)
    start, last_cut = 0, 0
    for k2 in k2s:
        adaptive.k2 = min(k2_max, max(k2_min, k2))  # as choose() bounds it
        window = adaptive.window(start)
        assert window.start == start < window.end and window == adaptive.window(start)  # the same when asked again
        assert last_cut <= window.cut < window.end
        assert window.cut <= max(0, start - (k2_min - k1))  # at least k2_min's reach, once the stream allows
        assert window.start - window.cut <= k2_max - k1  # the history never reaches past k2_max
        start, last_cut = window.end, window.cut
