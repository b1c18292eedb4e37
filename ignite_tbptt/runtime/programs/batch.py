"""Several windows per replay: the windows of a batch and their optimizer steps as one program.

A window program and a step program replace a window's launches by two replays, but the host still runs the
trainer's Python between them, window after window. Where nothing on the host needs to run between the windows of a
batch, one program runs them all: each window's model call, loss and backward pass, its gradients added into the
static ``.grad`` buffers, and after each window that completes one, the optimizer step (division and check, the
handlers that run on the device, the fused optimizer's step, the scaler's update). Captured, a batch is one replay.
The host then walks the batch as it would have run it, window by window, from the program's outputs: the stream's
position, the windows' losses, the counters, the events in order (:class:`~ignite_tbptt.engine.stream_loop.StreamLoop`).

It applies to a batch where all of these hold (the loop checks them; otherwise the batch runs window by window):

- its windows are whole, self-contained and not recorded (k1 = k2, each a window program's), at least two of them, the
  stream already under way (its first windows run eagerly); the program stops before the first window that is not
  (a sequence start inside it, or the batch ending inside it), which runs, with the rest, one by one;
- no handler listens to the events of a window or a step (``TBPTTEvents``, ``Tbptt_Events``), but for handlers of
  ``OPTIMIZER_STEP_STARTED`` that run inside the step (:class:`~ignite_tbptt.GradientClipping`): a handler on the
  host would see the model after the whole batch;
- the optimizer's steps can run as step programs (:mod:`~ignite_tbptt.runtime.programs.step`), and ``zero_grad`` is
  torch's own;
- the predictions are not kept for ``output_transform``, and there is no ``GradScaler`` (whether it skipped a step
  is read after each step, to restart a hidden state that overflowed, as eagerly);
- with ``target_count_fn``, the optimizer has taken a step already (its state exists: a step without targets is
  skipped on the device, and a fused SGD's first step would leave its momentum unset).

``target_count_fn``'s counts stay on the device through the batch, as in a window program: each window's loss is
backpropagated as the count times its mean, a window without targets adds no gradient, each step is divided by its
windows' counts, and a step without targets is skipped on the device (without counting as refused), as an eager
one is not taken. The counts are read once, after the batch, for the host's walk.

Its results are the eager trainer's: the same operations on the same values, in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from .. import hidden as hs
from .capture import Program, StaticInputs, copied_out
from .step import StepHandler, StepPrograms
from .sweep import masked_by_count

__all__ = ["BatchWindow", "BatchProgram", "BatchResults"]


class BatchWindow(NamedTuple):
    """One window of a batch program, as its plan and the accumulation place it."""

    #: Its first step and its end, counted from the batch's first step.
    start: int
    end: int
    #: Whether some column starts a sequence at its first step (a reset mask).
    resets: bool
    #: Whether its loss is backpropagated as the mean (its step's only window) rather than the sum.
    backward_mean: bool
    #: The targets' number of elements: its target count, without ``target_count_fn``.
    targets: int
    #: Whether it is the first window of its optimizer step: its gradients are copied into the buffers, not added.
    first_of_step: bool
    #: The index, among the batch's steps, of the optimizer step it completes; ``None`` if it completes none.
    step: int | None


class BatchResults(NamedTuple):
    """What a batch program gives the host's walk."""

    #: Each window's mean loss, a detached 0-dim tensor.
    means: list[torch.Tensor]
    #: The tensors of the hidden state after the batch.
    state: list[torch.Tensor]
    #: Each step's inf/NaN decision (float32, 0-dim), carried from step to step; empty with a scaler.
    decisions: list[torch.Tensor]
    #: Each step's outputs of the handlers that ran inside it, in their order.
    handled: list[list[Any]]
    #: Each window's target count from ``target_count_fn``, a 0-dim int64 tensor; empty without it. The executor
    #: hands the walk each window's count read as an int (:meth:`ProgramExecutor.run_batch`).
    counts: list[Any]


