"""The figures README.md gives for the examples, parsed from its text, for the tests that hold it to a fresh run.

Each example's test runs it as the README describes (its defaults, on the CPU) and compares what it prints with
:func:`figures` within the tolerances below. They cover what moves with the machine rather than the code: torch's
threads (one thread against two moved the vowels' 0.364 bits per frame to 0.366 and the decoder's 0.985 to 0.988),
and another CPU's kernels. The memory transformer's figures move by up to 0.03 bits with the threads, so the README
gives them for two threads and for one, and its test compares the run with the set of its thread count. Where a
change to the package moves a figure by more, the test fails until the README says what the example prints.

The runs that take minutes (the main job, xLSTM, the memory transformer, Mamba2) run where ``README_FIGURES=1`` is set;
the others run with the slow tests.
"""

import os
import re
from pathlib import Path

import pytest

__all__ = ["figures", "BITS", "POINTS", "full_run"]

TEXT = " ".join((Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8").split())
BITS = 0.02  # bits per character or per frame
POINTS = 1.0  # percentage points of utterances or digits named right

full_run = pytest.mark.skipif(
    os.environ.get("README_FIGURES") != "1", reason="a run of minutes: set README_FIGURES=1 to compare it"
)

PATTERNS = {
    "char_lm": r"\(([\d.]+) after one epoch and ([\d.]+) after two with Python",
    "vowels": r"it prints, on the 370 test utterances, ([\d.]+) bits per frame and the speaker right at the last frame "
    r"of ([\d.]+)% of them, against ([\d.]+) bits and ([\d.]+)% for the same model trained without memory",
    "spiking_vowels": r"names the speaker at the last frame of ([\d.]+)% of the test utterances \(([\d.]+) bits per "
    r"frame\), against ([\d.]+)% \(([\d.]+) bits\) for the same network",
    "xlstm_lm": r"validation bits per character: ([\d.]+) with TBPTT\(16, 64\), ([\d.]+) with TBPTT\(16, 16\)",
    "memory_transformer": r"After 5,000 optimizer steps on the main corpus: ([\d.]+) bits per character with the "
    r"gradient through the memory \(TBPTT\(32, 96\)\), ([\d.]+) with the memory carried but no gradient through it "
    r"\(TBPTT\(32, 32\)\), ([\d.]+) without memory.*? With one thread \(`OMP_NUM_THREADS=1`\) the same run prints "
    r"([\d.]+), ([\d.]+) and ([\d.]+),",
    "mamba_lm": r"Trained with the state carried: ([\d.]+) carried and ([\d.]+) in chunks.*?"
    r"\(`--reset-every-window`\): ([\d.]+) carried and ([\d.]+) in chunks",
    "decoder": r"examples\.decoder # TBPTT\(1, 8\): last batch accuracy ([\d.]+) .*?"
    r"examples\.decoder --k2 3 # TBPTT\(1, 3\), no longer than the delay of 3: ([\d.]+),",
}


def figures(example: str) -> list[float]:
    """The figures README.md gives for ``example``, in the order of its pattern (percentages as written)."""
    match = re.search(PATTERNS[example], TEXT)
    assert match, f"README.md no longer says {PATTERNS[example]!r}"
    return [float(v) for v in match.groups()]
