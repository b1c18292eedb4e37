"""Every example's --device: accepted by its parser, defaulting as the main job's, and on the CPU the run it was."""

import importlib

import pytest
import torch

EXAMPLES = ["char_lm", "vowels", "spiking_vowels", "sysid", "decoder", "xlstm_lm", "memory_transformer"]


def example(name):
    return importlib.import_module(f"ignite_tbptt.examples.{name}")


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_takes_device_defaulting_to_cuda_where_there_is_one(name):
    assert example(name).parse_args(["--device", "cpu"]).device == "cpu"
    assert example(name).parse_args([]).device == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize(
    ("device", "gpus", "fix"),
    [
        ("cuda", 0, "sees no CUDA device: pass --device cpu"),
        ("cuda:1", 1, "torch sees 1 CUDA device(s): pass cuda:0, or cuda"),
        ("cuda:4", 2, "torch sees 2 CUDA device(s): pass cuda:0 to cuda:1, or cuda"),
        ("gpu", 1, "'gpu' is not a device: pass cpu, cuda or cuda:N"),
    ],
)
def test_every_example_refuses_a_device_torch_does_not_see_as_it_reads_its_options(
    name, device, gpus, fix, monkeypatch, capsys
):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(SystemExit):
        example(name).parse_args(["--device", device])
    assert fix in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the default device is cuda here: its kernels round otherwise")
@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("decoder", ["--length", "400", "--hidden", "32"]),  # the trainer alone, data drawn in the example
        ("vowels", ["--epochs", "1"]),  # trainer, evaluator and the accuracy loop, with and without memory
        ("sysid", ["--steps", "20"]),  # windows from a DataLoader, a burn-in, the free runs
    ],
)
def test_device_cpu_gives_the_run_without_it_figure_for_figure(name, argv):
    without, with_cpu = example(name).main(argv), example(name).main([*argv, "--device", "cpu"])
    for result in (without, with_cpu):
        result.pop("peak_memory_mib", None)  # the process's high-water mark: only grows from one run to the next
        result.pop("seconds", None)
    assert with_cpu == without
