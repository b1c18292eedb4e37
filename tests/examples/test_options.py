"""What a user meets at the command line: options refused as they are read, help with defaults, no torch for --help."""

import argparse
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ignite_tbptt.examples import options
from ignite_tbptt.examples.options import HelpFormatter, busy_cores_note

from .documented import PATTERNS, figures, page_text

EXAMPLES = [
    "char_lm",
    "vowels",
    "spiking_vowels",
    "sysid",
    "decoder",
    "xlstm_lm",
    "memory_transformer",
    "mamba_lm",
    "fla_lm",
]
PACKAGE = Path(__file__).parents[2] / "ignite_tbptt"
POSITIVE = "got {}; pass a whole number of 1 or more"

# Each example's bad options, and the one line that refuses them: argparse's "argument --X: ..." for a value wrong in
# itself, the example's own check for values that cannot go together.
REFUSED = {
    "char_lm": [
        (["--k1", "0"], "argument --k1: " + POSITIVE.format(0)),
        (["--k2", "0"], "argument --k2: " + POSITIVE.format(0)),
        (["--k1", "-5"], "argument --k1: " + POSITIVE.format(-5)),
        (["--batch-size", "0"], "argument --batch-size: " + POSITIVE.format(0)),
        (["--seq-len", "0"], "argument --seq-len: " + POSITIVE.format(0)),
        (["--epochs", "0"], "argument --epochs: " + POSITIVE.format(0)),
        (["--threads", "0"], "argument --threads: " + POSITIVE.format(0)),
        (["--nproc", "0"], "argument --nproc: " + POSITIVE.format(0)),
        (["--hidden", "many"], "argument --hidden: 'many' is not a whole number"),
        (["--lr", "0"], "argument --lr: got 0; pass a number above 0"),
        (["--clip", "-1"], "argument --clip: got -1; pass 0 or more"),
        (["--valid-fraction", "1"], "argument --valid-fraction: got 1; pass a number between 0 and 1, such as 0.05"),
        (["--text", "missing.txt"], "argument --text: missing.txt: no such file; check the path"),
        (["--resume", "missing.pt"], "argument --resume: missing.pt: no such file; check the path"),
        (["--device", "gpu"], "argument --device: 'gpu' is not a device: pass cpu, cuda or cuda:N"),
        (["--cuda-graphs", "--k2", "10"], "--cuda-graphs captures fixed windows with k2 >= k1: pass --k2 50 or more"),
        (["--artbp", "3"], "--artbp 3 is shorter than --artbp-grid 5: pass --artbp 5 or more"),
        (["--adaptive", "0.1", "--k2-max", "50"], "pass --k2-max 51 or more."),
        (["--fsdp"], "--fsdp shards the model over processes: pass --nproc 2 or more."),
    ],
    "vowels": [
        (["--k1", "0"], "argument --k1: " + POSITIVE.format(0)),
        (["--seq-len", "0"], "argument --seq-len: " + POSITIVE.format(0)),
        (["--epochs", "0"], "argument --epochs: " + POSITIVE.format(0)),
        (["--lr", "-1"], "argument --lr: got -1; pass a number above 0"),
    ],
    "spiking_vowels": [
        (["--k2", "0"], "argument --k2: " + POSITIVE.format(0)),
        (["--hidden", "0"], "argument --hidden: " + POSITIVE.format(0)),
        (["--epochs", "0"], "argument --epochs: " + POSITIVE.format(0)),
    ],
    "sysid": [
        (["--steps", "0"], "argument --steps: " + POSITIVE.format(0)),
        (["--burn-in", "-1"], "argument --burn-in: got -1; pass a whole number of 0 or more"),
        (["--system", "silverbox"], "argument --system: invalid choice: 'silverbox' (choose from "),
        (["--window", "20"], "--burn-in 25 leaves no step of a --window 20 in the loss: pass a shorter --burn-in"),
        (["--method", "carried", "--window", "300"], "--window 300 in --batch-size 16 columns is more than the"),
        (["--window", "5000"], "--window 5000 is longer than the record's 4000 samples: pass a shorter --window."),
        (["--method", "full", "--k2", "10"], "--method full backpropagates the whole record at every step: leave --k2"),
    ],
    "decoder": [
        (["--length", "0"], "argument --length: " + POSITIVE.format(0)),
        (["--delay", "0"], "argument --delay: " + POSITIVE.format(0)),
        (["--vocab", "1"], "--vocab 1: one digit leaves nothing to learn; pass --vocab 2 or more."),
        (["--length", "3"], "--delay 3 leaves no digit to copy in --length 3: pass a shorter --delay."),
    ],
    "xlstm_lm": [
        (["--steps", "0"], "argument --steps: " + POSITIVE.format(0)),
        (["--seq-len", "60"], "--seq-len 60 must be a multiple of --k1 16, the chunk size of every model call."),
        (["--embedding", "66"], "--embedding 66 must be a multiple of 2 x --heads 2"),
    ],
    "memory_transformer": [
        (["--segment", "0"], "argument --segment: " + POSITIVE.format(0)),
        (["--width", "30"], "--width 30 must be a multiple of the 4 attention heads: pass 28."),
        (["--max-chars", "0"], "argument --max-chars: " + POSITIVE.format(0)),
    ],
    "mamba_lm": [
        (["--k1", "0"], "argument --k1: " + POSITIVE.format(0)),
        (["--threads", "0"], "argument --threads: " + POSITIVE.format(0)),
        (["--seq-len", "100"], "--seq-len 100 must be a multiple of --k1 32"),
        (["--heads", "3"], "--heads 3 must divide 2 x --hidden (128), the inner width the heads span."),
        (["--k1", "4", "--k2", "5", "--seq-len", "64"], "--k1 4 --k2 5: TBPTT(k1=4, k2=5) would call Mamba2 on"),
    ],
    "fla_lm": [
        (["--k1", "0"], "argument --k1: " + POSITIVE.format(0)),
        (["--seconds", "0"], "argument --seconds: got 0; pass a number above 0"),
        (
            ["--arch", "rwkv7"],
            "argument --arch: invalid choice: 'rwkv7' (choose from ",  # the choices' quotes vary with Python
        ),
        (["--seq-len", "100"], "--seq-len 100 must be a multiple of --k1 64"),
        (["--heads", "3"], "--heads 3 must divide --hidden 64: pass a --hidden that is a multiple of 3."),
        (
            ["--arch", "gla", "--hidden", "36"],
            "--heads 4 must divide half of --hidden (18), GLA's key width: pass a --hidden that is a multiple of 8.",
        ),
        (["--compare", "--reset-every-window"], "--compare trains the fla model both ways already"),
        (["--cuda-graphs", "--k2", "128"], "--cuda-graphs captures k1 = k2 windows: pass --k2 64"),
        (["--device", "cpu"], "--device cpu: fla's kernels are Triton kernels, which run on a CUDA device only"),
    ],
}
CASES = [(name, argv, message) for name, cases in REFUSED.items() for argv, message in cases]


