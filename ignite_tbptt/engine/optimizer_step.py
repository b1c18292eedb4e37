"""The optimizer step of a TBPTT trainer: exact normalisation, unscaling, finiteness check, skip detection.

Windows accumulate per-target *sums* of loss gradients in the parameters' ``.grad`` (a window that is its step's
only gradient, of one process, backpropagates its mean instead, and the step divides by one); one optimizer step
follows every ``gradient_accumulation_steps`` windows (and the end of each epoch). In that order it sums the
gradients and target counts of all processes (:mod:`ignite_tbptt.engine.distributed`), unscales the gradients once
(``GradScaler.unscale_``), divides them by the target count (the exact gradient of the mean per-target loss
over its windows, as torchtune's ``scale_grads``; without a scaler, in the kernel that checks them for inf/NaN:
:mod:`ignite_tbptt.runtime.gradients`) and steps. It fires no event: :meth:`OptimizerStep.prepare` and
:meth:`OptimizerStep.apply` return what happened, and the stream loop has its listener fire
``TBPTTEvents.OPTIMIZER_STEP_STARTED`` (where clipping goes) between the two.

Without a scaler, a step with inf/NaN gradients is never applied. Where the gradients are on the CPU the decision
is read at once (a read there waits for no queue) and a refused step raises before any later window runs. On an
accelerator, an optimizer that can skip its own step on the device (the fused ``SGD``, ``Adam`` and ``AdamW``:
``_step_supports_amp_scaling``, the protocol ``GradScaler`` uses) is handed the decision as a tensor,
``optimizer.found_inf``, so the check reads nothing back from the device; the decision sticks until it is read, so
every later step is skipped too, and :meth:`OptimizerStep.take_failure` reads all of them at once, where the
trainer reads its iteration's output anyway. Any other optimizer costs one read per step, before it steps.

With window programs (``cuda_graphs``), a step of such an optimizer runs as a step program
(:mod:`ignite_tbptt.runtime.programs.step`): the same operations, captured in a CUDA graph on a GPU, its decision
kept on the device on the CPU too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ..planning import RuntimeFacts
from ..runtime import (
    StepHandler,
    StepProgram,
    StepPrograms,
    divide_and_check,
    divide_gradients,
    gradients_of,
    parameters_of,
    profiling,
    skips_on_device,
    step_optimizer,
    unscale_and_divide,
)
from . import distributed

__all__ = ["OptimizerStep", "RunPosition"]


class RunPosition(NamedTuple):
    """Where a run is at an optimizer step: named by a refused step's error, and the same on every process."""

    #: The epoch's length in iterations, or -1 where it is not known.
    epoch_length: int
    epoch: int
    iteration: int
    #: Windows started in the run.
    window: int
    #: The optimizer step about to be taken, counted from 1.
    step: int


