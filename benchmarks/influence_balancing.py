"""Where truncation fails: ``python -m benchmarks.influence_balancing [--steps N] [--figure PNG]``.

A synthetic system after Tallec & Ollivier's influence-balancing task (arXiv:1705.08209, section 5.1): a scalar
parameter ``theta`` enters each of ``n`` linear units, positively in the first ``p`` and negatively in the rest,
and the units pass their state down a chain to unit 0, whose value should be 1:

    s_{t+1} = A s_t + theta * b,   A = (I + shift) / 2,   b = (+1 x p, -1 x (n - p)),   loss_t = (s_t[0] - 1)^2.

A change of ``theta`` raises unit 0 within a few steps (through the positive units next to it) and lowers it
later (through the negative ones further up the chain); with ``p < n / 2`` the long-term effect wins, and the
optimum is ``theta* = 1 / (2 (2p - n))`` < 0. A backward pass shorter than the chain sees only the short-term,
positive effect: its gradient has the wrong sign, and fixed-window TBPTT drives ``theta`` away, unbounded.
ARTBP's windows are as short on average, but its compensation factors make the expected gradient the full one,
and it converges to ``theta*``. Every run trains on one stream (SGD, the same learning rate), with
``create_tbptt_trainer(..., carry_hidden=True)``; the table gives the final ``theta`` and the mean loss over the
last tenth of the stream.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks.report import markdown_table
from ignite_tbptt import ARTBP, TBPTTEvents, create_tbptt_trainer

N, P = 6, 2  # units, of which the first P are driven up by theta
OPTIMUM = 1 / (2 * (2 * P - N))


class InfluenceBalance(nn.Module):
    """``n`` linear units along a chain, one shared parameter ``theta``; outputs unit 0: ``(T, B, 1)``."""

    def __init__(self, n: int = N, p: int = P) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros((), dtype=torch.float64))
        chain = 0.5 * torch.eye(n, dtype=torch.float64) + 0.5 * torch.diag(torch.ones(n - 1, dtype=torch.float64), 1)
        self.register_buffer("A", chain)
        self.register_buffer("b", torch.cat([torch.ones(p), -torch.ones(n - p)]).double())

    def forward(self, x: torch.Tensor, hidden: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.zeros(x.shape[1], self.A.shape[0], dtype=torch.float64) if hidden is None else hidden
        outputs = []
        for _ in range(x.shape[0]):
            s = s @ self.A.T + self.theta * self.b
            outputs.append(s[:, :1])
        return torch.stack(outputs), s


def methods() -> dict:
    """The window sources compared: fixed windows at several k, and ARTBP at two mean lengths (seeded)."""
    return {
        "TBPTT k1 = k2 = 3": 3,
        "TBPTT k1 = k2 = 10": 10,
        "TBPTT k1 = k2 = 40": 40,
        "ARTBP, mean length 4": ARTBP(grid=1, mean_length=4, seed=0),
        "ARTBP, mean length 8": ARTBP(grid=1, mean_length=8, seed=0),
    }


def train(source, steps: int, lr: float = 1e-3) -> dict:
    """Train on one stream of ``steps`` steps; ``theta`` and the loss after each window, by stream step."""
    model = InfluenceBalance()
    x = torch.zeros(steps, 1, 1, dtype=torch.float64)
    batches = [(x[i : i + 100], torch.ones_like(x[i : i + 100])) for i in range(0, steps, 100)]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trainer = create_tbptt_trainer(model, optimizer, nn.functional.mse_loss, source, carry_hidden=True)
    curve: dict[str, list] = {"step": [], "theta": [], "loss": []}

    @trainer.on(TBPTTEvents.WINDOW_COMPLETED)
    def record(engine):
        curve["step"].append(engine.state.window_bounds[1])
        curve["theta"].append(model.theta.item())
        curve["loss"].append(engine.state.window_loss.item())
        if not math.isfinite(curve["theta"][-1]) or abs(curve["theta"][-1]) > 1e6:
            engine.terminate()  # diverged: the rest of the curve says nothing more

    start = time.perf_counter()
    trainer.run(batches)
    curve["seconds"] = time.perf_counter() - start
    tail = [loss for step, loss in zip(curve["step"], curve["loss"]) if step > 0.9 * steps]
    curve["final_theta"] = curve["theta"][-1]
    curve["final_loss"] = sum(tail) / len(tail) if tail else math.inf
    curve["diverged"] = curve["step"][-1] < steps
    return curve


def figure(curves: dict, path: Path) -> None:
    """``theta`` and the window loss against stream steps, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in curves.items():
        style = "-" if name.startswith("ARTBP") else "--"
        left.plot(curve["step"], curve["theta"], style, label=name)
        right.plot(curve["step"], curve["loss"], style, label=name)
    left.axhline(OPTIMUM, color="black", linewidth=0.8, linestyle=":", label=f"theta* = {OPTIMUM:g}")
    left.set_yscale("symlog", linthresh=0.1)
    left.set_ylabel("theta")
    right.set_yscale("log")
    right.set_ylabel("window loss (s[0] - 1)^2")
    for axis in (left, right):
        axis.set_xlabel("stream steps")
    left.legend(fontsize=8)
    left.set_title("fixed windows diverge; ARTBP converges to theta*")
    right.set_title("loss")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20_000, help="stream steps per run (default 20,000)")
    p.add_argument("--figure", type=Path, help="write the curves to this PNG file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    curves = {}
    for name, source in methods().items():
        curves[name] = train(source, args.steps)
        print(f"ran {name}", file=sys.stderr, flush=True)
    rows = [
        [
            name,
            "diverged" if c["diverged"] else f"{c['final_theta']:.4f}",
            "-" if c["diverged"] else f"{c['final_loss']:.2e}",
            f"{c['seconds']:.1f}",
        ]
        for name, c in curves.items()
    ]
    print(f"n = {N} units, p = {P}, theta* = {OPTIMUM:g}, {args.steps:,} steps, SGD lr 1e-3")
    print(markdown_table(["method", "final theta", "loss, last tenth", "seconds"], rows))
    if args.figure:
        figure(curves, args.figure)
    return curves


if __name__ == "__main__":
    main()