class BatchProgram:
    """The windows of one batch shape and their optimizer steps, as one program.

    Args:
        executor: the :class:`~ignite_tbptt.runtime.ProgramExecutor` (model call, loss rule, trained parameters,
            gradient buffers, capture).
        steps: the :class:`~ignite_tbptt.runtime.StepPrograms` (optimizer, scaler, decision, learning rates).
        handlers: the ``OPTIMIZER_STEP_STARTED`` handlers that run inside each step.
        windows: the batch's windows, in order.
        x, y, hidden: the first batch's input, targets and input hidden state, which give the buffers' shapes.
        settings: the optimizer groups' hyper-parameters but the learning rate, which the program is valid for.
    """

    def __init__(
        self,
        executor: Any,
        steps: StepPrograms,
        handlers: tuple[StepHandler, ...],
        windows: tuple[BatchWindow, ...],
        x: torch.Tensor,
        y: torch.Tensor,
        hidden: Any,
        settings: list[dict],
    ) -> None:
        self.executor, self.steps, self.handlers, self.windows = executor, steps, handlers, windows
        self.settings = settings
        # Written before each run in this order: input, targets, hidden state, the windows' reset masks.
        inputs = self.inputs = StaticInputs()
        self.x, self.y = inputs.like(x), inputs.like(y)
        self.tree = hs.unflatten(hidden, [inputs.like(t) for t in hs.flatten(hidden)])
        mask = torch.zeros(executor.model_call.layout.columns(x), dtype=torch.bool, device=x.device)
        self.starts = [inputs.like(mask) if w.resets else None for w in windows]
        count = sum(w.step is not None for w in windows)
        # Each step's divisor, or with target_count_fn the targets its windows before the batch counted.
        self.divisors = [torch.ones((), dtype=torch.float64, device=x.device) for _ in range(count)]
        self.program = Program(self._body, executor.graphs, "the batch's windows")
        self.gradients: list[bool] | None = None  # which trained parameters hold a gradient after the batch

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        hidden: Any,
        resets: Mapping[int, torch.Tensor | None],
        divisors: list[int],
    ) -> BatchResults:
        """Run the batch's windows and steps on ``x``, ``y`` from ``hidden``.

        ``divisors``: each step's divisor; with ``target_count_fn``, the targets of its windows before the batch
        (the first step's, if the batch goes on with an accumulation; else 0).
        """
        sources = [x, y, *hs.flatten(hidden)]
        for window, mask in zip(self.windows, self.starts):
            if mask is not None:
                start = resets[window.start]
                assert start is not None, "a sharded model, whose steps may start no column here, runs no program"
                sources.append(start)
        self.inputs.write(sources)
        for buffer, divisor in zip(self.divisors, divisors):
            buffer.fill_(divisor)
        outputs, fresh = self.program()
        if fresh:
            # Which .grad the bodies left set: a replay runs no Python, so the walk of the batch sets them again when
            # it reaches the program's last window (ProgramExecutor.finish_batch_program).
            self.gradients = [p.grad is not None for p in self.executor.trained]
        return copied_out(outputs, fresh)

    def _body(self) -> BatchResults:
        executor, steps = self.executor, self.steps
        layout, trained, count_fn = executor.model_call.layout, executor.trained, executor.target_count_fn
        state = self.tree
        results = BatchResults([], [], [], [], [])
        step_counts: list[torch.Tensor] = []  # the counts of the open step's windows
        for window, starts in zip(self.windows, self.starts):
            x, y = layout.steps(self.x, window.start, window.end), layout.steps(self.y, window.start, window.end)
            passed = executor.window_call(x, y, state, starts, window.targets, window.backward_mean)
            grads = torch.autograd.grad(passed.root, trained, allow_unused=True)
            mean, state, count = passed.mean.detach(), executor.state_after(passed.state), passed.count
            if count is not None:  # a window without targets adds nothing (its mean is 0 / 0)
                results.counts.append(count)
                step_counts.append(count)
                grads = masked_by_count(grads, count)
            if window.first_of_step:  # zero_grad(), as each step's first window starts
                for p in trained:
                    p.grad = None
            executor.gradients.take(trained, grads)
            results.means.append(mean)
            if window.step is not None:
                found = steps.found
                assert found is not None, "the step programs filled their buffers before the batch program was chosen"
                divisor, skip = self.divisors[window.step], None
                if count_fn is not None:
                    total = divisor + torch.stack(step_counts).sum()
                    # No targets: skipped, not refused (the fused kernels skip where found_inf is exactly 1).
                    skip = torch.maximum(found, (total == 0).to(found.dtype))
                    divisor = torch.ones_like(divisor) if window.backward_mean else total.clamp(min=1)
                    step_counts = []
                steps.divide(divisor)
                results.handled.append(steps.step(self.handlers, skip)[0])  # no scaler: nothing else to read
                if steps.scaler is None:
                    results.decisions.append(found.clone())
        results.state.extend(hs.flatten(state))
        return results
