"""Every example's --device: accepted by its parser, defaulting as the main job's, and on the CPU the run it was."""

import importlib

import pytest
import torch

EXAMPLES = ["char_lm", "vowels", "spiking_vowels", "decoder", "xlstm_lm", "memory_transformer"]


def example(name):
    return importlib.import_module(f"ignite_tbptt.examples.{name}")


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_takes_device_defaulting_to_cuda_where_there_is_one(name):
    assert example(name).parse_args(["--device", "cpu"]).device == "cpu"
    assert example(name).parse_args([]).device == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the default device is cuda here: its kernels round otherwise")
@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("decoder", ["--length", "400", "--hidden", "32"]),  # the trainer alone, data drawn in the example
        ("vowels", ["--epochs", "1"]),  # trainer, evaluator and the accuracy loop, with and without memory
    ],
)
def test_device_cpu_gives_the_run_without_it_figure_for_figure(name, argv):
    without, with_cpu = example(name).main(argv), example(name).main([*argv, "--device", "cpu"])
    for result in (without, with_cpu):
        result.pop("peak_memory_mib", None)  # the process's high-water mark: only grows from one run to the next
    assert with_cpu == without
