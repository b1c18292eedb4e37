"""The Recurrent Memory Transformer example: memory tokens as the hidden state, a learned initial memory."""

import copy

import pytest
import torch

from ignite_tbptt import TBPTTEvents, create_tbptt_trainer
from ignite_tbptt.examples import memory_transformer as mt

from .documented import BITS, figures, full_run, within

pytestmark = pytest.mark.slow


def test_the_memory_is_read_at_a_segments_start_and_written_at_its_end():
    torch.manual_seed(0)
    model = mt.MemoryTransformer(12, width=16, heads=2, layers=1, memory=3, segment=5).double()
    x = torch.randint(0, 12, (2, 5))
    memory = model.start(2)
    logits, written = model(x, memory)
    assert logits.shape == (2, 5, 12) and written.shape == (2, 3, 16)
    # A character's logits depend on the read memory and the characters before it, not on later ones.
    later = x.clone()
    later[:, 3:] = (later[:, 3:] + 1) % 12
    torch.testing.assert_close(model(later, memory)[0][:, :3], logits[:, :3], rtol=0, atol=1e-12)
    assert not torch.allclose(model(x, memory + torch.randn_like(memory))[0][:, 0], logits[:, 0])  # reads memory


def test_the_learned_initial_memory_learns_only_from_windows_that_reach_the_streams_start():
    # TBPTT(5, 10) over 20 steps: windows 1 and 2 reach step 0, windows 3 and 4 do not.
    torch.manual_seed(0)
    model = mt.MemoryTransformer(12, width=16, heads=2, layers=1, memory=3, segment=5).double()
    start = copy.deepcopy(model.start.tokens)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = create_tbptt_trainer(
        model, optimizer, mt.cross_entropy, 5, 10, time_dim=1, carry_hidden=True, initial_state=model.start
    )
    grads = []

    @trainer.on(TBPTTEvents.OPTIMIZER_STEP_STARTED)
    def record(_):
        grad = model.start.tokens.grad
        grads.append(0.0 if grad is None else grad.abs().sum().item())

    tokens = torch.randint(0, 12, (2, 21))
    trainer.run([(tokens[:, :-1], tokens[:, 1:])])
    assert grads[0] > 0 and grads[1] > 0 and grads[2] == 0 and grads[3] == 0
    assert torch.equal(model.start.tokens, start)  # lr 0: only the gradients were looked at


def test_the_three_variants_learn_the_main_corpus():
    result = mt.main(["--steps", "40", "--max-chars", "40000", "--batch-size", "8", "--width", "32"])
    variants = [name for name in result if name != "unigram_bpc"]
    assert len(variants) == 3
    for name in variants:
        assert result[name]["valid_bpc"] < result["unigram_bpc"]
    assert [result[name]["k2"] for name in variants] == [96, 32, 32]


@full_run
@pytest.mark.cpu_only("the documented figures are CPU runs")
def test_the_example_prints_figures_within_the_spread_its_page_gives():
    result = mt.main([])  # the defaults: about 10 minutes
    printed = [result[name]["valid_bpc"] for name in result if name != "unigram_bpc"]  # in the page's order
    # Torch's threads round the attention's sums otherwise, which moves these figures by some hundredths of a bit: the
    # page's spreads are over seeds and thread counts.
    assert all(within(v, s, BITS) for v, s in zip(printed, figures("memory_transformer"), strict=True)), printed
