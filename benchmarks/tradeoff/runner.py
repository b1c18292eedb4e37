"""One run of the study: train under one truncation until a budget of training seconds is spent.

The clock counts training only: it stops while the evaluator runs, which it does after the first iteration
past each ``budget / evaluations`` seconds, and the run ends with the evaluation due at the budget.
Peak memory is the most resident memory above the process ready to train, sampled every millisecond by a
thread while training runs (not while evaluating); run it with ``MALLOC_MMAP_THRESHOLD_=65536`` (the study
does) so that freed activations leave the resident set.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time

import torch
from ignite.engine import Events

from benchmarks.memory import current_mib
from benchmarks.tradeoff.tasks import TASKS
from benchmarks.tradeoff.truncations import truncations
from ignite_tbptt import BitsPerTarget, GradientClipping, count_targets, create_tbptt_evaluator, create_tbptt_trainer

CPU = torch.device("cpu")


class PeakMemory:
    """The most resident memory while ``on``, sampled every ``interval`` seconds by a daemon thread."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval, self.peak, self.on = interval, 0.0, False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(self.interval):
            if self.on:
                self.peak = max(self.peak, current_mib(CPU))

    def stop(self) -> float:
        """Stop sampling; the peak, MiB."""
        self.done.set()
        self.thread.join()
        return self.peak


class TrainingClock:
    """Seconds spent training: a stopwatch paused while the evaluator runs."""

    def __init__(self) -> None:
        self.spent, self.since = 0.0, None

    def start(self) -> None:
        """Start, or resume after a pause."""
        self.since = time.perf_counter()

    def pause(self) -> None:
        """Stop counting until the next ``start``."""
        self.spent += time.perf_counter() - self.since
        self.since = None

    def seconds(self) -> float:
        """Seconds counted so far."""
        return self.spent + (time.perf_counter() - self.since if self.since is not None else 0.0)


def train_run(task: str, truncation: str, lr: float, seed: int, budget: float, quick: bool, evaluations: int = 6):
    """Train ``task`` under ``truncation`` for ``budget`` training seconds, in this process, on one thread.

    Args:
        task: a name of :data:`~benchmarks.tradeoff.tasks.TASKS`.
        truncation: the name of one of the task's truncations (:func:`~benchmarks.tradeoff.truncations.truncations`).
        lr: Adam's learning rate.
        seed: seeds torch's generator (the model's initial weights) and the window sources' draws.
        budget: training seconds, evaluation not counted.
        quick: the task's small configuration.
        evaluations: how many times to evaluate, every ``budget / evaluations`` seconds.

    Returns:
        The run as a JSON-ready dict: its arguments, ``curve`` (one entry per evaluation: training seconds, validation
        bits per target, optimizer steps, training targets, epoch), ``final_bits`` (the last evaluation's),
        ``windows``, ``peak_mib`` (MiB over the process ready to train) and the task's reference level.
    """
    torch.set_num_threads(1)  # the study runs several at once, one core each
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):  # the examples' loaders announce their data
        problem = TASKS[task].load(quick)
    spec = next(t for t in truncations(TASKS[task].ks) if t.name == truncation)
    model = problem.model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    source, k2, handler = spec.build(seed)
    trainer = create_tbptt_trainer(
        model,
        optimizer,
        problem.loss_fn,
        source,
        k2,
        carry_hidden=True,
        target_count_fn=count_targets,
    )
    GradientClipping(model, max_norm=1.0).attach(trainer)  # as the main job
    if handler is not None:
        handler.attach(trainer)
    if hasattr(problem.train, "set_epoch"):  # shuffled recordings: another order every epoch
        trainer.add_event_handler(Events.EPOCH_STARTED, lambda e: problem.train.set_epoch(e.state.epoch))
    evaluator = create_tbptt_evaluator(model, {"bits": BitsPerTarget(problem.loss_fn)}, carry_hidden=True)

    clock, memory = TrainingClock(), PeakMemory()
    curve: list[dict] = []
    next_at = [budget / evaluations]

    @trainer.on(Events.ITERATION_COMPLETED)
    def checkpoint(engine):
        seconds = clock.seconds()
        if seconds < next_at[0]:
            return
        clock.pause()
        memory.on = False
        bits = evaluator.run(problem.valid).metrics["bits"]
        curve.append(
            {
                "seconds": seconds,
                "bits": bits,
                "steps": engine.state.optimizer_step,
                "targets": int(engine.state.targets_seen),
                "epoch": engine.state.epoch,
            }
        )
        next_at[0] += budget / evaluations
        # The last evaluation is the one due at the budget: an iteration longer than budget / evaluations (a busy
        # machine) delays the evaluations after it, but never drops one.
        if len(curve) == evaluations or not torch.isfinite(torch.tensor(bits)):
            engine.terminate()
        memory.on = True
        clock.start()

    base = current_mib(CPU)
    memory.peak = base
    memory.on = True
    clock.start()
    trainer.run(problem.train, max_epochs=10_000)
    peak = memory.stop()
    return {
        "task": task,
        "truncation": truncation,
        "family": spec.family,
        "lr": lr,
        "seed": seed,
        "budget": budget,
        "curve": curve,
        "final_bits": curve[-1]["bits"] if curve else float("nan"),
        "windows": trainer.state.window,
        "peak_mib": peak - base,
        "reference": problem.reference,
        "reference_name": problem.reference_name,
    }