class OptimizerStep:
    """Accumulates windows and takes the optimizer step over them.

    Args:
        optimizer: the optimizer (anything with ``param_groups``, ``zero_grad`` and ``step``).
        scaler: the ``GradScaler``, or ``None``.
        accumulation: windows per optimizer step.
    """

    #: Read the finiteness decision of a step whose gradients are on the CPU at once, where a read waits for nothing
    #: and saves the copy of each decision and its hand-over to the optimizer; False keeps it on the device, as on an
    #: accelerator.
    reads_cpu_decisions = True

    def __init__(
        self,
        optimizer: Any,
        scaler: torch.amp.GradScaler | None,
        accumulation: int,
        step_programs: StepPrograms | None = None,
    ) -> None:
        self.optimizer, self.scaler, self.accumulation = optimizer, scaler, accumulation
        #: The step programs, with window programs (``None`` without): steps planning gives them, they run.
        self.step_programs = step_programs
        self._program: tuple[StepProgram, RunPosition] | None = None  # the prepared step's
        self.accumulated = 0  # windows accumulated since the last step
        self.targets = 0  # their target count
        self.backward_mean = False  # their one window backpropagated its mean loss: the gradients are divided
        self.distributed = False  # whether gradients are summed over processes, set when a run starts
        #: The optimizer is a wrapper whose own step unscales, checks, steps through the scaler and updates it
        #: (Lightning's ``LightningOptimizer`` under its mixed-precision plugin): :meth:`prepare` then only divides
        #: the scaled gradients (by a power of two the unscaling is exact, so the order changes no bit), and
        #: :meth:`apply` tells a skipped step by the scale's backoff.
        self.scaler_in_step = False
        # Without a scaler: whether the optimizer skips a step on the device, given optimizer.found_inf.
        self.skips_on_device = scaler is None and skips_on_device(optimizer)
        # torch's own zero_grad() only sets each gradient to None, inside a profiler range and a guard against
        # dynamo: about 9 µs a window on a small model, where doing the same here costs one. An optimizer whose
        # class or instance has a zero_grad of its own gets it called.
        self._clears_directly = _torchs_zero_grad(optimizer)
        # Device decisions not yet read, with the position of their step.
        self._found_inf: list[tuple[torch.Tensor, RunPosition]] = []
        self._eager_decision = False  # the last of them is an eager step's, not yet in the step programs' buffer
        self._due: torch.Tensor | None = None  # the decision of the prepared step, handed to the optimizer
        self._finite: torch.Tensor | None = None  # a decision read as 0.0, set in place by the next check read at once

    def parameters(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates, in its order."""
        return parameters_of(self.optimizer)

    @property
    def one_window_per_step(self) -> bool:
        """Whether each step applies one window of this process alone, so a window may backpropagate its mean."""
        return self.accumulation == 1 and not self.distributed

    def reset(self) -> None:
        """Forget windows whose gradients were accumulated but not applied."""
        self.accumulated = self.targets = 0
        self.backward_mean = False
        self._due = None
        self._program = None

    def window_started(self) -> None:
        """A window starts: the first of a step clears the gradients (``zero_grad()``, to ``None``)."""
        if self.accumulated == 0:
            if self._clears_directly and not profiling():  # a profiler's trace keeps torch's range
                for p in self.parameters():
                    p.grad = None
            else:
                self.optimizer.zero_grad()

    def accumulate(self, targets: int, backward_mean: bool) -> None:
        """A segment's gradient of ``targets`` targets was added, as their mean or as their sum."""
        self.targets += targets
        self.backward_mean = backward_mean

    def window_completed(self) -> bool:
        """A window's backward pass is done; returns whether the step is due."""
        self.accumulated += 1
        return self.accumulated == self.accumulation

    def synchronise(self, position: tuple[int, ...], targets: int) -> int:
        """:func:`~ignite_tbptt.engine.distributed.synchronise` on the parameters' device; the summed target count.

        Raises:
            ProcessesDisagree: if another process reports another ``position``.
        """
        params = self.parameters()
        device = params[0].device if params else torch.device("cpu")
        return distributed.synchronise(position, targets, device)

    def prepare(self, position: RunPosition, handlers: Sequence[StepHandler] | None = None) -> int:
        """Make the accumulated gradients final: summed over processes, unscaled, divided and checked.

        Args:
            position: where the run is, with the step about to be taken: named by the error for a refused step,
                and shared by every process of a distributed run (:func:`~ignite_tbptt.engine.distributed.synchronise`).
            handlers: the ``OPTIMIZER_STEP_STARTED`` handlers, all of which run inside the step program, where the
                step runs as one (as :func:`~ignite_tbptt.planning.plan_step` says); ``None`` for an eager step.
                :attr:`in_program` says whether it does (a step without any gradient does not): then the handlers
                run inside :meth:`apply`.

        Returns:
            The step's target count over all processes; 0 if it has none (only padding), and then the step must
            not be applied: nothing was learnt, and momentum or weight decay must not move.

        Raises:
            FloatingPointError: without a scaler, if the gradients hold inf or NaN and the decision is read at
                once (gradients on the CPU, or an optimizer that cannot skip on the device); the step must not be
                applied.
            ProcessesDisagree: in a distributed run, if the processes are at different steps.
        """
        targets, backward_mean = self.targets, self.backward_mean
        self.reset()
        if self.distributed:  # every process must be at the same step: checked with the target counts
            targets = self.synchronise((distributed.STEP, *position), targets)
            if targets:
                distributed.all_reduce_gradients(self.parameters())
        if not targets:
            return 0
        divisor = _divisor(targets, backward_mean)
        if handlers is not None and self._in_program(divisor, handlers, position):
            return targets
        grads = gradients_of(self.optimizer)
        if self.scaler is not None and self.scaler_in_step:  # the wrapper's step unscales and checks
            divide_gradients(grads, divisor)
        elif self.scaler is not None:  # the scaler checks them while unscaling
            unscale_and_divide(self.optimizer, self.scaler, grads, divisor)
        elif grads:
            if self.skips_on_device and not (self.reads_cpu_decisions and grads[0].is_cpu):
                found_inf = self._found_inf
                self._due = divide_and_check(grads, divisor, found_inf[-1][0] if found_inf else None)
                found_inf.append((self._due, position))
                self._eager_decision = self.step_programs is not None
            else:
                try:
                    refused = divide_and_check(grads, divisor, into=self._finite_on(grads[0])).item()  # one read
                except BaseException:
                    self._finite = None  # perhaps set before the error: the next check starts from a fresh one
                    raise
                if refused:
                    self._finite = None
                    raise _non_finite(_where(position))
        return targets

    def facts(self, host_handlers: bool) -> RuntimeFacts:
        """What planning weighs before a step (:func:`~ignite_tbptt.planning.plan_step`).

        ``host_handlers``: a handler of ``OPTIMIZER_STEP_STARTED`` runs on the host.
        """
        supported = self.step_programs is not None and self.step_programs.supported
        return RuntimeFacts(
            profiling(), optimizer_skips=supported, distributed=self.distributed, host_handlers=host_handlers
        )

    def _in_program(self, divisor: int, handlers: Sequence[StepHandler], position: RunPosition) -> bool:
        # The step program planning chose, unless the step has no gradient at all (nothing to capture).
        assert self.step_programs is not None, "handlers are given only where steps may run as programs"
        program = self.step_programs.program(divisor, handlers)
        if program is None:
            return False
        self.carry_decision()
        self._program = program, position
        return True

    def carry_decision(self) -> None:
        """Before a program's step: an eager step's decision not yet read goes into the programs' buffer.

        A refused step refuses every later one, until the decisions are read.
        """
        if self._eager_decision:
            # Set only with step programs (prepare), whose fill_buffers() made the buffer before a program is chosen.
            found = self.step_programs.found if self.step_programs is not None else None
            assert found is not None, "an eager decision is carried only into the step programs' buffer"
            found.copy_(self._found_inf[-1][0])
            self._eager_decision = False

    @property
    def in_program(self) -> bool:
        """Whether the prepared step runs as a step program."""
        return self._program is not None

    def _finite_on(self, grad: torch.Tensor) -> torch.Tensor:
        # The decision to check into when it is read at once: kept while it reads 0.0, so a step allocates nothing.
        finite = self._finite
        if finite is None or not (finite.is_cpu and grad.is_cpu or finite.device == grad.device):
            finite = self._finite = torch.zeros((), device=grad.device, dtype=torch.float32)  # the kernel's dtype
        return finite

    def apply(self) -> bool:
        """Step the optimizer with the prepared gradients (through the scaler, if any).

        Returns:
            Whether the ``GradScaler`` found inf/NaN and skipped the step (always False without a scaler).
        """
        if self._program is not None:
            (program, position), self._program = self._program, None
            skipped = program.step()
            if self.scaler is None:  # its decision, kept for take_failure(): the buffer goes on to the next step
                found = program.steps.found
                assert found is not None, "the step programs' fill_buffers() made it before the program was chosen"
                self._found_inf.append((found.clone(), position))
            # With a scaler, whether it skipped the step: one read, as the eager step reads it.
            return skipped is not None and bool(skipped.item())
        if self.scaler is not None and self.scaler_in_step:
            # update() multiplies the scale by backoff_factor < 1 after a skipped step only (growth_factor > 1).
            before = self.scaler._scale.clone() if self.scaler._scale is not None else None
            self.optimizer.step()
            after = self.scaler._scale
            return before is not None and after is not None and bool((after < before).item())
        due, self._due = self._due, None
        skipped = step_optimizer(self.optimizer, self.scaler, due)  # with a scaler: whether it skipped, one read
        return skipped is not None and bool(skipped.item())

    def forget_failure(self) -> None:
        """Forget the device's decisions on the steps taken so far, unread (an interrupted run's)."""
        self._found_inf = []
        self._eager_decision = False
        if self.step_programs is not None:
            self.step_programs.forget_failure()

    def take_failure(self) -> FloatingPointError | None:
        """Read the device's decisions on the steps taken since the last call (one read), and forget them.

        Returns:
            The error for the first step refused for inf/NaN gradients, or ``None`` if there was none. That
            step and every one after it were skipped on the device.
        """
        if not self._found_inf:
            return None
        decisions, self._found_inf = self._found_inf, []
        self._eager_decision = False
        # A refused step refuses every later one, so the last decision says whether any was refused: one value read,
        # and all of them only when some step was refused, to name the first.
        if not decisions[-1][0].item():
            return None
        if self.step_programs is not None:
            self.step_programs.forget_failure()
        refused = torch.stack([found for found, _ in decisions]).tolist()
        first = next((position for value, (_, position) in zip(refused, decisions) if value), None)
        return None if first is None else _non_finite(_where(first), later_skipped=True)

    def state_dict(self) -> dict[str, Any]:
        """Accumulated windows, their target count and gradients, and the scaler's state."""
        return {
            "group_windows": self.accumulated,
            "group_targets": self.targets,
            "grads": [None if p.grad is None else p.grad.clone() for p in self.parameters()],
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state into the optimizer's parameters.

        Raises:
            ValueError: if the state holds gradients for another number of parameters.
        """
        params = self.parameters()
        if len(state["grads"]) != len(params):
            raise ValueError(
                f"the checkpoint's TBPTT state has gradients for {len(state['grads'])} parameters, the optimizer "
                f"holds {len(params)}: load it into a trainer built with the same model and optimizer."
            )
        self.accumulated, self.targets = state["group_windows"], state["group_targets"]
        for p, g in zip(params, state["grads"]):
            p.grad = None if g is None else g.to(p.device)
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])


def _divisor(targets: int, backward_mean: bool) -> int:
    # What a step's gradients are divided by: its target count, or 1 where its one window backpropagated its mean.
    return 1 if backward_mean else targets


def _torchs_zero_grad(optimizer: Any) -> bool:
    # zero_grad is torch.optim.Optimizer's, neither overridden by a subclass nor set on the instance.
    own = getattr(optimizer, "__dict__", {})
    return getattr(type(optimizer), "zero_grad", None) is torch.optim.Optimizer.zero_grad and "zero_grad" not in own


def _where(position: RunPosition) -> str:
    return f"optimizer step {position.step} (window {position.window}, iteration {position.iteration})"


def _non_finite(where: str, later_skipped: bool = False) -> FloatingPointError:
    later = " and every later step of the iteration were" if later_skipped else " was"
    return FloatingPointError(
        f"non-finite gradients at {where}; the step{later} not taken and the parameters are unchanged. If the "
        "batch's inputs or targets hold NaN or inf (padding read as data, a broken record), fix the data; if training "
        "diverged, lower the learning rate, clip gradients (GradientClipping), or pass scaler=True to skip such "
        "steps and go on."
    )
