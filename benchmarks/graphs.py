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
- ``ours, cuda_graphs``: ``create_tbptt_trainer(..., cuda_graphs=True)``: each window a window program and each
  step a step program, with the host between them (one window per replay).

A second table times windows that reach back, TBPTT(5, 10) and per-token TBPTT(1, 8), in microseconds per window:

- ``hand, exact``: the exact eager hand loop for k2 > k1 (``benchmarks.methods.segmented``: fused calls, retained
  graphs, the weights copied before each step);
- ``hand, exact, captured``: each window captured in one graph, the retained steps run again from the state at the
  cut with the weights they ran with (a ring of inputs and weights shifted inside the graph), the SGD step included:
  the floor for k2 > k1, nothing checked (CUDA only);
- ``ours`` and ``ours, cuda_graphs``, whose windows run eagerly and steps as step programs
  (:mod:`ignite_tbptt.runtime.programs.step`): what ``hand, exact, captured`` would have to beat by more than 1.2x
  to bring window programs of k2 > k1 back (the CUDA-graphs how-to).

A third table gives the programs each ``cuda_graphs`` row kept (window and step programs: one graph each
when captured) and, on CUDA, the memory they hold while the trainer lives (their graphs' pool, static buffers and
gradients). On the CPU (``--device cpu``, the dry run) the programs run uncaptured, which only shows that they run.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.func import functional_call

from benchmarks import methods
from benchmarks.overhead import make_batches
from benchmarks.report import markdown_table, rotated, write_page
from ignite_tbptt import create_tbptt_trainer

K = 5
#: The schedules of windows that reach back.
REACHING = ((5, 10), (1, 8))


@contextmanager
def rnn_weights_kept(rnns: Sequence[torch.nn.RNNBase]) -> Iterator[None]:
    """A block that swaps the weights of torch's RNN modules (``functional_call``) without moving their own.

    Given other weights, an ``nn.RNN``, ``nn.GRU`` or ``nn.LSTM`` flattens them on CUDA into one new buffer
    (``flatten_parameters``), and its own again at its next call: the parameters' storage would move every window,
    which the weight versions, the programs' buffers and a graph's recorded addresses all rely on. Inside the block it
    runs on the weights as given (cuDNN copies them per call); after it, it holds its own, as flattened before.
    """
    # Copies: setting a weight writes into the module's list in place.
    kept = [(list(m._flat_weights), list(m._flat_weight_refs)) for m in rnns]
    for m in rnns:
        # An instance attribute, on purpose: the class's method is untouched.
        m.flatten_parameters = lambda: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m, (weights, refs) in zip(rnns, kept):
            del m.flatten_parameters
            m._flat_weights, m._flat_weight_refs = weights, refs


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


