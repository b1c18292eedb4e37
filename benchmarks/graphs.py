"""Launch-bound windows with and without CUDA graphs: ``python -m benchmarks.graphs [--device cuda]``.

``benchmarks.overhead``'s model (a GRU of 8 units, batch 4, vocabulary 16, fused SGD, k1 = k2 = 5, batches of 200
steps, each its own stream), where a GPU window is a few dozen kernel launches of almost no work. Rows, in
microseconds per window (the fastest of ``--repeats`` interleaved runs):

- ``hand``: the hand-written eager loop (``benchmarks.methods.hand``);
- ``hand, captured``: the same loop with the whole window (forward, loss, backward, SGD step, hidden-state carry)
  captured once in a ``torch.cuda.CUDAGraph`` and replayed, its input copied into static buffers: the floor a
  graph gives, with nothing checked and no events (CUDA only);
- ``ignite``: ignite's ``create_supervised_tbptt_trainer``;
- ``ours``: ``create_tbptt_trainer``;
- ``ours, cuda_graphs``: ``create_tbptt_trainer(..., cuda_graphs=True)``: with no handler on the windows' events,
  each batch's windows after its first, and their optimizer steps, run as one program (several windows per replay);
- ``ours, cuda_graphs, a window per replay``: the same with a handler on ``TBPTTEvents.WINDOW_COMPLETED`` (which
  does nothing), so that each window is a window program and each step a step program, with the host between them.

A second table gives the programs each ``cuda_graphs`` row kept (window, batch and step programs: one graph each
when captured) and, on CUDA, the memory they hold while the trainer lives (their graphs' pool, static buffers and
gradients). On the CPU (``--device cpu``, the dry run) the programs run uncaptured, which only shows that they run.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

from benchmarks import methods
from benchmarks.overhead import make_batches
from benchmarks.report import markdown_table, rotated, write_page
from ignite_tbptt import TBPTTEvents, create_tbptt_trainer

K = 5


def hand_captured(model, optimizer, batches, k1, k2, device):
    """The hand loop with each window captured in one CUDA graph (PyTorch's whole-network capture recipe)."""
    assert k1 == k2 and device.type == "cuda"
    x0, y0 = batches[0]
    static_x, static_y = x0[:k1].clone(), y0[:k1].clone()
    static_h = torch.zeros(1, x0.shape[1], model.rnn.hidden_size, device=device)

    def window():
        y_pred, hidden = model(static_x, static_h)
        methods.loss_fn(y_pred, static_y).backward()
        optimizer.step()
        static_h.copy_(hidden.detach())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as the recipe asks
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            window()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        window()
    for x, y in batches:
        static_h.zero_()  # each batch its own stream
        for xc, yc in zip(x.split(k1), y.split(k1)):
            static_x.copy_(xc)
            static_y.copy_(yc)
            graph.replay()
    torch.cuda.synchronize(device)


#: For each cuda_graphs row, what its last run kept: programs of each kind, and on CUDA the memory they hold.
PROGRAMS: dict[str, dict] = {}


def graphed(model, optimizer, batches, k1, k2, device, window_by_window=False):
    """``create_tbptt_trainer(..., cuda_graphs=True)``; uncaptured programs where the device has no graphs."""
    programs = True if device.type == "cuda" else "uncaptured"
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    trainer = create_tbptt_trainer(model, optimizer, methods.loss_fn, k1, k2, cuda_graphs=programs)
    if window_by_window:  # a handler on a window's event needs the host after each window
        trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda engine: None)
    trainer.run(batches)
    methods._sync(device)
    loop = trainer.tbptt.loop
    PROGRAMS["window_by_window" if window_by_window else "batches"] = {
        "window": len(loop.executor.programs),
        "batch": len(loop.executor.batch_programs),
        "step": len(loop.optimizer_step.programs.programs),
        # Held while the trainer lives: the graphs' pools, the static buffers and gradients (fused SGD keeps no state).
        "mib": (torch.cuda.memory_allocated(device) - before) / 2**20 if device.type == "cuda" else None,
    }


def graphed_window_by_window(model, optimizer, batches, k1, k2, device):
    """``graphed`` with a window program and a step program per window."""
    graphed(model, optimizer, batches, k1, k2, device, window_by_window=True)


def contenders(device: torch.device) -> dict:
    named = {"hand": methods.hand}
    if device.type == "cuda":
        named["hand, captured"] = hand_captured
    return {
        **named,
        "ignite": methods.ignite,
        "ours": methods.ours,
        "ours, cuda_graphs": graphed,
        "ours, cuda_graphs, a window per replay": graphed_window_by_window,
    }


def train(method, batches, device):
    torch.manual_seed(0)
    model = methods.CharModel("gru", vocab=16, embedding=8, hidden=8).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    methods._sync(device)
    start = time.perf_counter()
    method(model, optimizer, batches, K, K, device)
    return time.perf_counter() - start


def measure(device: torch.device, repeats: int, steps: int) -> list[dict]:
    batches = [(x.to(device), y.to(device)) for x, y in make_batches(steps)]
    windows = sum(-(-x.shape[0] // K) for x, _ in batches)
    named = contenders(device)
    for method in named.values():  # warm-up: kernels loaded, caches filled
        train(method, batches[:2], device)
    times = {name: [] for name in named}
    for repeat in range(repeats):
        for name in rotated(list(named), repeat):
            times[name].append(train(named[name], batches, device))
        print(f"repeat {repeat + 1} of {repeats}", file=sys.stderr, flush=True)
    hand = min(times["hand"])
    return [
        {
            "method": name,
            "us_per_window": min(values) / windows * 1e6,
            "x_hand": min(values) / hand,
        }
        for name, values in times.items()
    ]


def table(rows: list[dict]) -> str:
    return markdown_table(
        ["method", "µs per window", "time / hand loop's"],
        [[r["method"], f"{r['us_per_window']:.0f}", f"{r['x_hand']:.2f}x"] for r in rows],
    )


def programs_table() -> str:
    """The programs each cuda_graphs row kept, and the memory they hold on CUDA."""
    names = {"batches": "ours, cuda_graphs", "window_by_window": "ours, cuda_graphs, a window per replay"}
    return markdown_table(
        ["row", "window programs", "batch programs", "step programs", "memory held (MiB)"],
        [
            [
                names[key],
                str(p["window"]),
                str(p["batch"]),
                str(p["step"]),
                "-" if p["mib"] is None else f"{p['mib']:.1f}",
            ]
            for key, p in PROGRAMS.items()
        ],
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=4000, help="steps of the stream (batches of 200)")
    p.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    rows = measure(device, args.repeats, args.steps)
    name = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {platform.processor() or 'one thread'}"
    )
    setup = f"{name}, torch {torch.__version__}; GRU of 8 units, batch 4, k1 = k2 = {K}, fused SGD, {args.steps} steps"
    print(f"{setup}\n\n{table(rows)}\n\n{programs_table()}")
    if args.markdown:
        intro = __doc__.split("\n\n", 1)[1]
        write_page(
            args.markdown,
            "launch-bound windows and CUDA graphs",
            "benchmarks.graphs",
            argv,
            setup,
            intro,
            f"{table(rows)}\n\n{programs_table()}",
        )


if __name__ == "__main__":
    main()