def example(name):
    return importlib.import_module(f"ignite_tbptt.examples.{name}")


@pytest.mark.parametrize(("name", "argv", "message"), CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_a_bad_option_is_refused_in_one_line_before_anything_loads(name, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        example(name).main(argv)
    assert refused.value.code == 2  # argparse's status for a usage error
    out, err = capsys.readouterr()
    last = err.splitlines()[-1]  # after argparse's usage lines: the one line that says what to pass
    assert last.startswith(f"python -m ignite_tbptt.examples.{name}: error: ") and message in last, err
    assert out == ""  # no data line: nothing was loaded
    assert list(tmp_path.iterdir()) == []  # no runs/ directory, no checkpoint


def test_a_bad_option_on_the_command_line_ends_in_one_line_not_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "ignite_tbptt.examples.char_lm", "--k1", "0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)},
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "python -m ignite_tbptt.examples.char_lm: error: argument --k1: got 0; pass a whole number of 1 or more"
    )
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", EXAMPLES)
def test_help_names_the_command_and_every_options_help_and_default(name, capsys):
    p = example(name).parser()
    formatter = HelpFormatter(p.prog)
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = isinstance(action, argparse._StoreTrueAction)
        text = formatter._get_help_string(action)
        assert action.help, action.option_strings
        assert flag or "default" in text, f"{action.option_strings} shows no default"
    with pytest.raises(SystemExit) as done:
        example(name).parse_args(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m ignite_tbptt.examples.{name} [-h]")


# The command a user types, in a fresh interpreter: `python -m` imports the package's root first, whose public
# names load on first use, so --help parses before torch or any other heavy library is imported.
HELP = """
import runpy, sys
sys.argv = ["python -m ignite_tbptt.examples." + sys.argv[1], "--help"]
try:
    runpy.run_module("ignite_tbptt.examples." + sys.argv[0].rpartition(".")[2], run_name="__main__", alter_sys=True)
except SystemExit as done:
    assert done.code == 0
heavy = {"torch", "ignite", "numpy", "tensorboard", "transformers", "xlstm", "snntorch", "sktime", "fla"}
print(sorted(heavy & {name.partition(".")[0] for name in sys.modules}))
"""


@pytest.mark.parametrize("name", EXAMPLES)
def test_help_imports_neither_torch_nor_any_other_heavy_library(name):
    result = subprocess.run([sys.executable, "-c", HELP, name], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout
    assert f"usage: python -m ignite_tbptt.examples.{name}" in result.stdout


def test_the_forwarded_names_are_the_jobs_own():
    from ignite_tbptt.examples import _char_lm, char_lm

    assert char_lm.CharLSTM is _char_lm.CharLSTM and char_lm.load_data is _char_lm.load_data
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        char_lm.nothing  # noqa: B018


def test_a_command_tells_the_user_once_where_other_processes_keep_the_cores_busy(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.2, 0.8))  # another job on the 2 cores
    monkeypatch.setattr(options, "running_now", lambda: 1)
    assert busy_cores_note("pass --threads 1", threads=2) == (
        "note: other processes keep these 2 cores busy (load average 1.9), and torch's 2 threads spin while they wait "
        "for each other, which can make this run many times slower: pass --threads 1, or set OMP_WAIT_POLICY=PASSIVE."
    )
    assert busy_cores_note("pass --threads 1", threads=1) is None  # one thread waits on nobody
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.2, 0.2))
    assert busy_cores_note("pass --threads 1", threads=2) is None  # idle cores: spinning is the fastest way
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.2, 0.8))
    assert busy_cores_note("pass --threads 1", threads=8) is None  # cores enough for the others and these threads
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(options, "running_now", lambda: 0)
    assert busy_cores_note("pass --threads 1", threads=2) is None  # the load of a job that has just ended


def test_each_example_page_gives_the_figures_its_test_looks_for_as_measured_on_the_spread_page():
    measured = (PACKAGE.parent / "docs" / "benchmarks-examples.md").read_text(encoding="utf-8")
    for example, pattern in PATTERNS.items():
        assert len(figures(example)) == re.compile(pattern).groups > 0
        # The spreads the page gives are those benchmarks.spread measured: the spread row of the example's section.
        section = measured.split(f"\n## {example}\n", 1)[1].split("\n## ", 1)[0]
        row = next(line for line in section.splitlines() if line.startswith("| spread |"))
        cells = {cell.strip() for cell in row.split("|")}
        given = re.search(pattern, page_text(example)).groups()
        assert set(given) <= cells, (example, set(given) - cells)
