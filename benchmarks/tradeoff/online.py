"""One prequential run: read a stream once, scoring every target before any window that holds it is learnt from.

Test-then-train (Dawid 1984, "Present position and potential developments: the prequential approach", J. R.
Stat. Soc. A 147; Gama et al. 2013, "On evaluating stream learning algorithms", Machine Learning 90): the
trainer's forward pass of a window predicts the window's targets with the weights of the last optimizer step,
before the window's own backward pass and step. So the window's mean loss, ``engine.state.window_loss`` at
``WINDOW_COMPLETED``, is the prequential loss of its targets; each target is in exactly one window, and a window
that reaches back (k2 > k1) learns again from earlier targets, already scored, without scoring them again. One
epoch, no shuffling, no held-out data: the stream is the test.

The run records the loss of every window with its target count, in order; the report bins them along the
stream. Compute is the run's seconds on one core and its optimizer steps.
"""

from __future__ import annotations

import contextlib
import io
import math
import time

import torch

from benchmarks.tradeoff.online_tasks import ONLINE_TASKS
from benchmarks.tradeoff.truncations import Truncation, truncations
from ignite_tbptt import GradientClipping, TBPTTEvents, create_tbptt_trainer

BINS = 40  # points of the loss-against-observations curve


def online_truncations(ks: tuple[int, int, int, int, int]) -> list[Truncation]:
    """The study's truncations (:func:`truncations`) and per-token updates, TBPTT(1, b): the online extreme."""
    b = ks[1]
    return [*truncations(ks), Truncation(f"TBPTT(1, {b})", "per-token", 1, b)]


def online_run(
    task: str,
    truncation: str,
    lr: float,
    seed: int,
    budget: float | None,
    quick: bool,
    device: str = "cpu",
    cuda_graphs: bool | str = False,
    batches: int | None = None,
) -> dict:
    """Read ``task``'s stream once under ``truncation``, in this process, on one thread.

    Args:
        task: a name of :data:`~benchmarks.tradeoff.online_tasks.ONLINE_TASKS`.
        truncation: the name of one of :func:`online_truncations` of the task.
        lr: Adam's learning rate.
        seed: seeds the initial weights and the window sources' draws.
        budget: unused (the stream is read once); kept so that the study runs either kind alike.
        quick: the task's small configuration.
        device: where the model and the stream go (``benchmarks.tradeoff.online_device`` times a GPU).
        cuda_graphs: the trainer's ``cuda_graphs``; with it, Adam is fused (its step runs as a program).
        batches: read only the stream's first ``batches`` batches (a dry run's).

    Returns:
        The run as a JSON-ready dict: its arguments; ``final_bits``, the mean prequential loss over the whole
        stream (in the task's unit; the study's learning-rate rule reads it); ``last_quarter``, the mean over the
        stream's last quarter of targets; ``curve``, per bin of targets along the stream, its mean loss and the
        training seconds and optimizer steps at its end; ``targets`` scored, ``seconds``, ``steps``, ``windows``; the
        reference level.
    """
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    spec = ONLINE_TASKS[task]
    with contextlib.redirect_stdout(io.StringIO()):
        stream = spec.load(quick)
    chosen = next(t for t in online_truncations(spec.ks) if t.name == truncation)
    model = stream.model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=True if cuda_graphs else None)
    source, k2, handler = chosen.build(seed)
    trainer = create_tbptt_trainer(
        model, optimizer, stream.loss_fn, source, k2, carry_hidden=True, cuda_graphs=cuda_graphs
    )
    GradientClipping(model, max_norm=1.0).attach(trainer)
    if handler is not None:
        handler.attach(trainer)
    losses: list[torch.Tensor] = []
    targets: list[int] = []
    moments: list[tuple[float, int]] = []  # training seconds and optimizer steps after each window
    start = time.perf_counter()

    @trainer.on(TBPTTEvents.WINDOW_COMPLETED)
    def record(engine):
        losses.append(engine.state.window_loss)
        targets.append(int(engine.state.window_targets))
        moments.append((time.perf_counter() - start, engine.state.optimizer_step))

    trainer.run([(x.to(device), y.to(device)) for x, y in stream.batches[:batches]], max_epochs=1)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    values = (torch.stack(losses).double() * stream.unit_per_loss).tolist()
    return {
        "task": task,
        "truncation": truncation,
        "family": chosen.family,
        "lr": lr,
        "seed": seed,
        "budget": budget,
        **summary(values, targets, moments),
        "targets": sum(targets),
        "seconds": seconds,
        "steps": trainer.state.optimizer_step,
        "windows": trainer.state.window,
        "reference": stream.reference,
        "reference_name": stream.reference_name,
        "change": stream.change * len(stream.batches[0][1][0]) if stream.change is not None else None,
    }


def summary(values: list[float], targets: list[int], moments: list[tuple[float, int]], bins: int = BINS) -> dict:
    """The whole stream's and its last quarter's mean loss, and the curve in ``bins`` bins of targets.

    A window is counted in the bin its first target falls in (windows are short against a bin).
    """
    total = sum(targets)
    if not total or not all(math.isfinite(v) for v in values):
        return {"final_bits": float("nan"), "last_quarter": float("nan"), "curve": []}
    sums, counts, ends = [0.0] * bins, [0] * bins, [(0.0, 0)] * bins
    seen = 0
    quarter_sum = quarter_count = 0
    for value, n, moment in zip(values, targets, moments):
        b = min(bins - 1, seen * bins // total)
        sums[b] += value * n
        counts[b] += n
        ends[b] = moment
        if seen >= 0.75 * total:
            quarter_sum, quarter_count = quarter_sum + value * n, quarter_count + n
        seen += n
    curve = [
        {"targets": (b + 1) * total // bins, "loss": sums[b] / counts[b], "seconds": ends[b][0], "steps": ends[b][1]}
        for b in range(bins)
        if counts[b]
    ]
    return {
        "final_bits": sum(v * n for v, n in zip(values, targets)) / total,
        "last_quarter": quarter_sum / quarter_count if quarter_count else float("nan"),
        "curve": curve,
    }
