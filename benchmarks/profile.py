"""Where a window's time goes: ``python -m benchmarks.profile [--cell lstm] [--k1 25 --k2 50] [--device cuda]``.

Trains ``create_tbptt_trainer`` on the benchmark's model under ``torch.profiler`` and prints two tables: the
trainer's own ranges (``tbptt.forward``: a segment's model call; ``tbptt.segment_backward``: its loss paid at
once; ``tbptt.sweep``: a window's backward sweep through the retained segments; ``tbptt.optimizer_step``:
normalisation, finiteness check and the step), then the operators that take the most time. On CUDA both have
a device column, and the gap between host and device time shows where the queue waits for the host. The
ranges cost nothing while no profiler runs.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import methods
from benchmarks.report import markdown_table
from benchmarks.run import make_batches
from ignite_tbptt import create_tbptt_trainer


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cell", default="lstm", choices=["lstm", "gru"])
    p.add_argument("--k1", type=int, default=25)
    p.add_argument("--k2", type=int, default=25)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--vocab", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--recompute", type=int, default=None)
    p.add_argument("--fused", action="store_true", help="Adam(fused=True): on a GPU, no host read per optimizer step")
    p.add_argument("--autocast", choices=["bfloat16", "float16"], help="the trainer's autocast_dtype")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", type=int, default=15, help="operators to list")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = methods.CharModel(args.cell, vocab=args.vocab, hidden=args.hidden, layers=args.layers).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=args.fused or None)
    dtype = getattr(torch, args.autocast) if args.autocast else None
    trainer = create_tbptt_trainer(
        model,
        optimizer,
        methods.loss_fn,
        args.k1,
        args.k2,
        recompute=args.recompute,
        carry_hidden=True,
        autocast_dtype=dtype,
    )
    batches = make_batches(args.steps, 200, args.batch, device, vocab=args.vocab)
    trainer.run(batches[:1])  # warm-up: first calls, allocator, kernels chosen
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        trainer.run(batches)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    ours = sorted((event for event in averages if event.key.startswith("tbptt.")), key=lambda e: -e.cpu_time_total)
    print(f"{args.cell} {args.k1}/{args.k2} on {device}, {trainer.state.window} windows")
    # The trainer's ranges in a table of their own: torch's own table of a filtered list has no device totals to
    # share its columns among, and stops on CUDA ("Expected time_us == 0").
    rows = [
        [e.key, str(e.count), f"{e.cpu_time_total / 1e3:.1f}", f"{getattr(e, 'device_time_total', 0.0) / 1e3:.1f}"]
        for e in ours
    ]
    print(markdown_table(["range", "calls", "CPU ms (total)", "device ms (total)"], rows))
    print(averages.table(sort_by=sort, row_limit=args.rows))


if __name__ == "__main__":
    main()
