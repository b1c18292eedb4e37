"""AdaptiveTruncation: k2 from the measured gradient decay; exact for the windows it plans, bounded, resumable."""

import math

import pytest
import torch

from ignite_tbptt import AdaptiveTruncation, TBPTTEvents, create_tbptt_trainer

from .helpers import assert_resume_is_bit_identical, compare_with_reference, make_batches
from .reference import Net, cross_entropy


def test_adaptive_k2_matches_the_reference_for_the_windows_it_planned():
    source = AdaptiveTruncation(3, delta=0.2, k2_min=4, k2_max=9, every=1, memory=1)
    trainer = compare_with_reference(source, None, carry_hidden=True, accumulation=2, lengths=(11, 17, 8))
    reaches = {end - cut for start, end, cut in trainer.recorded_windows if cut > 0 and end - start == 3}
    assert len(reaches) > 1  # k2 changed during the run
    assert all(4 <= r <= 9 for r in reaches)
    cuts = [cut for _, _, cut in trainer.recorded_windows[:12]]  # the first epoch's windows
    assert cuts == sorted(cuts)  # cuts never move backwards


def test_the_retained_history_stays_within_k2_max():
    torch.manual_seed(0)
    model = Net().double()
    source = AdaptiveTruncation(2, delta=1e-6, k2_min=3, k2_max=7, every=1, memory=1)
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, source)
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


def test_choose_picks_the_smallest_k2_with_the_bias_under_delta():
    source = AdaptiveTruncation(10, delta=0.05, k2_min=12, k2_max=100)
    for rate in (0.5, 0.8, 0.9, 0.95):
        k2 = source.choose(math.log(rate))
        assert rate**k2 <= 0.05 or k2 == 100
        assert k2 == 12 or rate ** (k2 - 1) > 0.05


def test_resuming_mid_epoch_goes_on_with_the_same_k2(tmp_path):
    def build():
        torch.manual_seed(0)
        model = Net(dropout=0.2)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        source = AdaptiveTruncation(3, delta=0.2, k2_min=4, k2_max=9, every=2, memory=2)
        trainer = create_tbptt_trainer(model, optimizer, cross_entropy, source, carry_hidden=True, deterministic=True)
        return model, optimizer, trainer

    assert_resume_is_bit_identical(tmp_path, build, [(x.float(), y) for x, y in make_batches([7, 12, 5, 9])])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(delta=1.5), "delta"),
        (dict(k2_min=3), "k2_min must exceed k1"),
        (dict(k2_max=4), "k2_max must be at least"),
        (dict(k2=20), "k2 must lie in"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveTruncation(**(dict(k1=3, delta=0.1, k2_min=5, k2_max=10) | kwargs))


def test_k2_is_logged_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ignite_tbptt import attach_tensorboard

    torch.manual_seed(0)
    model = Net()
    source = AdaptiveTruncation(3, delta=0.2, k2_min=4, k2_max=9, every=1, memory=1)
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, source)
    chosen = []
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda e: chosen.append(e.state.k2))
    logger = attach_tensorboard(trainer, tmp_path)
    trainer.run([(x.float(), y) for x, y in make_batches([12, 12])])
    logger.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.value for e in events.Scalars("train/k2")] == chosen
