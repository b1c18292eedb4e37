"""The recordings example: real multi-sequence numeric data, packed, trained with TBPTT(k1, k2), k2 > k1."""

import math

import pytest
import torch

from ignite_tbptt.examples import vowels

from .readme import BITS, POINTS, figures

pytestmark = pytest.mark.slow  # trains two small models on the whole training set


def test_the_bundled_data_reads_as_the_uci_set_describes_it():
    train, test = vowels.load_vowels()
    assert (len(train), len(test)) == (270, 370)
    for x, y in train + test:
        assert x.dtype == torch.float32 and x.shape[1] == 12 and 7 <= x.shape[0] <= 29
        assert y.shape == (x.shape[0],) and (y == y[0]).all()
    speakers = torch.stack([y[0] for _, y in train])
    assert torch.bincount(speakers).tolist() == [30] * 9  # 30 training utterances per speaker


def test_memory_beats_chance_and_the_memoryless_baseline_at_the_last_frame():
    result = vowels.main(["--epochs", "4"])
    assert result["memory_bits"] < 1.0 < math.log2(9) == result["chance_bits"]
    assert result["memory_accuracy"] > 0.8 > 1 / 9
    assert result["memory_accuracy"] > result["no_memory_accuracy"]


@pytest.mark.cpu_only("the README's figures are CPU runs")
def test_the_readme_gives_the_figures_the_example_prints():
    result = vowels.main([])  # the defaults: about 25 s
    bits, right, bits_without, right_without = figures("vowels")
    assert result["memory_bits"] == pytest.approx(bits, abs=BITS)
    assert result["no_memory_bits"] == pytest.approx(bits_without, abs=BITS)
    assert 100 * result["memory_accuracy"] == pytest.approx(right, abs=POINTS)
    assert 100 * result["no_memory_accuracy"] == pytest.approx(right_without, abs=POINTS)
