"""Benchmark TBPTT training loops side by side: ``python -m benchmarks.run [--quick] [--markdown FILE]``.

Times, on the same model, data and machine, interleaved and repeated (median and spread reported): a
hand-written fused loop, ignite's ``create_supervised_tbptt_trainer``, the per-step chained recipe, a
rerun-from-stored-state loop, and ``create_tbptt_trainer``, for k1 = k2 and k2 > k1; the compute limit
(forward over the steps plus k2/k1 backward passes, from the hand loop's own timings); peak memory in fresh
processes for short and long streams and for recomputation mode. Prints a markdown table, writes JSON, and
with ``--markdown`` the table with the machine and the command. ``--quick`` is a smoke run on tiny sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks import methods

PAIRS = [(25, 25), (200, 200), (25, 50), (20, 30), (10, 40), (32, 48)]
RECOMPUTE = {(200, 200): 20, (25, 50): 25}  # pairs also timed in recomputation mode, and its segment length


def make_batches(steps: int, length: int, batch: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 100, (steps + 1, batch), generator=g).to(device)
    return [(tokens[i : i + length], tokens[i + 1 : i + 1 + length]) for i in range(0, steps, length)]


def timed(method, cell, batches, k1, k2, device, **kwargs):
    torch.manual_seed(0)
    model = methods.CharModel(cell).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    phases = method(model, optimizer, batches, k1, k2, device, **kwargs)
    return time.perf_counter() - start, phases


def run_time(args, device):
    rows = []
    steps, batch_length, batch = (120, 60, 4) if args.quick else (args.steps, 200, 32)
    batches = make_batches(steps, batch_length, batch, device)
    tokens = steps * batch
    for cell in args.cells:
        for k1, k2 in PAIRS:
            # The hand loop in chunks of k1 is the k1 = k2 reference and gives the compute limit's timings.
            contenders = {"hand": (methods.hand, {}), "ours": (methods.ours, {})}
            if k1 == k2:
                contenders["ignite"] = (methods.ignite, {})
            else:
                contenders.update({"chained": (methods.chained, {}), "recompute": (methods.recompute, {})})
            if (k1, k2) in RECOMPUTE:
                length = RECOMPUTE[(k1, k2)]
                contenders[f"ours, recompute={length}"] = (methods.ours, {"recompute_steps": length})
            times = {name: [] for name in contenders}
            phases = []
            for name, (method, kwargs) in contenders.items():  # warm-up, untimed
                timed(method, cell, batches[:1], k1, k1 if name == "hand" else k2, device, **kwargs)
            for _ in range(args.repeats):  # interleaved: drift in the machine's speed hits all alike
                for name, (method, kwargs) in contenders.items():
                    seconds, split = timed(method, cell, batches, k1, k1 if name == "hand" else k2, device, **kwargs)
                    times[name].append(seconds)
                    if name == "hand":
                        phases.append(split)
            forward = statistics.median(f for f, _ in phases)
            backward = statistics.median(b for _, b in phases)
            rows.append(_row(cell, k1, k2, "compute limit", [forward + backward * k2 / k1], tokens))
            for name, values in times.items():
                if name != "hand" or k1 == k2:
                    rows.append(_row(cell, k1, k2, name, values, tokens))
            print(f"timed {cell} k1={k1} k2={k2}", file=sys.stderr, flush=True)
    return rows


def _row(cell, k1, k2, name, values, tokens):
    median = statistics.median(values)
    return {
        "model": cell,
        "k1": k1,
        "k2": k2,
        "method": name,
        "seconds": median,
        "spread": [min(values), max(values)],
        "tokens_per_second": tokens / median,
    }


def run_memory(args):
    rows = []
    configs = [(2_000, 25, 50, None), (50_000, 25, 50, None), (200, 200, 200, None), (200, 200, 200, 20)]
    configs += [(400, 25, 50, None), (400, 25, 50, 25)]
    if args.quick:
        configs = [(60, 10, 20, None), (240, 10, 20, None), (40, 20, 20, 5)]
    for steps, k1, k2, recompute in configs:
        command = [sys.executable, "-m", "benchmarks.memory", "--steps", str(steps), "--k1", str(k1), "--k2", str(k2)]
        if recompute:
            command += ["--recompute", str(recompute)]
        if args.quick:
            command += ["--batch", "4", "--hidden", "32", "--batch-length", "20"]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # see benchmarks/memory.py
        out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
        rows.append({"steps": steps, "k1": k1, "k2": k2, "recompute": recompute, **json.loads(out.splitlines()[-1])})
        print(f"memory {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def table(time_rows, memory_rows):
    lines = ["| model | k1 | k2 | method | tokens/s (median) | time s (median, min-max) | vs reference |"]
    lines.append("|---|---|---|---|---|---|---|")
    for row in time_rows:
        same = [r for r in time_rows if (r["model"], r["k1"], r["k2"]) == (row["model"], row["k1"], row["k2"])]
        reference = next(
            (r for r in same if r["method"] == ("hand" if row["k1"] == row["k2"] else "compute limit")), None
        )
        ratio = f"{row['seconds'] / reference['seconds']:.2f}x {reference['method']}" if reference else ""
        lo, hi = row["spread"]
        lines.append(
            f"| {row['model']} | {row['k1']} | {row['k2']} | {row['method']} | {row['tokens_per_second']:,.0f} "
            f"| {row['seconds']:.2f} ({lo:.2f}-{hi:.2f}) | {ratio} |"
        )
    lines += [
        "",
        "| stream steps | k1 | k2 | recompute | peak memory MiB | above baseline MiB | saved activations MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in memory_rows:
        # Saved activations are counted through saved-tensor hooks, which the trainer's own hooks for k2 > k1
        # histories take precedence over: only complete for k2 <= k1 and recomputation mode.
        exact = row["k2"] <= row["k1"] or row["recompute"]
        saved = f"{row['saved_activations_mib']:.1f}" if exact else "-"
        lines.append(
            f"| {row['steps']:,} | {row['k1']} | {row['k2']} | {row['recompute'] or '-'} | {row['peak_mib']:.1f} "
            f"| {row['training_mib']:.1f} | {saved} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run on tiny sizes (no timing claims)")
    p.add_argument("--steps", type=int, default=1000, help="steps per timed run (batches of 200, 32 streams)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cells", nargs="+", default=["lstm", "gru"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results.json"))
    p.add_argument("--markdown", type=Path, help="also write the table, machine and command to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.cells = 1, ["lstm"]
    device = torch.device(args.device)
    time_rows, memory_rows = run_time(args, device), run_memory(args)
    machine = (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    if device.type == "cuda":
        machine += f", {torch.cuda.get_device_name(device)}"
    result = {"machine": machine, "command": " ".join(["python -m benchmarks.run", *(argv or sys.argv[1:])])}
    result.update(time=time_rows, memory=memory_rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    text = table(time_rows, memory_rows)
    print(text)
    if args.markdown:
        args.markdown.write_text(
            f"# Benchmarks\n\nMachine: {machine} ({args.device}).\n\nCommand: `{result['command']}`\n\n{text}\n"
        )
    return result


if __name__ == "__main__":
    main()
