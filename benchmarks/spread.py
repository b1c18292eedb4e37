"""The examples' figures over seeds and thread counts: ``python -m benchmarks.spread EXAMPLE... --seeds 0 1 2``.

A trained figure moves with the seed and with the machine's arithmetic: torch's thread count changes the order of
its sums, another CPU's kernels round otherwise, and training compounds the difference. One run's figure therefore
says little on its own; each example's page gives each figure as the range this script measures, and reads a difference
between two figures only where it has the same sign in every run (the ``a - b`` columns, computed run by run).

Each (seed, thread count) runs in a fresh process (``OMP_NUM_THREADS`` and ``torch.set_num_threads`` set before the
example loads), one at a time, and appends one JSON line to ``--out``. ``--page`` writes the markdown page of every
run in ``--out``, each example's runs and its spread (min-max); with no example named it only rewrites the page::

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.spread vowels spiking_vowels --seeds 0 1 2 3 4 --threads 1 2
    python -m benchmarks.spread --page docs/benchmarks-examples.md

Arguments after ``--`` go to every run of the examples (``-- --length 200``), for a quick check of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.report import markdown_table

__all__ = ["EXAMPLES", "Example", "main", "page", "spread"]

ROOT = Path(__file__).parent.parent


@dataclass(frozen=True)
class Example:
    """How to run one example and read its figures.

    Attributes:
        runs: the example's command-line arguments for each of its runs (``{"carried": [], "reset": [...]}``).
        figures: the figures, named as the README names them, from the results of ``runs`` (by their names).
        command: the example's command as the README gives it.
        differences: columns of the page computed run by run, ``name: (a, b)`` for figure ``a`` minus figure ``b``.
        percent: the figures in percent, written to 0.1 (the others to 0.001).
    """

    runs: dict[str, list[str]]
    figures: Callable[[dict[str, dict]], dict[str, float]]
    command: str
    differences: dict[str, tuple[str, str]] = field(default_factory=dict)
    percent: frozenset[str] = frozenset()


def _recordings(result: dict[str, dict]) -> dict[str, float]:
    r = result[""]
    return {
        "memory: bits/frame": r["memory_bits"],
        "memory: % right": 100 * r["memory_accuracy"],
        "memoryless: bits/frame": r["no_memory_bits"],
        "memoryless: % right": 100 * r["no_memory_accuracy"],
    }


MEMORY = {
    "memory - memoryless: bits/frame": ("memory: bits/frame", "memoryless: bits/frame"),
    "memory - memoryless: points right": ("memory: % right", "memoryless: % right"),
}
RIGHT = frozenset({"memory: % right", "memoryless: % right", "memory - memoryless: points right"})

EXAMPLES = {
    "vowels": Example({"": []}, _recordings, "python -m ignite_tbptt.examples.vowels", MEMORY, RIGHT),
    "spiking_vowels": Example({"": []}, _recordings, "python -m ignite_tbptt.examples.spiking_vowels", MEMORY, RIGHT),
    "decoder": Example(
        {"k2=8": [], "k2=3": ["--k2", "3"]},
        lambda r: {"TBPTT(1, 8): accuracy": r["k2=8"]["accuracy"], "TBPTT(1, 3): accuracy": r["k2=3"]["accuracy"]},
        "python -m ignite_tbptt.examples.decoder [--k2 3]",
    ),
    "sysid": Example(
        {"m=25": [], "m=0": ["--burn-in", "0"]},
        lambda r: {"burn-in 25: test RMSE": r["m=25"]["test_rmse"], "no burn-in: test RMSE": r["m=0"]["test_rmse"]},
        "python -m ignite_tbptt.examples.sysid [--burn-in 0]",
        {"25 - none": ("burn-in 25: test RMSE", "no burn-in: test RMSE")},
    ),
    "char_lm": Example(
        {"": ["--no-progress", "--checkpoint-every", "0"]},
        lambda r: {"epoch 1": r[""]["valid_bpc"][0], "epoch 2": r[""]["valid_bpc"][-1]},
        "python -m ignite_tbptt.examples.char_lm",
    ),
    "xlstm_lm": Example(
        {"": []},
        lambda r: {"TBPTT(16, 64)": r[""]["k2>k1"]["valid_bpc"], "TBPTT(16, 16)": r[""]["k2=k1"]["valid_bpc"]},
        "python -m ignite_tbptt.examples.xlstm_lm",
        {"(16, 64) - (16, 16)": ("TBPTT(16, 64)", "TBPTT(16, 16)")},
    ),
    "memory_transformer": Example(
        {"": []},
        lambda r: dict(
            zip(
                ["TBPTT(32, 96)", "TBPTT(32, 32)", "no memory"],
                [v["valid_bpc"] for k, v in r[""].items() if k != "unigram_bpc"],
            )
        ),
        "python -m ignite_tbptt.examples.memory_transformer",
        {
            "(32, 96) - (32, 32)": ("TBPTT(32, 96)", "TBPTT(32, 32)"),
            "(32, 96) - no memory": ("TBPTT(32, 96)", "no memory"),
            "(32, 32) - no memory": ("TBPTT(32, 32)", "no memory"),
        },
    ),
    "mamba_lm": Example(
        {"carried": [], "reset": ["--reset-every-window"]},
        lambda r: {
            "carried: read carried": r["carried"]["valid_bpc"],
            "carried: read in chunks": r["carried"]["valid_bpc_chunks"],
            "reset: read carried": r["reset"]["valid_bpc"],
            "reset: read in chunks": r["reset"]["valid_bpc_chunks"],
        },
        "python -m ignite_tbptt.examples.mamba_lm [--reset-every-window]",
        {
            "carried, chunks - carried": ("carried: read in chunks", "carried: read carried"),
            "carried - reset, each read as trained": ("carried: read carried", "reset: read in chunks"),
            "carried - reset, both read carried": ("carried: read carried", "reset: read carried"),
        },
    ),
}


def one_run(example: str, seed: int, threads: int, extra: list[str]) -> dict[str, float]:
    """Run ``example``'s runs with ``seed`` on ``threads`` of torch's threads in this process; returns its figures."""
    import importlib

    import torch

    torch.set_num_threads(threads)
    module = importlib.import_module(f"ignite_tbptt.examples.{example}")
    results = {}
    with tempfile.TemporaryDirectory() as logdir:
        for name, argv in EXAMPLES[example].runs.items():
            logs = ["--logdir", logdir] if example == "char_lm" else []
            results[name] = module.main([*argv, *logs, "--seed", str(seed), *extra])
    return EXAMPLES[example].figures(results)


def measure(example: str, seed: int, threads: int, extra: list[str]) -> dict:
    """:func:`one_run` in a fresh process on ``threads`` threads; returns the JSON line's record."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, "-m", "benchmarks.spread", "--child", out.name, example]
        command += ["--seeds", str(seed), "--threads", str(threads), "--", *extra]
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        figures = json.loads(Path(out.name).read_text())
    return {"example": example, "seed": seed, "threads": threads, "args": extra, "figures": figures, "seconds": seconds}


