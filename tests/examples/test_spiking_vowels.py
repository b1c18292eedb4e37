"""The spiking example: snnTorch neurons keeping their membranes in attributes, trained through module_state."""

import pytest
import torch

from ignite_tbptt import create_tbptt_trainer
from ignite_tbptt.examples import spiking_vowels, vowels

from .documented import BITS, POINTS, figures, within

pytestmark = pytest.mark.slow  # trains two small networks on the whole training set


def test_memory_names_the_speaker_better_than_the_memoryless_network_and_chance(device):
    result = spiking_vowels.main([])  # the defaults: about 20 s
    # Over seeds 0-4 and 1 and 2 threads the memory named 1.4-5.4 points more of the utterances right (5 to 20 of 370)
    # and stayed above 95%, and another CPU's kernels gave 6.2 points with seed 0: the margins asserted here lie well
    # below the smallest gap measured.
    assert result["memory_accuracy"] > 0.9 > 1 / 9
    assert result["memory_accuracy"] > result["no_memory_accuracy"] + 0.005
    assert result["memory_bits"] < result["chance_bits"] - 2
    if device.type == "cpu":  # the documented spreads are of CPU runs; an H100's kernels gave 93.2% with seed 0
        printed = [100 * result["memory_accuracy"], result["memory_bits"]]
        printed += [100 * result["no_memory_accuracy"], result["no_memory_bits"]]
        margins = [POINTS, BITS, POINTS, BITS]
        assert all(map(within, printed, figures("spiking_vowels"), margins)), (printed, figures("spiking_vowels"))


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


def test_check_model_finds_the_network_carrying_its_membranes_through_module_state():
    from ignite_tbptt import check_model
    from ignite_tbptt.examples._spiking_vowels import STATE, SpikingSpeakerNet

    torch.manual_seed(0)
    x = 3 * torch.randn(12, 3, 12)  # (T, B, coefficients): enough drive for the neurons to spike
    check = check_model(SpikingSpeakerNet(hidden=16), x, module_state=STATE)
    assert check.ok, str(check)
    assert check["used"].figure > 0.1
    # Without module_state the model returns its outputs alone, which the trainer refuses, naming the fix.
    refused = check_model(SpikingSpeakerNet(hidden=16), x)["carried"]
    assert refused.passed is False and "module_state" in refused.detail
