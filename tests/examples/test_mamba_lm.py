"""The Mamba2 example: Hugging Face's Mamba2 learns the main corpus, its state carried or reset at every window."""

import pytest

pytest.importorskip("transformers")

from ignite_tbptt.examples import mamba_lm  # noqa: E402  (after the skip: the example needs transformers)

from .documented import BITS, figures, full_run, within  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["carried", "reset"])
def test_both_ways_of_training_learn_the_main_corpus_in_quick_mode(mode):
    # One thread: a few seconds, also where other jobs share the cores (torch's threads are restored after).
    result = mamba_lm.main(["--quick", "--threads", "1", *(["--reset-every-window"] if mode == "reset" else [])])
    assert result["mode"] == mode
    assert result["valid_bpc"] < result["unigram_bpc"] - 0.3
    assert result["valid_bpc_chunks"] < result["unigram_bpc"] - 0.3


@full_run
@pytest.mark.cpu_only("the documented figures are CPU runs")
def test_the_example_prints_figures_within_the_spread_its_page_gives():
    carried, chunked = mamba_lm.main([]), mamba_lm.main(["--reset-every-window"])  # about a minute each
    printed = [carried["valid_bpc"], carried["valid_bpc_chunks"], chunked["valid_bpc"], chunked["valid_bpc_chunks"]]
    assert all(within(v, s, BITS) for v, s in zip(printed, figures("mamba_lm"), strict=True)), printed
    # Each model read the way it was trained, carrying the state gained 0.06-0.15 bits over seeds 0-2.
    assert carried["valid_bpc"] < chunked["valid_bpc_chunks"] - 0.03
