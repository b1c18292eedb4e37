"""LossSum: the loss of a window or an iteration over segments summed as sums and as means."""

import pytest
import torch

from ignite_tbptt.runtime import LossSum


def test_sums_and_means_add_up_to_the_per_target_mean():
    total = LossSum()
    total.add(torch.tensor(6.0, dtype=torch.float64), 3)  # a sum over 3 targets
    total.add(torch.tensor(0.5, dtype=torch.float64), 4, mean=True)  # a mean over 4
    total.add(0.0, 0)  # a segment without targets adds nothing
    assert total.targets == 7
    assert total.total().item() == 8.0
    assert total.mean().item() == 8.0 / 7


def test_a_single_mean_is_returned_as_it_is_and_no_targets_give_zero():
    mean = torch.tensor(1.25)
    total = LossSum()
    total.add(mean, 5, mean=True)
    assert total.mean() is mean and total.divisor == 1
    assert total.total().item() == 6.25
    assert LossSum().mean().item() == 0.0 and LossSum().total() == 0.0


def test_state_dict_keeps_the_sum_and_the_count():
    total = LossSum()
    total.add(torch.tensor(0.5, dtype=torch.float64), 4, mean=True)
    total.add(torch.tensor(3.0, dtype=torch.float64), 2)
    restored = LossSum()
    restored.load_state_dict(total.state_dict())
    # To the last bit on the CPU; CUDA divides by a number by multiplying with its reciprocal, within 1 ulp.
    assert restored.targets == 6 and restored.mean().item() == pytest.approx(5.0 / 6, rel=2**-52, abs=0)
    empty = LossSum()
    empty.load_state_dict(LossSum().state_dict())
    assert empty.targets == 0 and empty.total() == 0.0
