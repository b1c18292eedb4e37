"""Burn-in, carried state and k2 > k1 on system identification: ``python -m benchmarks.sysid [--markdown FILE]``.

Two simulated systems (``ignite_tbptt.data.systems``): a Duffing oscillator, the Silverbox benchmark's structure
(``y'' + 0.2 y' + y + y^3 = u``, sampled every 0.3 time units, its resonance inside the input's band), and a
Wiener-Hammerstein chain (two second-order resonant filters around a saturation of 0.5), each driven by random-phase
multisines of RMS 1: an estimation record of 4,000 samples, a validation record of 1,000 and a test record of 2,000,
each with its own phases. The model is an LSTM of 16 units and a linear read-out, trained with Adam at 1e-2 for the
same number of optimizer steps by every method, each step on 16 sequences of ``N = 50`` steps (or, for full
backpropagation, 16 columns of 250):

- **windows, m = 0**: windows of N steps at random places of the estimation record, shuffled, each from a zero state
  (``RecordingWindows``, ``carry_hidden=False``), every step's loss counted;
- **windows, tuned m**: the same with a burn-in of m steps (``burn_in=m``, with gradient, Schiller et al.'s), m
  chosen from {10, 25, 40} by the validation error of the first seed;
- **carried TBPTT(N, N)**: the record in 16 contiguous columns walked in order (``recording_columns``,
  ``carry_hidden=True``), the state carried from window to window;
- **carried TBPTT(N, 2N)**: the same, each window's loss backpropagated 2N steps;
- **full BPTT**: each column's 250 steps backpropagated whole, one optimizer step per pass over the record.

The error is that of a free-run simulation: the model run over the whole test record from a zero state, its output
against the system's, as root mean square error (the Silverbox benchmark's measure). Each method runs with three
seeds (the initial weights and the windows' places); the table gives the mean and the spread (min-max), and the
seconds of training on one thread.

Sources: Schiller, Heinrich, Lopez, Müller, ICLR 2026 (burn-in, its tuning); Wigren and Schoukens, ECC 2013
(Silverbox); Schoukens, Suykens and Ljung, SYSID 2009 (Wiener-Hammerstein).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from benchmarks.report import markdown_table, write_page
from ignite_tbptt import create_tbptt_trainer, masked_loss
from ignite_tbptt.data import RecordingWindows, recording_columns
from ignite_tbptt.data.systems import duffing, multisine, wiener_hammerstein

N, COLUMNS, BURN_INS = 50, 16, (10, 25, 40)
SYSTEMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Duffing oscillator": lambda u: duffing(u, 0.3, omega=1.0, zeta=0.1, alpha=1.0),
    "Wiener-Hammerstein": lambda u: wiener_hammerstein(u, saturation=0.5),
}
BANDS = {"Duffing oscillator": (0.0, 0.05), "Wiener-Hammerstein": (0.0, 0.15)}


class Simulator(nn.Module):
    """An LSTM of 16 units over the input ``u`` ``(T, B, 1)``, read out linearly: ``y_pred, state``."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.rnn, self.out = nn.LSTM(1, hidden), nn.Linear(hidden, 1)

    def forward(self, u: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        h, state = self.rnn(u, state)
        return self.out(h), state


def records(system: str, lengths: tuple[int, ...] = (4000, 1000, 2000)) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The estimation, validation and test records ``(u, y)``, each ``(T, 1)`` float32, each its own phases."""
    out = []
    for seed, length in enumerate(lengths):
        u = multisine(length, BANDS[system], rms=1.0, seed=seed)
        out.append((u.float().unsqueeze(1), SYSTEMS[system](u).float().unsqueeze(1)))
    return out


def simulation_error(model: nn.Module, record: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The RMS error of a free run over ``record`` from a zero state."""
    u, y = record
    with torch.no_grad():
        y_pred, _ = model(u.unsqueeze(1))
    return (y_pred.squeeze(1) - y).pow(2).mean().sqrt().item()


def train(method: str, data: list, steps: int, seed: int, burn_in: int = 0) -> tuple[nn.Module, float]:
    """Train a fresh model with ``method`` for ``steps`` optimizer steps; the model and the seconds it took."""
    (u, y), _, _ = data
    torch.manual_seed(seed)
    model = Simulator()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    mse = nn.functional.mse_loss
    if method == "windows":
        windows = RecordingWindows([(u, y)], N, count=steps * COLUMNS, seed=seed)
        generator = torch.Generator().manual_seed(seed)
        batches: Any = DataLoader(
            windows, batch_size=COLUMNS, shuffle=True, generator=generator, collate_fn=RecordingWindows.collate
        )
        trainer = create_tbptt_trainer(model, optimizer, masked_loss(mse), N, burn_in=burn_in)
        epochs = 1
    else:
        columns = recording_columns(u, y, COLUMNS, N)
        k1, k2, epochs = {
            "carried": (N, N, -(-steps // len(columns))),
            "carried k2": (N, 2 * N, -(-steps // len(columns))),
            "full": (u.shape[0] // COLUMNS, None, steps),
        }[method]
        batches = (
            columns if method != "full" else [(torch.cat([x for x, _ in columns]), torch.cat([t for _, t in columns]))]
        )
        trainer = create_tbptt_trainer(model, optimizer, mse, k1, k2, carry_hidden=True)
    start = time.perf_counter()
    trainer.run(batches, max_epochs=epochs, epoch_length=None)
    return model, time.perf_counter() - start


METHODS = {
    "windows, m = 0": ("windows", False),
    "windows, tuned m": ("windows", True),
    "carried TBPTT(N, N)": ("carried", False),
    "carried TBPTT(N, 2N)": ("carried k2", False),
    "full BPTT (each column whole)": ("full", False),
}


def study(system: str, steps: int, seeds: list[int]) -> list[dict[str, Any]]:
    """Each method's test errors and seconds over ``seeds``, the burn-in tuned on the first seed's validation."""
    data = records(system)
    tuning = {m: simulation_error(train("windows", data, steps, seeds[0], m)[0], data[1]) for m in BURN_INS}
    tuned = min(tuning, key=tuning.__getitem__)
    rows = []
    for name, (method, burns) in METHODS.items():
        errors, seconds = [], []
        for seed in seeds:
            model, took = train(method, data, steps, seed, tuned if burns else 0)
            errors.append(simulation_error(model, data[2]))
            seconds.append(took)
        rows.append(
            {"system": system, "method": name, "m": tuned if burns else None, "errors": errors, "seconds": seconds}
        )
    rows.append({"system": system, "tuning": tuning, "output_rms": data[2][1].pow(2).mean().sqrt().item()})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    header = ["system", "method", "test RMSE, mean", "min-max", "seconds"]
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
                f"{statistics.mean(r['seconds']):.1f}",
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
        f"first seed for each burn-in: {tuning}.\n"
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps of every method")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--markdown", type=Path, help="also write the page to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = [row for system in SYSTEMS for row in study(system, args.steps, args.seeds)]
    text = table(rows)
    print(text)
    if args.markdown:
        setup = f"{platform.machine()}, 1 thread, torch {torch.__version__}, {args.steps} optimizer steps per run"
        intro = __doc__.split("\n\n", 1)[1]
        write_page(
            args.markdown,
            "burn-in, carried state and k2 > k1 on system identification",
            "benchmarks.sysid",
            argv,
            setup,
            intro,
            text,
        )
    return rows


if __name__ == "__main__":
    main()
