"""The trainer's own cost per window: ``python -m benchmarks.overhead [--repeats N] [--markdown FILE]``.

A GRU of 8 units (batch 4, vocabulary 16) on one CPU thread, so that the model's compute is tiny and what is
left is the framework's. Every method trains the same model on the same 4,000 steps (batches of 200 steps,
each its own stream) with fused SGD (``fused=True``, which on a GPU skips a step on the device). The table gives the
microseconds per window that each adds over the hand loop on the same windows, and the host reads per window:
calls of ``Tensor.item``, ``tolist``, ``__bool__``, ``__float__`` and ``__int__``, each a synchronisation on CUDA.
Runs are interleaved and each method's time is its fastest run: what is measured is a few microseconds per
window, and on a shared machine noise only adds time (as ``timeit`` advises, the minimum is the estimate).

With ``--instructions`` (Linux, ``valgrind`` on the path) each method also runs alone under valgrind's cachegrind,
once on 200 steps and once on 1,000, and a last table gives the difference per window over the hand loop's:
instructions executed, and misses of the simulated first-level instruction and data caches. Those counts do not
depend on what else the machine runs, and the fixed cost of a run (building the trainer, the first call's checks)
drops out of the difference; Python's cyclic garbage collector is off in those runs, whose full collections
would come at different points in the two. What the counts leave out is how the processor overlaps the work.

- k1 = k2 = 5: the hand-written fused loop (``benchmarks.methods.hand``) against ignite's
  ``create_supervised_tbptt_trainer`` and ``create_tbptt_trainer``.
- k1 = 1, k2 = 8 (per-token backward): the exact hand loop (``benchmarks.methods.segmented``, one call per
  step here) against ``create_tbptt_trainer``; ignite's trainer cannot do k2 > k1.

A second table times each check, and the clearing of the gradients before a step's first window, alone
(``timeit``, on this model's gradients and state): at a few µs each they are below the noise of whole runs,
which the ablation rows differ by.

``ours, unfused SGD`` is ``create_tbptt_trainer`` with the plain SGD, whose finiteness check reads once per step on
an accelerator too. ``ours, decisions on the device (an accelerator's path)`` runs the check as on a GPU, where a
read would wait for the queue: each step's decision is kept on the device (a copy of the last one, checked into)
and handed to the fused optimizer as ``found_inf``, which skips the step there; the decisions are read once per
iteration. Neither the hand loops nor ignite's trainer check anything; ``create_tbptt_trainer`` checks, and the
two ablations show what each check costs (neither is an option of the trainer), beside what calling torch's
``zero_grad()`` would cost:

- ``ours, no inf/NaN check (ablation)``: the gradients' check at every optimizer step (a kernel and the read of
  its decision, which on the CPU waits for nothing) replaced by a constant "all finite"; a step with inf/NaN
  gradients would then be applied.
- ``ours, calling torch's zero_grad()``: the gradients cleared by the optimizer's ``zero_grad()`` rather than set to
  ``None`` directly, which is all torch's does; its profiler range and guard against dynamo cost the difference.
- ``ours, no state checks (ablation)``: the checks around every model call (the version counters of the state it
  was given, read before and after, so that a write into it is named; the structure and shapes of the state it
  returns) left out; a model writing into its state would then train on wrong gradients.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import platform
import re
import shutil
import subprocess
import sys
import time
import timeit
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

from benchmarks import methods
from benchmarks.report import markdown_table, rotated, write_page
from ignite_tbptt.engine import optimizer_step
from ignite_tbptt.runtime import model_call
from ignite_tbptt.runtime.compiled import retainable

READS = ("item", "tolist", "__bool__", "__float__", "__int__")
CASES = [(5, 5), (1, 8)]


@contextmanager
def counting_reads():
    """Count the calls of the ``Tensor`` methods that read a value back to the host."""
    counts = {"reads": 0}
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(original):
        def read(self, *args, **kwargs):
            counts["reads"] += 1
            return original(self, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def make_batches(steps=4000, length=200, batch=4, vocab=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (steps + 1, batch), generator=g)
    return [(tokens[i : i + length], tokens[i + 1 : i + 1 + length]) for i in range(0, steps, length)]


def train(method, batches, k1, k2, fused=True):
    torch.manual_seed(0)
    model = methods.CharModel("gru", vocab=16, embedding=8, hidden=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=fused)
    start = time.perf_counter()
    method(model, optimizer, batches, k1, k2, torch.device("cpu"))
    return time.perf_counter() - start


def contenders(k1, k2):
    ours = {
        "ours": methods.ours,
        "ours, unfused SGD": functools.partial(unfused, methods.ours),
        "ours, decisions on the device (an accelerator's path)": decided_on_device,
        "ours, no inf/NaN check (ablation)": unchecked,
        "ours, no state checks (ablation)": unchecked_state,
        "ours, calling torch's zero_grad()": zero_grad_called,
    }
    if k1 == k2:
        return {"hand": methods.hand, "ignite": methods.ignite, **ours}
    return {"hand, exact segments": methods.segmented, **ours}


def unfused(method, model, optimizer, *args):
    return method(model, torch.optim.SGD(model.parameters(), lr=0.1), *args)


def unchecked(*args):
    """``methods.ours`` with the finiteness check of every optimizer step replaced by "all finite"."""
    all_finite = torch.zeros(())  # the decision the check returns: 0.0, nothing to skip

    def divide(grads, divisor, earlier=None, into=None):
        if divisor != 1:  # the division by the target count, which the check's kernel makes along (k1 = 1, k2 = 8)
            torch._foreach_div_(grads, divisor)
        return all_finite

    with mock.patch.object(optimizer_step, "divide_and_check", divide):
        return methods.ours(*args)


def decided_on_device(*args):
    """``methods.ours`` with each step's decision kept on the device even on the CPU, as on an accelerator."""
    with mock.patch.object(optimizer_step.OptimizerStep, "reads_cpu_decisions", False):
        return methods.ours(*args)


