"""Windows run as programs where planning says so, whole or the rest of a batch, and the walk of what they ran.

Where windows run as programs (``cuda_graphs``), the stream loop asks at each window boundary. First, once a batch,
whether the rest of the batch runs as one batch program (:func:`run_batch_program`): what the engine must allow
(:mod:`ignite_tbptt.runtime.programs.batch` lists it) is checked here, and planning gives the windows
(:func:`~ignite_tbptt.planning.batch_windows`); the program runs them and their optimizer steps, and the loop's
state is then walked window by window from its results: the stream's position, the windows' losses and counts, the
counters, the events and the decisions are the host's as after windows run one by one. Then, as each window opens,
whether it runs whole as one sweep program (:func:`run_window_program`, as
:func:`~ignite_tbptt.planning.plan_window` says: its model calls, their losses and its backward pass through the
retained segments it reaches; a window program where it is one call reaching nothing); the loop takes its segments'
results as an eager segment's, and its close only drops what no later window reaches. A window that runs eagerly
is counted with its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..planning import BatchPlan, Eager, PlannedWindow, WindowByWindow, batch_windows, plan_window
from ..runtime import BatchProgram, BatchResults, BatchWindow, ProgramExecutor, Resets
from .loop_protocols import LoopView

__all__ = ["run_window_program", "run_batch_program"]


def run_window_program(
    loop: LoopView,
    executor: ProgramExecutor,
    batch: BatchPlan,
    x: Any,
    y: Any,
    resets: Resets,
    blocked: Eager | None,
    keep_predictions: bool,
    out: Any,
) -> bool:
    """Run the window that just opened as one program where planning says so, and walk its segments; whether it ran.

    ``blocked``: why the runtime runs no program now (:meth:`ProgramExecutor.blocked
    <ignite_tbptt.runtime.ProgramExecutor.blocked>`), or ``None``. The loop takes each segment's result as an eager
    segment's (:meth:`StreamLoop.segment_done <ignite_tbptt.engine.stream_loop.StreamLoop.segment_done>`, into
    ``out``, the batch's :class:`~ignite_tbptt.engine.stream_loop.BatchResult`); where it did not run, the loop
    runs the window segment by segment, counted in ``engine.state.programs`` with its reason.
    """
    position, one_window_per_step = loop.stream.position, loop.optimizer_step.one_window_per_step
    plans, eager = plan_window(loop.planner, batch, position, one_window_per_step, blocked)
    if eager is None:
        results = executor.run_sweep(plans, x, y, resets, batch.start, keep_predictions)
        if results is not None:
            for plan, result in zip(plans, results):
                loop.segment_done(batch, plan, result, out, swept=True)
            return True
        eager = Eager.REACH_NOT_RETAINED
    executor.counts.ran_eagerly(eager)
    return False


def run_batch_program(
    loop: LoopView,
    executor: ProgramExecutor,
    batch: BatchPlan,
    x: Any,
    y: Any,
    resets: Resets,
    keep_predictions: bool,
    out: Any,
) -> bool:
    """Run the batch's windows from the stream's position on, and their optimizer steps, as one batch program.

    Called at a window boundary, once the executor may run programs (a stream's first windows run eagerly). The
    loop then walks the windows it ran from its results, as if each had run alone (into ``out``, the batch's
    :class:`~ignite_tbptt.engine.stream_loop.BatchResult`).

    Returns:
        Whether they ran; where not, nothing changed but the count of why (``engine.state.programs.window_by_window``,
        :class:`~ignite_tbptt.planning.WindowByWindow`).
    """
    step, listener = loop.optimizer_step, loop.listener
    programs = step.programs
    blocked = _lacking(loop, executor, keep_predictions)
    handlers = listener.quiet_step_handlers() if blocked is None else None
    if blocked is None and handlers is None:
        blocked = WindowByWindow.HANDLERS
    number = listener.position().window  # the windows so far
    position = loop.stream.position
    planned, reason = batch_windows(loop.planner, batch, position, step.one_window_per_step, number, blocked)
    if reason is not None:
        executor.counts.ran_window_by_window(reason)
        return False
    assert programs is not None and handlers is not None, "a batch program is planned only where the engine allows it"
    windows, divisors = _windows(loop, batch, y, resets, planned, executor.target_count_fn is not None)
    _, settings = programs.fill_buffers()
    trained = [p.grad is not None for p in executor.trained]
    key: tuple = (x.shape, x.dtype, y.shape, y.dtype, windows, tuple(h.key for h in handlers.on_device), tuple(trained))
    key += programs.identity()

    def make() -> BatchProgram:
        return BatchProgram(executor, programs, handlers.on_device, windows, x, y, loop.stream.hidden, settings)

    step.carry_decision()
    program, results = executor.run_batch(key, make, settings, x, y, resets, divisors)
    _walk(loop, executor, batch, planned, program, results, out)
    return True


def _lacking(loop: LoopView, executor: ProgramExecutor, keep_predictions: bool) -> WindowByWindow | None:
    # What a batch program needs of the engine, the first it lacks: planning is told it as the reason.
    step = loop.optimizer_step
    if keep_predictions:
        return WindowByWindow.PREDICTIONS
    if step.scaler is not None:
        return WindowByWindow.SCALER
    if executor.target_count_fn is not None and not step.stepped:
        return WindowByWindow.FIRST_STEP
    if step.programs is None or not step.programs.supported or not step.clears_directly:
        return WindowByWindow.STEP
    if step.distributed:
        return WindowByWindow.DISTRIBUTED
    return WindowByWindow.RETAINED if loop.history.segments else None


def _walk(
    loop: LoopView,
    executor: ProgramExecutor,
    batch: BatchPlan,
    planned: tuple[PlannedWindow, ...],
    program: BatchProgram,
    results: BatchResults,
    out: Any,
) -> None:
    # The windows the program ran, walked as the host would have run them, from its results: the stream's position,
    # the windows' losses and counts, the counters, the events and the steps' decisions.
    # Each step's decision; none with a scaler.
    decisions: Sequence[torch.Tensor | None] = results.decisions or [None] * len(results.handled)
    taken = iter(zip(decisions, results.handled))
    finished = False
    try:
        for (plan, close), window, mean, n in zip(planned, program.windows, results.means, results.counts):
            loop.open_window()
            result = executor.take_batch_window(plan, mean, n)
            if window is program.windows[-1]:  # the .grad it left, before a window after it adds to them
                finished = True
                executor.finish_batch_program(program)
            step_taken = next(taken) if window.step is not None else None
            loop.segment_done(batch, plan, result, out, taken=step_taken, close=close)
    finally:
        if not finished:  # the walk was interrupted: the .grad the program left all the same
            executor.finish_batch_program(program)


def _windows(
    loop: LoopView, batch: BatchPlan, y: Any, resets: Resets, planned: tuple[PlannedWindow, ...], counted: bool
) -> tuple[tuple[BatchWindow, ...], list[int]]:
    # The program's windows, placed in their optimizer steps as the loop will take them, and each step's divisor.
    spans = [(plan.start - batch.start, plan.end - batch.start, plan.backward_mean) for plan, _ in planned]
    targets = [loop.layout.steps(y, start, end).numel() for start, end, _ in spans]
    places, divisors = loop.optimizer_step.steps_ahead([(n, mean) for n, (_, _, mean) in zip(targets, spans)], counted)
    windows = tuple(
        BatchWindow(start, end, start in resets, mean, n, first, step)
        for (start, end, mean), n, (first, step) in zip(spans, targets, places)
    )
    return windows, divisors
