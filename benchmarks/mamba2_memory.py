"""Memory of Hugging Face's Mamba2 trained with TBPTT(k1, k2) on one document: flat in its length at fixed k2.

``python -m benchmarks.mamba2_memory`` trains a small ``Mamba2ForCausalLM`` (2 layers, hidden 64, 4 heads of 32,
SSM state 16, no weights loaded) through :func:`ignite_tbptt.models.mamba2_model_fn` on one document of each length
in ``--columns`` columns, each run in a fresh process, and prints a table: the peak of the resident set while
training, less the resident set just before, for TBPTT(k1, k2) and, up to ``--full-up-to`` steps, for full BPTT (one
window over the whole document). Memory is sampled after every model call, when a segment's activations have just
joined those retained, as :mod:`benchmarks.memory` samples it; the processes run with ``MALLOC_MMAP_THRESHOLD_=65536``
so that glibc returns freed activations rather than keeping them in its heap. The document's batches are drawn on the
fly, so the data costs the same at every length.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from benchmarks.memory import Stream, current_mib

CPU = torch.device("cpu")


def batch_major(batch: tuple[torch.Tensor, torch.Tensor], device: object, non_blocking: bool) -> tuple:
    """A ``(T, B)`` batch of :class:`~benchmarks.memory.Stream` as the ``(B, T)`` the model reads."""
    return batch[0].t(), batch[1].t()


def measure(steps: int, k1: int, k2: int, columns: int, batch_length: int) -> dict:
    """Train on one document of ``steps`` steps; the peak extra resident set and the seconds it took."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from ignite_tbptt import create_tbptt_trainer
    from ignite_tbptt.models import mamba2_model_fn, mamba2_reset_hidden

    torch.manual_seed(0)
    config = Mamba2Config(
        vocab_size=100,
        hidden_size=64,
        num_heads=4,
        head_dim=32,
        expand=2,
        state_size=16,
        n_groups=1,
        num_hidden_layers=2,
        chunk_size=32,
        conv_kernel=4,
    )
    model = Mamba2ForCausalLM(config)
    peak = [0]

    def sampled(model, x, state):
        out = mamba2_model_fn(model, x, state)
        peak[0] = max(peak[0], current_mib(CPU))
        return out

    trainer = create_tbptt_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        lambda y_pred, y: torch.nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten()),
        k1,
        k2,
        time_dim=1,
        carry_hidden=True,
        model_fn=sampled,
        reset_hidden=mamba2_reset_hidden,
        prepare_batch=batch_major,
    )
    # Warm up on a short stream, so that what the first call allocates once (kernel lookup, the optimizer's state)
    # is in the baseline.
    trainer.run(Stream(64, batch_length, columns))
    before = current_mib(CPU)
    peak[0] = before
    start = time.perf_counter()
    trainer.run(Stream(steps, batch_length, columns))
    return {"extra_mib": peak[0] - before, "seconds": time.perf_counter() - start}


def run_child(steps: int, k1: int, k2: int, columns: int, batch_length: int) -> dict:
    """:func:`measure` in a fresh process, with glibc returning freed blocks."""
    command = [sys.executable, "-m", "benchmarks.mamba2_memory", "--child"]
    command += [str(v) for v in (steps, k1, k2, columns, batch_length)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every length and print the table; returns its rows."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="document lengths (steps)")
    p.add_argument("--k1", type=int, default=32)
    p.add_argument("--k2", type=int, default=64)
    p.add_argument("--columns", type=int, default=4)
    p.add_argument("--batch-length", type=int, default=256, help="steps per batch of the TBPTT runs (default 256)")
    p.add_argument("--full-up-to", type=int, default=4096, help="longest document trained with full BPTT too")
    p.add_argument("--child", type=int, nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return []
    rows = []
    print("| document (steps) | truncation | extra resident set (MiB) | seconds |")
    print("|---:|---|---:|---:|")
    for steps in args.lengths:
        runs = [(f"TBPTT({args.k1}, {args.k2})", args.k1, args.k2, args.batch_length)]
        if steps <= args.full_up_to:
            runs.append(("full BPTT", steps, steps, steps))
        for name, k1, k2, batch_length in runs:
            row = {"steps": steps, "truncation": name, **run_child(steps, k1, k2, args.columns, batch_length)}
            rows.append(row)
            print(f"| {steps:,} | {name} | {row['extra_mib']:.1f} | {row['seconds']:.1f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
