"""The study's plan and its runs: learning rates chosen on a grid by one rule, then more seeds at the one chosen.

Phase 1 trains every truncation of every task at every learning rate of the task's grid with seed 0; the rule
takes, for each truncation, the rate whose run ends with the lowest validation loss. Phase 2 trains seeds 1 to
``seeds`` at that rate, and only those are reported: seed 0's run, picked as the lowest of three, would favour
the truncations whose results vary most. Runs go to a pool of processes, one core each, in a shuffled order
(so that no truncation always runs beside the same other one), and each result is appended to a JSON-lines file as it
comes: a study stopped half-way continues where it stopped, and a finished one is redrawn without training.

The prequential study (``online``) runs alike, each run reading its stream once
(:func:`~benchmarks.tradeoff.online.online_run`); its rule takes the rate of the lowest mean prequential loss.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import random
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from benchmarks.tradeoff.online import online_run, online_truncations
from benchmarks.tradeoff.online_tasks import ONLINE_TASKS
from benchmarks.tradeoff.runner import train_run
from benchmarks.tradeoff.tasks import TASKS
from benchmarks.tradeoff.truncations import truncations

QUICK_BUDGET = 1.0  # training seconds per run with --quick


def key(run: dict) -> tuple:
    """What identifies a run in the results file: task, truncation, rate, seed and budget."""
    return run["task"], run["truncation"], run["lr"], run["seed"], run["budget"]


def read_results(path: Path) -> list[dict]:
    """The runs already in ``path`` (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plan(task_names: list[str], quick: bool, online: bool = False) -> list[dict]:
    """Every (task, truncation, budget) the study runs, with its learning-rate grid (``online``: prequential)."""
    entries = []
    for name in task_names:
        task = ONLINE_TASKS[name] if online else TASKS[name]
        chosen = online_truncations(task.ks) if online else truncations(task.ks)
        if quick:  # one k1 = k2 and one k2 > k1 at the same k2, one learning rate
            chosen = [t for t in chosen if t.name in (f"TBPTT({task.ks[2]}, {task.ks[2]})", chosen[6].name)]
        lrs = task.lrs[1:2] if quick else task.lrs
        budget = None if online else QUICK_BUDGET if quick else task.budget
        entries += [{"task": name, "truncation": t.name, "budget": budget, "lrs": lrs} for t in chosen]
    return entries


def chosen_lr(results: list[dict], entry: dict) -> float | None:
    """The rule: the grid's rate whose seed-0 run ended with the lowest validation loss (diverged runs last).

    Returns:
        The rate, or None while a rate of the grid has no seed-0 run in ``results``.
    """
    finals = {
        r["lr"]: r["final_bits"]
        for r in results
        if r["seed"] == 0 and (r["task"], r["truncation"], r["budget"]) == (entry["task"], entry["truncation"],
                                                                              entry["budget"])
    }  # fmt: skip
    if any(lr not in finals for lr in entry["lrs"]):
        return None
    return min(entry["lrs"], key=lambda lr: finals[lr] if math.isfinite(finals[lr]) else math.inf)


def run_all(
    runs: list[dict], path: Path, workers: int, quick: bool, done: list[dict], online: bool = False
) -> list[dict]:
    """Train ``runs`` not yet in ``done``, appending each result to ``path``; all results."""
    have = {key(r) for r in done}
    todo = [r for r in runs if key(r) not in have]
    random.Random(len(todo)).shuffle(todo)
    results = list(done)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fresh process per run (spawned: no state shared with the parent) measures its own memory; the setting
    # reaches the runs' processes only, for as long as the pool starts them. A quick run trains for a second, less
    # than a process takes to start: quick runs share the pool's processes, each measured over what it started with.
    previous = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    try:
        return _run_in_pool(todo, path, workers, quick, results, online_run if online else train_run)
    finally:
        if previous is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = previous


def _run_in_pool(
    todo: list[dict], path: Path, workers: int, quick: bool, results: list[dict], run: Callable[..., dict]
) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, max_tasks_per_child=None if quick else 1) as pool:
        futures = {
            pool.submit(run, r["task"], r["truncation"], r["lr"], r["seed"], r["budget"], quick): r for r in todo
        }
        for n, future in enumerate(as_completed(futures), 1):
            result = future.result()
            with path.open("a") as f:
                f.write(json.dumps(result) + "\n")
            results.append(result)
            print(
                f"[{n}/{len(todo)}] {result['task']}, {result['truncation']}, lr {result['lr']:g}, seed "
                f"{result['seed']}: {result['final_bits']:.3f} after {result['curve'][-1]['seconds']:.1f} s"
                if result["curve"]
                else f"[{n}/{len(todo)}] {result['task']}, {result['truncation']}: no evaluation",
                flush=True,
            )
    return results


def study(task_names: list[str], seeds: int, workers: int, quick: bool, path: Path, online: bool = False) -> list[dict]:
    """Run both phases (skipping runs already in ``path``); the runs reported (:func:`selected`)."""
    entries = plan(task_names, quick, online)
    results = read_results(path)
    grid = [{**e, "lr": lr, "seed": 0} for e in entries for lr in e["lrs"]]
    results = run_all(grid, path, workers, quick, results, online)
    more = [{**e, "lr": chosen_lr(results, e), "seed": s} for e in entries for s in range(1, seeds + 1)]
    results = run_all(more, path, workers, quick, results, online)
    return selected(results, entries, seeds)


def selected(results: list[dict], entries: list[dict], seeds: int) -> list[dict]:
    """The runs the report uses: for each entry, seeds 1 to ``seeds`` at its chosen rate (none while unchosen)."""
    out = []
    for e in entries:
        lr = chosen_lr(results, e)
        out += [
            r
            for r in results
            if key(r)[:3] == (e["task"], e["truncation"], lr) and r["budget"] == e["budget"] and 1 <= r["seed"] <= seeds
        ]
    return out
