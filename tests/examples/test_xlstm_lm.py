"""The xLSTM example: the official package's xLSTMLarge, refused as it is, trained through a functional model_fn."""

import pytest
import torch

from ignite_tbptt.examples import xlstm_lm

from .documented import BITS, figures, full_run, within

pytestmark = pytest.mark.slow


def test_xlstm_own_forward_is_refused_naming_the_state_it_writes_into():
    message = xlstm_lm.main(["--show-error"])["error"]
    assert message.startswith("the model wrote in place into state[0][0] of the hidden state it was given")
    assert "of the window [16, 32)" in message


def test_the_functional_model_fn_computes_the_models_own_forward_with_a_new_state():
    # The model's own forward copies the new state into the given one, which autograd cannot backpropagate even
    # over one chunk; the model_fn must compute the same logits and state, returning the state new.
    torch.manual_seed(0)
    model = xlstm_lm.build_model(20, embedding=32, blocks=2, heads=2, chunk=8).double()
    x = torch.randint(0, 20, (2, 16))
    with torch.no_grad():
        _, state = xlstm_lm.xlstm_model_fn(model, x[:, :8], None)
        given = {i: tuple(t.clone() for t in s) for i, s in state.items()}
        logits, new_state = xlstm_lm.xlstm_model_fn(model, x[:, 8:], state)
        own_logits, own_state = model(x[:, 8:], given)
    torch.testing.assert_close(logits, own_logits, rtol=0, atol=0)
    for block in own_state:
        for ours, theirs, old in zip(new_state[block], own_state[block], state[block], strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
            assert ours is not old  # new tensors, the old state untouched
    assert all(
        torch.equal(a, b) for i in state for a, b in zip(state[i], xlstm_lm.xlstm_model_fn(model, x[:, :8], None)[1][i])
    )


def test_both_truncations_learn_the_main_corpus():
    result = xlstm_lm.main(["--steps", "60", "--max-chars", "60000", "--batch-size", "8"])
    for name in ("k2>k1", "k2=k1"):
        assert result[name]["valid_bpc"] < result["unigram_bpc"] - 0.5
    assert (result["k2>k1"]["k2"], result["k2=k1"]["k2"]) == (64, 16)


@full_run
@pytest.mark.cpu_only("the documented figures are CPU runs")
def test_the_example_prints_figures_within_the_spread_its_page_gives():
    result = xlstm_lm.main([])  # the defaults: a few minutes
    printed = [result["k2>k1"]["valid_bpc"], result["k2=k1"]["valid_bpc"]]
    assert all(within(v, s, BITS) for v, s in zip(printed, figures("xlstm_lm"), strict=True)), printed
