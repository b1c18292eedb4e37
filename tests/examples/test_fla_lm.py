"""The fla example: fla's models learn the main corpus with their state carried, and the comparison's table.

On the CPU the layers' Triton kernels are replaced by PyTorch references (``tests/models/fla_reference.py``, as the
adapter's tests do), which the command itself refuses (``--device cpu``), so these tests run the example's job with
the options a command on a CUDA device would read. Under ``--device cuda`` the command runs with fla's own kernels.
"""

import pytest
import torch

from ignite_tbptt.examples import fla_lm  # its command line: fla is imported by the job it runs

from ..models.fla_reference import use_reference_kernels

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fla_installed():
    """Skip where fla cannot be imported: at the first test, not as the suite is collected (fla takes seconds)."""
    pytest.importorskip("fla.models")


def options(*argv):
    """The example's options as the command reads them, on the CPU: the command's own device check left out."""
    return fla_lm.complete(fla_lm.parser().parse_args(["--quick", "--threads", "1", "--device", "cpu", *argv]))


@pytest.mark.parametrize("arch", fla_lm.ARCHS)
def test_each_architecture_learns_the_main_corpus_with_its_state_carried(arch, monkeypatch):
    calls = use_reference_kernels(monkeypatch)
    from ignite_tbptt.examples._fla_lm import run

    result = run(options("--arch", arch))
    assert result["mode"] == "carried" and result["steps"] == 120
    assert result["valid_bpc"] < result["unigram_bpc"] - 0.3
    assert result["valid_bpc_chunks"] < result["unigram_bpc"] - 0.3
    assert result["characters_per_second"] > 0
    kernel = {"gated_deltanet": "chunk_gated_delta_rule", "gla": "fused_recurrent_gla", "delta_net": "fused_recurrent"}
    assert any(name.startswith(kernel[arch]) for name in calls)  # the layer's own recurrence ran, not a stand-in


def test_independent_chunks_reset_the_state_at_every_window(monkeypatch):
    use_reference_kernels(monkeypatch)
    from ignite_tbptt.examples import _fla_lm

    resets, reset = [], _fla_lm.fla_reset_hidden

    def recorded(state, starts):
        resets.append(starts)
        return reset(state, starts)

    monkeypatch.setattr(_fla_lm, "fla_reset_hidden", recorded)
    result = _fla_lm.run(options("--reset-every-window", "--arch", "gla"))
    assert result["mode"] == "reset"
    assert resets and all(bool(starts.all()) for starts in resets)  # every column, at every window's start
    assert result["valid_bpc"] < result["unigram_bpc"] - 0.3


def test_the_comparison_trains_each_model_for_the_same_time_and_prints_one_table(monkeypatch, capsys):
    use_reference_kernels(monkeypatch)
    from ignite_tbptt.examples._fla_lm import run

    args = options("--compare", "--seconds", "1.5", "--arch", "gla")
    args.steps = 100_000  # past what 1.5 s train: the time ends each training (--quick alone sets 120 steps)
    result = run(args)
    rows = result["rows"]
    names = ["fla GLA", "fla GLA, state reset every window", "LSTM (the main job's)", "Mamba2 (Hugging Face's)"]
    assert [row["name"] for row in rows.values()] == names
    for row in rows.values():
        assert 1.5 <= row["seconds"] < 1.5 + 10  # stopped at the first iteration past the budget
        assert row["valid_bpc"] < result["unigram_bpc"]
        assert row["steps"] > 0 and row["characters_per_second"] > 0
    out = capsys.readouterr().out
    table = out.split("| model | parameters |", 1)[1].splitlines()
    assert len(table) == 1 + 1 + 4  # the header's rest, its rule, a row per model
    assert all(f"| {row['valid_bpc']:.3f} |" in "\n".join(table) for row in rows.values())
    with capsys.disabled():  # the device check's dry run puts the table from this test's output on its page
        print(out)


def test_on_a_cuda_device_the_command_trains_with_flas_own_kernels(request):
    if torch.device(request.config.getoption("--device")).type != "cuda":
        pytest.skip("fla's kernels need a CUDA device: python -m pytest tests/examples/test_fla_lm.py --device cuda")
    result = fla_lm.main(["--quick", "--device", "cuda"])
    assert result["valid_bpc"] < result["unigram_bpc"] - 0.3
