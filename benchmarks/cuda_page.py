"""The CUDA page from a device check's output: ``python -m benchmarks.cuda_page [DIR] [--out FILE]``.

``bash benchmarks/gpu_check.sh`` leaves its tables and logs in ``DIR`` (default ``gpu-check/``); this assembles them
into one page (default ``docs/benchmarks-cuda.md``): the suite on the device, the table at the sizes people train in
float32 and bfloat16, the launch-bound table with CUDA graphs, the main job eager and graphed, and fla's models
beside the LSTM and Hugging Face's Mamba2 at equal time (the fla example's table). Each part that
the check did not leave is named as missing rather than left out silently; a ``tests-note.md`` beside the logs says
how a rerun of the tests differed from the check's step.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def _text(folder: Path, name: str) -> str | None:
    path = folder / name
    return path.read_text() if path.is_file() else None


def _body(page: str) -> str:
    """A generated page without its title: its headings one level down, to sit in a section."""
    lines = page.splitlines()[1:]
    return "\n".join("#" + line if line.startswith("#") else line for line in lines).strip()


def _table(page: str) -> str:
    return "\n".join(line for line in page.splitlines() if line.startswith("|"))


def _steps(folder: Path) -> dict[str, tuple[str, int]]:
    """``steps.tsv``: each step's outcome (``done`` or ``FAILED``) and seconds, as the check wrote them."""
    text = _text(folder, "steps.tsv") or ""
    return {
        name: (outcome, int(seconds))
        for name, outcome, seconds in (line.split("\t") for line in text.split("\n") if line)
    }


def _summaries(log: str) -> list[str]:
    """pytest's summary lines in ``log`` ("3 passed, 1 skipped in 2.0s"), stripped of their rule."""
    return [line.strip("= ") for line in log.splitlines() if re.search(r"\d+ (passed|failed)", line)]


def tests_section(folder: Path) -> str:
    parts, steps = [], _steps(folder)
    runs = (("tests", "the training tests"), ("graph-tests", "the CUDA-graph tests, in a pytest of their own"))
    for name, what in runs:
        log = _text(folder, f"{name}.log")
        if log is None:
            parts.append(f"The check left no `{name}.log` ({what}).")
            continue
        summary = _summaries(log)
        # "FAILED tests/x.py::test[a b] - Error...": the name runs to " - " (parametrize ids may hold spaces); logged
        # "ERROR    ignite..." lines are no test's.
        failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+::.*?)(?: - .*)?$", log, re.MULTILINE)))
        outcome, seconds = steps.get(name, ("done", 0))
        if not summary and outcome == "FAILED":  # stopped at the step's time limit before pytest's summary
            summary = [f"stopped after {seconds} s, before pytest's summary"]
        text = f"`python -m pytest --device cuda`, {what}: **{summary[-1] if summary else 'no summary'}**."
        if failed:
            text += " Failing:\n\n" + "\n".join(f"- `{test}`" for test in failed)
        parts.append(text)
    note = _text(folder, "tests-note.md")  # what a rerun did other than the check's steps, where it did
    if note:
        parts.append(note.strip())
    return "\n\n".join(parts)


def main_job_section(folder: Path) -> str:
    steps = _steps(folder)
    rows = []
    for name, label in (("main-job", "eager"), ("main-job-graphs", "`--cuda-graphs`")):
        log = _text(folder, f"{name}.log")
        if log is None:
            continue
        bpc = re.findall(r"validation ([\d.]+) bits/char", log)
        outcome, seconds = steps.get(name, ("?", 0))
        rows.append(f"| {label} | {', '.join(bpc) or '-'} | {seconds if outcome == 'done' else outcome} |")
    if not rows:
        return "The check left no main-job logs."
    header = "| run | validation bits/char per epoch | seconds (the whole job: data, model, training, validation) |"
    return "\n".join([header, "|---|---|---|", *rows])


def fla_section(folder: Path) -> str:
    """The fla example's comparison (``python -m ignite_tbptt.examples.fla_lm --compare``) and its test run."""
    parts = []
    tests = _text(folder, "fla-tests.log")
    summary = _summaries(tests or "")
    parts.append(
        "`python -m pytest tests/models/test_fla.py tests/examples/test_fla_lm.py --device cuda`: "
        + (f"**{summary[-1]}**." if summary else "the check left no summary (`fla-tests.log`).")
    )
    log = _text(folder, "fla-example.log")
    table = _table(log) if log else ""
    if table:
        header = next((line for line in log.splitlines() if line.startswith("Each model trained")), "")
        parts.append(f"`python -m ignite_tbptt.examples.fla_lm --compare`: {header}\n\n{table}")
    else:
        parts.append("The check left no table of the fla example (`fla-example.log`).")
    return "\n\n".join(parts)


def prequential_section(folder: Path) -> str:
    """``benchmarks.tradeoff.online_device``'s table: per-token TBPTT(1, b) against TBPTT(b, b), eager and graphed."""
    log = _text(folder, "prequential.log")
    table = _table(log) if log else ""
    if not table:
        return "The check left no table of per-token updates (`prequential.log`)."
    header = next((line for line in log.splitlines() if "torch" in line and not line.startswith("|")), "")
    return f"{header} (`python -m benchmarks.tradeoff.online_device --quick`):\n\n{table}"


def page(folder: Path) -> str:
    float32, bfloat16 = _text(folder, "table-float32.md"), _text(folder, "table-bfloat16.md")
    graphs = _text(folder, "graphs.md")
    parts = [
        "# Benchmarks on CUDA",
        "Assembled by `python -m benchmarks.cuda_page` from the output of `bash benchmarks/gpu_check.sh`; rerun "
        "the check rather than editing the numbers. Each table names its machine and command.",
        "## The suite on the device",
        tests_section(folder),
        "## At the sizes people train: float32",
        _body(float32) if float32 else "The check left no float32 table.",
        "## The same under bfloat16 autocast",
        _table(bfloat16) if bfloat16 else "The check left no bfloat16 table.",
        "## Where the model is small: launch-bound windows and CUDA graphs",
        _body(graphs) if graphs else "The check left no launch-bound table.",
        "## Per-token updates: the prequential study's main stream",
        prequential_section(folder),
        "## The main job on the device, one epoch",
        main_job_section(folder),
        "## flash-linear-attention's models, trained across chunks",
        fla_section(folder),
    ]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, nargs="?", default=Path("gpu-check"), help="the check's output folder")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks-cuda.md"))
    args = p.parse_args(argv)
    args.out.write_text(page(args.folder))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