def zero_grad_called(*args):
    """``methods.ours`` calling the optimizer's ``zero_grad()`` before each step's first window, as before 0.4."""
    with mock.patch.object(optimizer_step, "_torchs_zero_grad", lambda optimizer: False):
        return methods.ours(*args)


def unchecked_state(*args):
    """``methods.ours`` with the per-call checks of the hidden state off: no write into it, no change of structure.

    What is left is the model call itself (``model(x, hidden)``), to show what the checks cost; the once-per-stream
    checks (a graph kept in an attribute, a state that does not come in through the argument) stay.
    """

    def call(self, x, hidden, versions=None, keep_weights=False, starts=None):
        if versions is None and not self.autocasts:
            return self._run(x, hidden, starts)
        # The weight versions' hooks and autocast stay: they are not checks, and k2 > k1 needs them to be exact.
        hooks = versions.hooks() if keep_weights else contextlib.nullcontext()
        with self.autocast(), hooks, retainable(versions is not None):
            return self._run(x, hidden, starts)

    with mock.patch.object(model_call.ModelCall, "__call__", call):
        return methods.ours(*args)


def measure(repeats: int, steps: int) -> list[dict]:
    batches = make_batches(steps)
    rows = []
    for k1, k2 in CASES:
        named = contenders(k1, k2)
        windows = sum(-(-x.shape[0] // k1) for x, _ in batches)
        for method in named.values():  # warm-up
            train(method, batches[:1], k1, k2)
        times = {name: [] for name in named}
        for repeat in range(repeats):
            for name in rotated(list(named), repeat):
                times[name].append(train(named[name], batches, k1, k2))
        reads = {}
        for name, method in named.items():
            with counting_reads() as counts:
                train(method, batches, k1, k2)
            reads[name] = counts["reads"] / windows
        reference = min(times[next(iter(named))])
        for name, values in times.items():
            fastest = min(values)
            rows.append(
                {
                    "k1": k1,
                    "k2": k2,
                    "method": name,
                    "us_per_window": fastest / windows * 1e6,
                    "over_reference_us": (fastest - reference) / windows * 1e6,
                    "reads_per_window": reads[name],
                }
            )
        print(f"timed k1={k1} k2={k2}", file=sys.stderr, flush=True)
    return rows


def parts(number: int = 20_000, repeats: int = 7) -> list[tuple[str, float]]:
    """What each check and the clearing of the gradients cost alone, in µs per window (``timeit``'s fastest repeat).

    On this model's gradients and hidden state: the parts whose cost the ablation rows show are a few µs each,
    below the noise of whole runs, so each is also timed alone, as the trainer runs it once a window: the optimizer
    step's own code (:class:`~ignite_tbptt.engine.optimizer_step.OptimizerStep`) for the inf/NaN check and the
    clearing, the model call's checks as ``ModelCall`` makes them.
    """
    from operator import attrgetter

    from ignite_tbptt.runtime import hidden as hs

    torch.manual_seed(0)
    model = methods.CharModel("gru", vocab=16, embedding=8, hidden=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    step = optimizer_step.OptimizerStep(optimizer, None, 1)
    with mock.patch.object(optimizer_step, "_torchs_zero_grad", lambda optimizer: False):
        calling = optimizer_step.OptimizerStep(optimizer, None, 1)  # clears through torch's zero_grad()
    params = step.parameters()
    grads = [torch.zeros_like(p) for p in params]
    hidden, returned = torch.zeros(1, 4, 8), torch.zeros(1, 4, 8)
    version = attrgetter("_version")

    def give_grads():
        for p, g in zip(params, grads):
            p.grad = g

    def inf_nan_check():  # a step of one window's mean: the gradients listed, one kernel, one read
        give_grads()
        step.accumulate(20, backward_mean=True)
        return step.prepare((-1, 1, 1, 1, 1))

    def state_checks():
        tensors = hs.tensors(hidden)
        before = list(map(version, tensors))
        return list(map(version, tensors)) != before or not hs.interchangeable(returned, hidden)

    def zero_grad_called():
        give_grads()
        calling.window_started()

    def set_to_none():
        give_grads()
        step.window_started()

    def timed(function):
        return min(timeit.repeat(function, number=number, repeat=repeats)) / number * 1e6

    baseline = timed(give_grads)  # handing the gradients back, which the trainer does not do, is taken off
    return [
        ("the inf/NaN check: the gradients listed, one kernel, one read", timed(inf_nan_check) - baseline),
        ("the state checks: version counters before and after, structure and shapes", timed(state_checks)),
        ("torch's zero_grad()", timed(zero_grad_called) - baseline),
        ("the same, each gradient set to None directly (this trainer)", timed(set_to_none) - baseline),
    ]


def parts_table(rows: list[tuple[str, float]]) -> str:
    return markdown_table(["part, once a window", "µs"], [[name, f"{us:.1f}"] for name, us in rows])


def table(rows: list[dict]) -> str:
    header = ["k1", "k2", "method", "µs per window", "µs per window over the hand loop", "host reads per window"]
    cells = [
        [
            str(r["k1"]),
            str(r["k2"]),
            r["method"],
            f"{r['us_per_window']:.0f}",
            f"{r['over_reference_us']:+.0f}",
            f"{r['reads_per_window']:.2f}",
        ]
        for r in rows
    ]
    return markdown_table(header, cells)


SIMULATED_STEPS = (200, 1000)
COUNTERS = {
    "instructions": r"I\s+refs:\s+([\d,]+)",
    "I1 misses": r"I1\s+misses:\s+([\d,]+)",
    "D1 misses": r"D1\s+misses:\s+([\d,]+)",
}


def simulate(k1: int, k2: int, name: str, steps: int) -> dict[str, int]:
    """Cachegrind's counts for one run of ``name`` on ``steps`` steps, in a process of its own."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--cachegrind-out-file=/dev/null"]
    command += [sys.executable, "-m", "benchmarks.overhead", "--child", str(k1), str(k2), name, str(steps)]
    report = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    return {counter: int(re.search(pattern, report).group(1).replace(",", "")) for counter, pattern in COUNTERS.items()}


def simulated(workers: int = 2) -> list[dict]:
    """Per window over the hand loop: instructions and first-level cache misses (cachegrind, 1,000 - 200 steps)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind on the path (e.g. apt-get install valgrind).")
    jobs = [(k1, k2, name, steps) for k1, k2 in CASES for name in contenders(k1, k2) for steps in SIMULATED_STEPS]
    with ThreadPoolExecutor(workers) as pool:
        counts = dict(zip(jobs, pool.map(lambda job: simulate(*job), jobs)))
    rows = []
    for k1, k2 in CASES:
        small, large = (make_batches(steps) for steps in SIMULATED_STEPS)
        windows = sum(-(-x.shape[0] // k1) for x, _ in large) - sum(-(-x.shape[0] // k1) for x, _ in small)
        names = list(contenders(k1, k2))
        per_window = {
            name: {
                c: (counts[k1, k2, name, SIMULATED_STEPS[1]][c] - counts[k1, k2, name, SIMULATED_STEPS[0]][c]) / windows
                for c in COUNTERS
            }
            for name in names
        }
        for name in names:
            rows.append(
                {
                    "k1": k1,
                    "k2": k2,
                    "method": name,
                    **{c: per_window[name][c] - per_window[names[0]][c] for c in COUNTERS},
                }
            )
    return rows


def simulated_table(rows: list[dict]) -> str:
    header = ["k1", "k2", "method", "instructions per window over the hand loop", "I1 misses", "D1 misses"]
    cells = [[str(r["k1"]), str(r["k2"]), r["method"], *(f"{r[c]:+,.0f}" for c in COUNTERS)] for r in rows]
    return markdown_table(header, cells)


def child(k1: int, k2: int, name: str, steps: int) -> None:
    """One run of ``name``, to be counted by cachegrind from outside, without Python's cyclic collector.

    A full collection walks every object the process holds (some 300,000 after importing torch) whenever the
    allocation counts say so: a few such in one run and not in another would count as tens of thousands of
    instructions per window.
    """
    torch.set_num_threads(1)
    batches = make_batches(steps)
    gc.collect()
    gc.disable()
    train(contenders(k1, k2)[name], batches, k1, k2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--markdown", type=Path, help="also write the table to this file")
    p.add_argument("--calls", type=int, default=20_000, help="calls per repeat when each part is timed alone")
    p.add_argument("--instructions", action="store_true", help="also count instructions and cache misses (valgrind)")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        k1, k2, name, steps = args.child
        return child(int(k1), int(k2), name, int(steps))
    torch.set_num_threads(1)
    rows = measure(args.repeats, args.steps)
    text = table(rows)
    text += f"\n\nEach part alone (``timeit``, the fastest of 7 repeats of {args.calls:,} calls, on this model):\n\n"
    text += parts_table(parts(args.calls))
    if args.instructions:
        text += "\n\nCounted by cachegrind, per window over the hand loop (1,000 steps minus 200):\n\n"
        text += simulated_table(simulated())
    print(text)
    if args.markdown:
        setup = f"{platform.machine()}, 1 thread, torch {torch.__version__}, {args.repeats} repeats, fastest run"
        intro = __doc__.split("\n\n", 1)[1]
        write_page(args.markdown, "the trainer's own cost per window", "benchmarks.overhead", argv, setup, intro, text)
    return rows


if __name__ == "__main__":
    main()
