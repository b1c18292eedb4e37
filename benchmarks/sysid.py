"""Burn-in, carried state, k2 > k1 and full BPTT on system identification: ``python -m benchmarks.sysid``.

Two simulated systems (``ignite_tbptt.data``'s ``duffing`` and ``wiener_hammerstein``): a Duffing
oscillator, the Silverbox benchmark's structure (``y'' + 0.2 y' + y + y^3 = u``, sampled every 0.3 time units, its
resonance inside the input's band), and a Wiener-Hammerstein chain (two second-order resonant filters around a
saturation of 0.5), each driven by random-phase multisines of RMS 1: an estimation record of 4,000 samples, a
validation record of 1,000 and a test record of 2,000, each with its own phases, each simulated from rest. The model
is an LSTM of 16 units and a linear read-out, trained with Adam at 1e-2. The windowed and carried methods take the
same number of optimizer steps, each on 16 sequences of ``N = 50`` steps (800 samples a step):

- **windows, m = 0**: windows of N steps at random places of the estimation record, shuffled, each from a zero state
  (``RecordingWindows``, ``carry_hidden=False``), every step's loss counted;
- **windows, tuned m**: the same with a burn-in of m steps (``burn_in=m``, with gradient, Schiller et al.'s), m
  chosen from {10, 25, 40} by the validation error of the first seed;
- **windows, tuned m, no gradient**: the same m run without gradient (``burn_in_gradient=False``, R2D2's);
- **carried TBPTT(N, N)**: the record in 16 contiguous columns walked in order (``recording_columns``,
  ``carry_hidden=True``), the state carried from window to window;
- **carried TBPTT(N, 2N)**: the same, each window's loss backpropagated 2N steps;
- **full BPTT**: the whole record as one sequence from a zero state, backpropagated whole at every step (4,000
  samples a step), for as many samples as the others see (a fifth of their steps) and for as many steps.

The error is that of a free-run simulation: the model run over the whole test record from a zero state, its output
against the system's, as root mean square error (the Silverbox benchmark's measure). Each method runs with three
seeds (the initial weights and the windows' places); the table gives the mean and the spread (min-max), the seconds
of training on one thread, and the graph one backward pass holds (steps x sequences), which sets the memory.

What the figures say, which method wins where and what it costs, and how to choose a burn-in: the burn-in how-to
(docs/howto/burn-in.md). One configuration at a time, with TensorBoard curves: ``python -m
ignite_tbptt.examples.sysid`` (docs/examples/sysid.md).

Sources: Schiller, Heinrich, Lopez, Müller, ICLR 2026 (burn-in, its tuning); Wigren and Schoukens, ECC 2013
(Silverbox); Schoukens, Suykens and Ljung, SYSID 2009 (Wiener-Hammerstein).
"""

from __future__ import annotations

import argparse
import platform
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.report import markdown_table, write_page
from ignite_tbptt.examples._sysid import LENGTHS, SYSTEMS, Simulator, records, simulation_error, train

N, COLUMNS, BURN_INS = 50, 16, (10, 25, 40)
TITLES = {"duffing": "Duffing oscillator", "wiener-hammerstein": "Wiener-Hammerstein"}
SAMPLES = LENGTHS[0] // (N * COLUMNS)  # full BPTT's step sees this many windowed steps' samples

# name: train()'s method and options, whether m is the tuned burn-in, the share of the steps, the graph held as
# (steps, sequences): a burn-in without gradient runs the first m steps of every window without one
METHODS: dict[str, tuple[str, dict[str, Any], bool, float, tuple[int, int]]] = {
    "windows, m = 0": ("windows", {}, False, 1, (N, COLUMNS)),
    "windows, tuned m": ("windows", {}, True, 1, (N, COLUMNS)),
    "windows, tuned m, no gradient": ("windows", {"burn_in_gradient": False}, True, 1, (N, COLUMNS)),
    "carried TBPTT(N, N)": ("carried", {}, False, 1, (N, COLUMNS)),
    "carried TBPTT(N, 2N)": ("carried", {"k2": 2 * N}, False, 1, (2 * N, COLUMNS)),
    "full BPTT, as many samples": ("full", {}, False, 1 / SAMPLES, (LENGTHS[0], 1)),
    "full BPTT, as many steps": ("full", {}, False, 1, (LENGTHS[0], 1)),
}


