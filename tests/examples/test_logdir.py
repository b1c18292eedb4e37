"""Every example writes its TensorBoard curves under ``--logdir``, one directory per model it trains, as the main job.

Each runs here with its smallest options (a few seconds); the curves are read back from the event files.
"""

import importlib

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

LOGGED = {  # the example's short run, and the directories its models log to
    "vowels": (["--epochs", "1", "--seq-len", "20"], ["memory", "no_memory"]),
    "spiking_vowels": (["--epochs", "1", "--seq-len", "16"], ["memory", "no_memory"]),
    "decoder": (["--length", "200", "--hidden", "16"], ["tbptt-1-8"]),
    "sysid": (["--steps", "5"], ["duffing-windows-m25"]),
    "xlstm_lm": (["--steps", "4", "--max-chars", "20000", "--batch-size", "4"], ["tbptt-16-64", "tbptt-16-16"]),
    "memory_transformer": (
        ["--steps", "4", "--max-chars", "20000", "--batch-size", "4", "--width", "16"],
        ["tbptt-32-96", "tbptt-32-32", "tbptt-32-32-no-memory"],
    ),
    "mamba_lm": (["--quick", "--threads", "1", "--steps", "4"], ["carried"]),
}


def scalars(directory):
    """The scalar tags written under ``directory``, read back from its event files."""
    events = EventAccumulator(str(directory))
    events.Reload()
    return set(events.Tags()["scalars"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LOGGED))
def test_every_example_logs_each_model_it_trains_under_logdir(name, tmp_path):
    pytest.importorskip({"xlstm_lm": "xlstm", "mamba_lm": "transformers"}.get(name, "torch"))
    if name in ("vowels", "spiking_vowels"):
        pytest.importorskip("sktime")
    if name == "spiking_vowels":
        pytest.importorskip("snntorch")
    argv, runs = LOGGED[name]
    importlib.import_module(f"ignite_tbptt.examples.{name}").main([*argv, "--device", "cpu", "--logdir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(runs)
    for run in runs:
        tags = scalars(tmp_path / run)
        assert {"train/window_loss", "train/grad_norm", "train/lr/group_0"} <= tags, (run, tags)
        assert any(tag.startswith("test/") for tag in tags), (run, tags)


def test_the_fla_example_logs_each_model_of_its_comparison(tmp_path, monkeypatch):
    pytest.importorskip("fla.models")
    from ignite_tbptt.examples import _fla_lm, fla_lm

    from ..models.fla_reference import use_reference_kernels

    use_reference_kernels(monkeypatch)
    argv = ["--quick", "--threads", "1", "--device", "cpu", "--arch", "gla", "--compare", "--logdir", str(tmp_path)]
    args = fla_lm.complete(fla_lm.parser().parse_args(argv))  # the command's CUDA check left out, as its tests do
    args.steps, args.seconds = 4, 0
    _fla_lm.run(args)
    runs = ["fla", "fla_chunks", "lstm", "mamba2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == runs
    for run in runs:
        assert {"train/window_loss", "test/valid_bpc"} <= scalars(tmp_path / run)


def test_a_logdir_that_is_a_file_is_refused_as_the_options_are_read(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("")
    from ignite_tbptt.examples import decoder

    with pytest.raises(SystemExit):
        decoder.parse_args(["--logdir", str(path)])
    assert f"argument --logdir: {path} is a file; pass a directory" in capsys.readouterr().err