def hand_captured_reaching(model, optimizer, batches, k1, k2, device):
    """The exact hand loop for k2 > k1 (``k2 - k1`` a multiple of ``k1``), each window captured in one CUDA graph.

    A window's backward pass reaches ``m = (k2 - k1) / k1`` earlier windows, which ran with earlier weights: the graph
    runs them again from the state at the cut with their own weights (``functional_call``), then the window, and
    backpropagates to the cut; then the SGD step, and the rings of inputs and weights move on by one window, inside
    the graph. A stream's first ``m + 1`` windows (cut at its start) run the same body eagerly. On a device without
    graphs every window runs the body eagerly: what the tests check against the exact loop.
    """
    assert k2 > k1 and (k2 - k1) % k1 == 0
    m = (k2 - k1) // k1
    params = dict(model.named_parameters())
    x0, y0 = batches[0]
    xs = [x0[:k1].clone() for _ in range(m + 1)]  # the reached windows' inputs, oldest first, then the window's
    static_y = y0[:k1].clone()
    weights = [{n: p.detach().clone().requires_grad_() for n, p in params.items()} for _ in range(m)]
    cut = torch.zeros(1, x0.shape[1], model.rnn.hidden_size, device=device, dtype=model.rnn.weight_hh_l0.dtype)

    def window(reach, from_cut):
        h, after_first = (cut if from_cut else None), None
        for j in range(m - reach, m):
            with rnn_weights_kept([model.rnn]):  # else cuDNN's RNN moves its weights into new buffers each call
                _, h = functional_call(model, weights[j], (xs[j],) if h is None else (xs[j], h))
            after_first = h if after_first is None else after_first
        y_pred, _ = model(xs[m]) if h is None else model(xs[m], h)
        leaves = [*params.values(), *(w for j in range(m - reach, m) for w in weights[j].values())]
        # The reached windows' predictions are not used: their head's weights get no gradient.
        grads = torch.autograd.grad(methods.loss_fn(y_pred, static_y), leaves, allow_unused=True)
        n = len(params)
        for i, p in enumerate(params.values()):
            p.grad = grads[i]
            for j in range(reach):
                if grads[n + j * n + i] is not None:
                    p.grad = p.grad + grads[n + j * n + i]
        with torch.no_grad():
            for j in range(m - 1):  # the rings move on: the window's weights and input become the newest reached
                torch._foreach_copy_(list(weights[j].values()), list(weights[j + 1].values()))
            torch._foreach_copy_(list(weights[m - 1].values()), [p.detach() for p in params.values()])
            for j in range(m):
                xs[j].copy_(xs[j + 1])
            if reach == m and after_first is not None:
                cut.copy_(after_first)
        optimizer.step()

    def stream(x, y, replay):
        assert x.shape[0] % k1 == 0, "windows of k1 steps"
        for i, (xc, yc) in enumerate(zip(x.split(k1), y.split(k1))):
            xs[m].copy_(xc)
            static_y.copy_(yc)
            if i <= m:  # the cut is the stream's start: eagerly
                optimizer.zero_grad(set_to_none=True)
                window(i if i < m else m, from_cut=False)
            else:
                replay()

    if device.type != "cuda":

        def eagerly():
            optimizer.zero_grad(set_to_none=True)
            window(m, from_cut=True)

        for x, y in batches:
            stream(x, y, eagerly)
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as the recipe asks
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            window(m, from_cut=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        window(m, from_cut=True)
    for x, y in batches:  # each batch its own stream
        stream(x, y, graph.replay)
    torch.cuda.synchronize(device)


#: For each cuda_graphs row, what its last run kept: programs of each kind, and on CUDA the memory they hold.
PROGRAMS: dict[str, dict] = {}


def graphed(model, optimizer, batches, k1, k2, device):
    """``create_tbptt_trainer(..., cuda_graphs=True)``; uncaptured programs where the device has no graphs."""
    programs = True if device.type == "cuda" else "uncaptured"
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    trainer = create_tbptt_trainer(model, optimizer, methods.loss_fn, k1, k2, cuda_graphs=programs)
    trainer.run(batches)
    methods._sync(device)
    loop = trainer.tbptt.loop
    PROGRAMS[f"({k1}, {k2})"] = {
        "window": len(loop.executor.cache),
        "step": len(loop.optimizer_step.step_programs.cache),
        # Held while the trainer lives: the graphs' pools, the static buffers and gradients (fused SGD keeps no state).
        "mib": (torch.cuda.memory_allocated(device) - before) / 2**20 if device.type == "cuda" else None,
    }


def contenders(device: torch.device) -> dict:
    named = {"hand": methods.hand}
    if device.type == "cuda":
        named["hand, captured"] = hand_captured
    return {
        **named,
        "ignite": methods.ignite,
        "ours": methods.ours,
        "ours, cuda_graphs": graphed,
    }


def reaching_contenders(device: torch.device) -> dict:
    named = {"hand, exact": methods.segmented}
    if device.type == "cuda":
        named["hand, exact, captured"] = hand_captured_reaching
    return {**named, "ours": methods.ours, "ours, cuda_graphs": graphed}


def train(method, batches, device, k1=K, k2=K):
    torch.manual_seed(0)
    model = methods.CharModel("gru", vocab=16, embedding=8, hidden=8).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    methods._sync(device)
    start = time.perf_counter()
    method(model, optimizer, batches, k1, k2, device)
    return time.perf_counter() - start


def measure(device: torch.device, repeats: int, steps: int, k1: int = K, k2: int = K) -> list[dict]:
    batches = [(x.to(device), y.to(device)) for x, y in make_batches(steps)]
    windows = sum(-(-x.shape[0] // k1) for x, _ in batches)
    named = contenders(device) if k1 == k2 else reaching_contenders(device)
    for method in named.values():  # warm-up: kernels loaded, caches filled
        train(method, batches[:2], device, k1, k2)
    times = {name: [] for name in named}
    for repeat in range(repeats):
        for name in rotated(list(named), repeat):
            times[name].append(train(named[name], batches, device, k1, k2))
        print(f"({k1}, {k2}): repeat {repeat + 1} of {repeats}", file=sys.stderr, flush=True)
    hand = min(next(iter(times.values())))
    return [
        {
            "schedule": f"({k1}, {k2})",
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


def reaching_table(rows: list[dict]) -> str:
    return markdown_table(
        ["TBPTT(k1, k2)", "method", "µs per window", "time / exact hand loop's"],
        [[r["schedule"], r["method"], f"{r['us_per_window']:.0f}", f"{r['x_hand']:.2f}x"] for r in rows],
    )


def programs_table() -> str:
    """The programs each cuda_graphs row kept, and the memory they hold on CUDA."""
    return markdown_table(
        ["row", "window programs", "step programs", "memory held (MiB)"],
        [
            [
                f"ours, cuda_graphs, TBPTT{key}",
                str(p["window"]),
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
    p.add_argument("--reaching-steps", type=int, default=1000, help="steps of the stream for k2 > k1")
    p.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    rows = measure(device, args.repeats, args.steps)
    steps = min(args.steps, args.reaching_steps)
    reaching = [row for k1, k2 in REACHING for row in measure(device, args.repeats, steps, k1, k2)]
    name = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {platform.processor() or 'one thread'}"
    )
    setup = f"{name}, torch {torch.__version__}; GRU of 8 units, batch 4, k1 = k2 = {K}, fused SGD, {args.steps} steps"
    tables = f"{table(rows)}\n\n{reaching_table(reaching)}\n\n{programs_table()}"
    print(f"{setup}\n\n{tables}")
    if args.markdown:
        intro = __doc__.split("\n\n", 1)[1]
        write_page(
            args.markdown,
            "launch-bound windows and CUDA graphs",
            "benchmarks.graphs",
            argv,
            setup,
            intro,
            tables,
        )


if __name__ == "__main__":
    main()
