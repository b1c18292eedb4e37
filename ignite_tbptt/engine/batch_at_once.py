"""Whether a batch's windows run as one batch program, and the program's run; the host then walks the batch.

:func:`run_at_once` checks what :mod:`ignite_tbptt.runtime.programs.batch` lists, plans the batch's windows with a
copy of the stream's planner (the trainer's own decisions, made again on the side), runs them and their optimizer
steps as one program, and returns the program's results. :meth:`StreamLoop.run_batch
<ignite_tbptt.engine.stream_loop.StreamLoop.run_batch>` then walks those windows from the results: the stream's
position, the windows' losses and counts, the counters, the events and the decisions are the host's as after
windows run one by one.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..planning import BatchPlan
from ..runtime import BatchProgram, BatchResults, BatchWindow, profiling
from .loop_protocols import LoopView

__all__ = ["run_at_once"]


def run_at_once(
    loop: LoopView,
    batch: BatchPlan,
    x: Any,
    y: Any,
    resets: Mapping[int, torch.Tensor | None],
    keep_predictions: bool,
    one_window_per_step: bool,
    out: Any,
) -> bool:
    """Run the batch's windows from the stream's position on, and their optimizer steps, as one batch program.

    Called at a window boundary, once the executor may run programs (a stream's first windows run eagerly). The
    loop then walks the windows it ran from its results, as if each had run alone (into ``out``, the batch's
    :class:`~ignite_tbptt.engine.stream_loop.BatchResult`).

    Returns:
        Whether they ran; where not, nothing changed.
    """
    executor, step = loop.executor, loop.optimizer_step
    programs = step.programs
    if (
        not executor.runs_programs
        or keep_predictions
        or step.scaler is not None  # whether it skipped a step is read after each, to restart an overflowed state
        or (executor.target_count_fn is not None and not step.stepped)  # a skipped first step leaves no state
        or programs is None
        or not programs.supported
        or step.distributed
        or not step.clears_directly
        or loop.planner.window is not None
        or loop.history.segments
        or not executor.ready()
        or profiling()
    ):
        return False
    listener = loop.listener
    handlers = listener.quiet_step_handlers()
    if handlers is None:
        return False
    number = listener.position().window  # the windows so far
    planned = _windows(loop, batch, y, resets, one_window_per_step, executor.target_count_fn is not None, number)
    if planned is None:
        return False
    windows, divisors = planned
    _, settings = programs.ready(need_gradients=False)
    trained = [p.grad is not None for p in executor.trained]
    key: tuple = (x.shape, x.dtype, y.shape, y.dtype, windows, tuple(h.key for h in handlers.on_device), tuple(trained))
    key += programs.identity()

    def make() -> BatchProgram:
        return BatchProgram(executor, programs, handlers.on_device, windows, x, y, loop.stream.hidden, settings)

    step.carry_decision()
    program, results = executor.run_batch_program(key, make, settings, x, y, resets, divisors)
    _walk(loop, batch, program, results, one_window_per_step, out)
    return True


def _walk(
    loop: LoopView,
    batch: BatchPlan,
    program: BatchProgram,
    results: BatchResults,
    one_window_per_step: bool,
    out: Any,
) -> None:
    # The windows the program ran, walked as the host would have run them, from its results: the stream's position,
    # the windows' losses and counts, the counters, the events and the steps' decisions.
    planner, executor = loop.planner, loop.executor
    # Each step's decision; none with a scaler.
    decisions: Sequence[torch.Tensor | None] = results.decisions or [None] * len(results.handled)
    taken = iter(zip(decisions, results.handled))
    finished = False
    try:
        for window, mean, n in zip(program.windows, results.means, results.counts):
            loop.open_window()
            step = loop.stream.position
            plan = planner.segment(step, batch.end, batch.stream_end, batch.next_start(step), one_window_per_step)
            assert plan.end - batch.start == window.end, "the batch program's windows are the walk's"
            result = executor.take_batch_window(plan, mean, n)
            if window is program.windows[-1]:  # the .grad it left, before a window after it adds to them
                finished = True
                executor.finish_batch_program(program)
            step_taken = next(taken) if window.step is not None else None
            loop.segment_done(batch, plan, result, out, taken=step_taken)
    finally:
        if not finished:  # the walk was interrupted: the .grad the program left all the same
            executor.finish_batch_program(program)


def _windows(
    loop: LoopView,
    batch: BatchPlan,
    y: Any,
    resets: Mapping[int, torch.Tensor | None],
    one_window_per_step: bool,
    counted: bool,
    number: int,
) -> tuple[tuple[BatchWindow, ...], list[int]] | None:
    # The batch's windows as the loop will plan them, on a copy of its planner, up to the first that is not a whole,
    # replayable, unrecorded window, and each step's divisor (counted by target_count_fn on the device: the targets
    # of its windows before the batch); None where there are fewer than two. ``number``: the windows so far.
    planner, step = copy.copy(loop.planner), loop.optimizer_step
    offset, position = batch.start, loop.stream.position
    accumulated, targets = step.accumulated, step.targets
    carried = step.targets  # counted before the batch, on the host: the first step's windows of earlier batches
    windows: list[BatchWindow] = []
    divisors: list[int] = []
    while position < batch.end:
        number += 1
        planner.open_window(position, number)
        plan = planner.segment(position, batch.end, batch.stream_end, batch.next_start(position), one_window_per_step)
        if planner.recorded or not (plan.replayable and plan.closes_window and plan.whole_window):
            break  # the windows from here on run one by one (a sequence start inside, the batch ends inside)
        planner.closed(planner.close(plan.end, batch.stream_continues(plan.end), []))
        start, end = plan.start - offset, plan.end - offset
        n = loop.layout.steps(y, start, end).numel()
        first = accumulated == 0
        accumulated, targets = accumulated + 1, targets + n
        completes = accumulated == step.accumulation
        windows.append(
            BatchWindow(start, end, start in resets, plan.backward_mean, n, first, len(divisors) if completes else None)
        )
        if completes:
            divisors.append(carried if counted else 1 if plan.backward_mean else targets)
            accumulated = targets = carried = 0
        position = plan.end
    return (tuple(windows), divisors) if len(windows) > 1 else None
