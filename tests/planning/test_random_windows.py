"""RandomWindows: AWD-LSTM's variable lengths against the brute-force reference driven by the recorded windows."""

import pytest
import torch

from ignite_tbptt import RandomWindows, TBPTTEvents, create_tbptt_trainer

from ..helpers import assert_resume_is_bit_identical, compare_with_reference, make_batches, sgd
from ..reference import Net, cross_entropy


def train_with_random_windows(k1, k2, accumulation, carry_hidden=True):
    source = RandomWindows(k1, k2, std=2.0, min_length=1, seed=3)
    trainer = compare_with_reference(
        source, None, carry_hidden=carry_hidden, accumulation=accumulation, lengths=(11, 17, 8)
    )
    return trainer.recorded_windows


@pytest.mark.parametrize("k1,k2", [(5, 5), (4, 7), (6, 3)], ids=["k2=k1", "k2>k1", "k2<k1"])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_random_windows_match_the_reference_for_the_windows_they_drew(k1, k2, accumulation):
    bounds = train_with_random_windows(k1, k2, accumulation)
    # The windows tile each epoch's stream of 36 steps; their lengths vary; the cut follows the k2 rule.
    epochs, stream = [], []
    for start, end, cut in bounds:
        if start == 0 and stream:
            epochs.append(stream)
            stream = []
        stream.append((start, end, cut))
    epochs.append(stream)
    assert len(epochs) == 2
    for windows in epochs:
        assert windows[0][0] == 0 and windows[-1][1] == 36
        assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))
        for start, end, cut in windows:
            assert cut == (max(0, start - (k2 - k1)) if k2 >= k1 else max(start, end - k2))
    lengths = {end - start for start, end, _ in bounds[:-1]}
    assert len(lengths) > 2
    assert epochs[0] != epochs[1]  # each epoch draws anew


def test_random_windows_with_fresh_streams_per_batch():
    train_with_random_windows(4, 7, 1, carry_hidden=False)


def test_fixed_windows_report_their_bounds():
    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 4, 6, carry_hidden=True)
    bounds = []
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda e: bounds.append(e.state.window_bounds))
    trainer.run(make_batches((7, 3)))
    assert bounds == [(0, 4, 0), (4, 8, 2), (8, 10, 6)]


def test_resuming_mid_epoch_draws_what_the_uninterrupted_run_drew(tmp_path):
    def build():
        torch.manual_seed(0)
        model = Net(dropout=0.2)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        source = RandomWindows(4, 7, std=2.0, min_length=1, seed=5)
        trainer = create_tbptt_trainer(model, optimizer, cross_entropy, source, carry_hidden=True, deterministic=True)
        return model, optimizer, trainer

    assert_resume_is_bit_identical(tmp_path, build, [(x.float(), y) for x, y in make_batches([7, 12, 5, 9])])


def test_random_windows_check_their_arguments_and_k2():
    with pytest.raises(ValueError, match="p must be a probability"):
        RandomWindows(10, p=1.5)
    with pytest.raises(TypeError, match="min_length"):
        RandomWindows(10, min_length=2.5)
    for std in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="std must be a finite, non-negative"):
            RandomWindows(10, std=std)
    model = Net()
    with pytest.raises(ValueError, match="k2 belongs to the window source"):
        create_tbptt_trainer(model, sgd(model), cross_entropy, RandomWindows(10), 20)
