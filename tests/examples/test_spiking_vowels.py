"""The spiking example: snnTorch neurons keeping their membranes in attributes, trained through module_state."""

import pytest
import torch

from ignite_tbptt import create_tbptt_trainer
from ignite_tbptt.examples import spiking_vowels, vowels

from .readme import BITS, POINTS, figures

pytestmark = pytest.mark.slow  # trains two small networks on the whole training set


def test_memory_names_the_speaker_better_than_the_memoryless_network_and_chance(device):
    result = spiking_vowels.main([])  # the defaults: about 20 s
    # 96.2% on the CPU, 93.2% with an H100's kernels (another rounding, another run of training).
    assert result["memory_accuracy"] > 0.9 > 1 / 9
    assert result["memory_accuracy"] > result["no_memory_accuracy"]
    assert result["memory_bits"] < result["chance_bits"]
    if device.type == "cpu":  # the README's figures are CPU runs
        right, bits, right_without, bits_without = figures("spiking_vowels")
        assert 100 * result["memory_accuracy"] == pytest.approx(right, abs=POINTS)
        assert 100 * result["no_memory_accuracy"] == pytest.approx(right_without, abs=POINTS)
        assert result["memory_bits"] == pytest.approx(bits, abs=BITS)
        assert result["no_memory_bits"] == pytest.approx(bits_without, abs=BITS)


def test_without_module_state_the_membranes_are_named_after_the_first_window():
    torch.manual_seed(0)
    model = spiking_vowels.SpikingSpeakerNet(hidden=8)
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        vowels.cross_entropy,
        4,
        8,
        carry_hidden=True,
        model_fn=lambda m, x, hidden: (m(x), None),  # the forward as a user first tries it
    )
    x, y = torch.randn(12, 2, 12), torch.randint(0, 9, (12, 2))
    with pytest.raises(
        RuntimeError, match=r"graph in lif1\.mem, lif2\.mem\..*module_state=\['lif1\.mem', 'lif2\.mem'\]"
    ):
        trainer.run([(x, y)])