def columns(record: dict, spec: Example) -> dict[str, float]:
    """A run's figures as the page shows them: those ``spec`` reads, then its differences, computed from them."""
    values = {name: v for name, v in record["figures"].items() if not name.startswith("difference")}
    return values | {name: values[a] - values[b] for name, (a, b) in spec.differences.items()}


def spread(rows: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Each column's (min, max) over ``rows`` (the :func:`columns` of one example's runs)."""
    return {name: (min(r[name] for r in rows), max(r[name] for r in rows)) for name in rows[0]}


def _cell(value: float, name: str, spec: Example) -> str:
    """A figure as the README writes it: percentages and points to 0.1, bits and accuracies to 0.001."""
    return f"{value:.1f}" if name in spec.percent else f"{value:.3f}"


def _bounds(lo: float, hi: float, name: str, spec: Example) -> str:
    lo_text, hi_text = _cell(lo, name, spec), _cell(hi, name, spec)
    return lo_text if lo_text == hi_text else f"{lo_text} to {hi_text}" if lo < 0 else f"{lo_text}-{hi_text}"


def _over(runs: list[dict]) -> str:
    """The seeds run on each thread count, in words: ``"seeds 0, 1, 2 on 1 thread, seed 0 on 2 threads"``."""
    parts = []
    for threads in sorted({r["threads"] for r in runs}):
        seeds = sorted({r["seed"] for r in runs if r["threads"] == threads})
        parts.append(
            f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} on {threads} "
            f"thread{'s' if threads > 1 else ''}"
        )
    return ", ".join(parts)


def page(records: list[dict]) -> str:
    """The markdown page of ``records``: per example (and arguments) its command, its runs, each figure's spread."""
    sections = []
    for example, spec in EXAMPLES.items():
        for args in sorted({tuple(r["args"]) for r in records if r["example"] == example}):
            runs = [r for r in records if r["example"] == example and tuple(r["args"]) == args]
            runs.sort(key=lambda r: (r["seed"], r["threads"]))
            values = [columns(r, spec) for r in runs]
            names = list(values[0])
            rows = [
                [str(r["seed"]), str(r["threads"]), *(_cell(v[n], n, spec) for n in names)]
                for r, v in zip(runs, values)
            ]
            rows.append(["spread", "", *(_bounds(lo, hi, n, spec) for n, (lo, hi) in spread(values).items())])
            command = " ".join([spec.command, *args])
            sections.append(
                f"## {example}\n\n`{command}`, {len(runs)} runs: {_over(runs)}.\n\n"
                + markdown_table(["seed", "threads", *names], rows)
                + "\n"
            )
    return "\n".join(sections)