def fit(data: list, method: str, steps: int, seed: int, record: int = 2, **options: Any) -> tuple[float, float]:
    """A fresh model trained by ``method`` on the estimation record: its error and the seconds it took.

    The error is a free run's over ``data[record]``: the test record (2), or the validation record (1).
    """
    torch.manual_seed(seed)
    model = Simulator()
    seconds = train(model, data[0], method, steps=steps, window=N, batch_size=COLUMNS, seed=seed, **options)
    return simulation_error(model, data[record]), seconds


def tune(data: list, steps: int, seed: int) -> dict[int, float]:
    """The validation error of a windowed model with each burn-in of :data:`BURN_INS`, trained with ``seed``."""
    return {m: fit(data, "windows", steps, seed, record=1, burn_in=m)[0] for m in BURN_INS}


def study(system: str, steps: int, seeds: list[int]) -> list[dict[str, Any]]:
    """Each method's test errors and seconds over ``seeds``, the burn-in tuned on the first seed's validation."""
    data = records(system)
    tuning = tune(data, steps, seeds[0])
    tuned = min(tuning, key=tuning.__getitem__)
    rows = []
    for name, (method, options, burns, share, (held, sequences)) in METHODS.items():
        m, taken = tuned if burns else 0, max(1, round(steps * share))
        held -= m if options.get("burn_in_gradient") is False else 0
        runs = [fit(data, method, taken, seed, burn_in=m, **options) for seed in seeds]
        rows.append(
            {
                "system": TITLES[system],
                "method": name,
                "m": tuned if burns else None,
                "steps": taken,
                "graph": f"{held} x {sequences}",
                "errors": [error for error, _ in runs],
                "seconds": [seconds for _, seconds in runs],
            }
        )
    rows.append({"system": TITLES[system], "tuning": tuning, "output_rms": data[2][1].pow(2).mean().sqrt().item()})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    header = ["system", "method", "test RMSE, mean", "min-max", "steps", "seconds", "graph held"]
    cells = []
    for r in rows:
        if "tuning" in r:
            continue
        method = r["method"] + (f" ({r['m']})" if r["m"] is not None else "")
        errors = r["errors"]
        cells.append(
            [
                r["system"],
                method,
                f"{statistics.mean(errors):.4f}",
                f"{min(errors):.4f}-{max(errors):.4f}",
                str(r["steps"]),
                f"{statistics.mean(r['seconds']):.1f}",
                r["graph"],
            ]
        )
    tuning = "; ".join(
        f"{r['system']}: " + ", ".join(f"m = {m}: {e:.4f}" for m, e in r["tuning"].items())
        for r in rows
        if "tuning" in r
    )
    scale = "; ".join(f"{r['system']}: {r['output_rms']:.4f}" for r in rows if "tuning" in r)
    return markdown_table(header, cells) + (
        f"\n\nThe test records' output RMS (the error of a model that answers 0): {scale}. Validation error of the "
        f"first seed for each burn-in: {tuning}.\n\n{winners(rows)}\n"
    )


def winners(rows: list[dict[str, Any]]) -> str:
    """Per system, the lowest mean test error of all methods and of those whose graph does not grow with the record."""
    lines = []
    for system in dict.fromkeys(r["system"] for r in rows):
        runs = [r for r in rows if r["system"] == system and "errors" in r]
        bounded = [r for r in runs if not r["method"].startswith("full")]
        best, best_bounded = (min(rs, key=lambda r: statistics.mean(r["errors"]))["method"] for rs in (runs, bounded))
        lines.append(f"on the {system}: {best} of all methods, {best_bounded} of those whose graph is bounded")
    return "Lowest mean test error " + "; ".join(lines) + "."


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps of the windowed and carried methods")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    p.add_argument("--markdown", type=Path, help="also write the page to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = [row for system in args.systems for row in study(system, args.steps, args.seeds)]
    text = table(rows)
    print(text)
    if args.markdown:
        setup = f"{platform.machine()}, 1 thread, torch {torch.__version__}"
        intro = __doc__.split("\n\n", 1)[1]
        write_page(
            args.markdown,
            "burn-in, carried state, k2 > k1 and full BPTT on system identification",
            "benchmarks.sysid",
            argv,
            setup,
            intro,
            text,
        )
    return rows


if __name__ == "__main__":
    main()
