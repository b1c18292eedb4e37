"""Per-token updates on a device, eager and with CUDA graphs: ``python -m benchmarks.tradeoff.online_device``.

The prequential study (``python -m benchmarks.tradeoff --online``) found per-token TBPTT(1, b) the best learner per
observation on every stream, at 29x to 73x the seconds of TBPTT(b, b) on the CPU, where each window is one step and the
host's work per window dominates. This times both on the study's main stream (the main corpus read once, 12 columns, an
LSTM of 128 units; ``--quick``: 30,000 characters and 32 units) with Adam, eagerly and with ``cuda_graphs`` (fused Adam;
per token, each window eager, since windows of k2 > k1 run eagerly under ``cuda_graphs``, and each optimizer step a step
program), and gives each run's seconds, its windows, its mean prequential bits per character, and its seconds against
TBPTT(b, b)'s in the same mode. On the CPU (the dry run) the programs run uncaptured.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.report import markdown_table
from benchmarks.tradeoff.online import online_run
from benchmarks.tradeoff.online_tasks import ONLINE_TASKS

TASK = "python"


def measure(device: str, quick: bool, lr: float, batches: int | None = None) -> list[dict]:
    """The two truncations, eager and graphed, after a warm-up run of each (kernels, captures, caches)."""
    b = ONLINE_TASKS[TASK].ks[1]
    graphs: bool | str = True if torch.device(device).type == "cuda" else "uncaptured"
    rows = []
    for mode, cuda_graphs in (("eager", False), ("cuda_graphs", graphs)):
        seconds = {}
        for name in (f"TBPTT({b}, {b})", f"TBPTT(1, {b})"):
            run = online_run(TASK, name, lr, 0, None, quick, device, cuda_graphs, batches)
            seconds[name] = run["seconds"]
            rows.append({"mode": mode, **run, "x_fixed": run["seconds"] / seconds[f"TBPTT({b}, {b})"]})
            print(f"{mode}, {name}: {run['seconds']:.1f} s", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    return markdown_table(
        ["truncation", "mode", "seconds", "windows", "bits per character", "seconds / TBPTT(b, b)'s"],
        [
            [
                r["truncation"],
                r["mode"],
                f"{r['seconds']:.1f}",
                str(r["windows"]),
                f"{r['final_bits']:.3f}",
                f"{r['x_fixed']:.1f}x",
            ]
            for r in rows
        ],
    )


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="30,000 characters, 32 units")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    p.add_argument("--batches", type=int, help="read only the stream's first batches (a dry run)")
    args = p.parse_args(argv)
    name = torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else "CPU, one thread"
    rows = measure(args.device, args.quick, args.lr, args.batches)
    text = f"{name}, torch {torch.__version__}; the prequential study's main stream\n\n{table(rows)}"
    print(text)
    return text


if __name__ == "__main__":
    main()