HEADER = """# Benchmarks: the examples' figures over seeds and threads

Generated by `python -m benchmarks.spread --page docs/benchmarks-examples.md` from the runs in
`docs/data/spread.jsonl`, each made by `OMP_WAIT_POLICY=PASSIVE python -m benchmarks.spread EXAMPLE --seeds ...
--threads ...`; rerun them rather than editing the numbers.

Machine: 2 cores of an AMD EPYC, Python 3.11, torch 2.13 (CPU build), transformers 5.24, xlstm 2.0.6, snnTorch 1.0;
each run in a fresh process on the given number of torch's threads (`OMP_NUM_THREADS`, `torch.set_num_threads`), the
example's defaults but `--seed`. Other jobs shared the cores at times, which moves the time a run takes but not its
figures.

A trained figure moves with the seed and with the machine's arithmetic: the thread count changes the order of torch's
sums, another CPU's kernels round otherwise, and training compounds the difference. Each example's page gives each
figure as the spread below and reads a difference between two figures only where it has the same sign in every run
(the `a - b` columns, computed run by run).

"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("examples", nargs="*", help=f"the examples to run, one run at a time: {', '.join(EXAMPLES)}")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "data" / "spread.jsonl", help="JSON lines appended")
    p.add_argument("--page", type=Path, help="write the markdown page of every run in --out")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # one run in this process, its figures to the file
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = p.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: arguments for every run of the examples
    for example in set(args.examples) - set(EXAMPLES):
        p.error(f"argument examples: got {example!r}; pass one of {', '.join(EXAMPLES)}")
    if args.child:
        args.child.write_text(json.dumps(one_run(args.examples[0], args.seeds[0], args.threads[0], extra)))
        return
    for example in args.examples:
        for seed in args.seeds:
            for threads in args.threads:
                record = measure(example, seed, threads, extra)
                with args.out.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
    if args.page:
        lines = args.out.read_text().splitlines() if args.out.exists() else []
        args.page.write_text(HEADER + page([json.loads(line) for line in lines]))


if __name__ == "__main__":
    main()
