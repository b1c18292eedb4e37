"""The optimizer step of a TBPTT trainer: exact normalisation, unscaling, finiteness check, skip detection.

Windows accumulate per-target *sums* of loss gradients in the parameters' ``.grad`` (a window that is its step's
only gradient, of one process, backpropagates its mean instead, and the step divides by one); one optimizer step
follows every ``gradient_accumulation_steps`` windows (and the end of each epoch). In that order it sums the
gradients and target counts of all processes (:mod:`ignite_tbptt.distributed`), unscales the gradients once
(``GradScaler.unscale_``), divides them by the target count (the exact gradient of the mean per-target loss
over its windows, as torchtune's ``scale_grads``; without a scaler, in the kernel that checks them for inf/NaN),
fires ``TBPTTEvents.OPTIMIZER_STEP_STARTED`` (where clipping goes) and steps.

Without a scaler, a step with inf/NaN gradients is never applied. An optimizer that can skip its own step on the
device (the fused ``SGD``, ``Adam`` and ``AdamW``: ``_step_supports_amp_scaling``, the protocol ``GradScaler``
uses) is handed the decision as a tensor, ``optimizer.found_inf``, so the check reads nothing back from the
device; the decision sticks until it is read, so every later step is skipped too, and :meth:`OptimizerStep.failure`
reads all of them at once, where the trainer reads its iteration's output anyway. Any other optimizer costs one
read per step, before it steps.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from ignite.engine import Engine

from . import distributed
from .events import TBPTTEvents, fire

__all__ = ["OptimizerStep", "divide_and_check", "skips_on_device"]


class OptimizerStep:
    """Accumulates windows and takes the optimizer step over them.

    Args:
        optimizer: the optimizer (anything with ``param_groups``, ``zero_grad`` and ``step``).
        scaler: the ``GradScaler``, or ``None``.
        accumulation: windows per optimizer step.
    """

    def __init__(self, optimizer: Any, scaler: torch.amp.GradScaler | None, accumulation: int) -> None:
        self.optimizer, self.scaler, self.accumulation = optimizer, scaler, accumulation
        self.windows = 0  # windows accumulated since the last step
        self.targets = 0  # their target count
        self.divided = False  # their gradients are already divided by it (one window backpropagated as its mean)
        self.distributed = False  # whether gradients are summed over processes, set when a run starts
        # Without a scaler: whether the optimizer skips a step on the device, given optimizer.found_inf.
        self.skips_on_device = scaler is None and skips_on_device(optimizer)
        self._found_inf: list[tuple[torch.Tensor, tuple]] = []  # device decisions not yet read, with their step

    def parameters(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates, in its order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    @property
    def one_window_per_step(self) -> bool:
        """Whether each step applies one window of this process alone, so a window may backpropagate its mean."""
        return self.accumulation == 1 and not self.distributed

    def reset(self) -> None:
        """Forget windows whose gradients were accumulated but not applied."""
        self.windows = self.targets = 0
        self.divided = False

    def window_started(self) -> None:
        """A window starts: the first of a step clears the gradients."""
        if self.windows == 0:
            self.optimizer.zero_grad()

    def window_completed(self) -> bool:
        """A window's backward pass is done; returns whether the step is due."""
        self.windows += 1
        return self.windows == self.accumulation

    def step(self, engine: Engine, on_skip: Callable[[], None]) -> None:
        """Normalise, unscale, check and apply the accumulated gradients, firing the step events on ``engine``.

        Args:
            engine: the trainer.
            on_skip: called when the ``GradScaler`` found inf/NaN and skipped the step, before
                ``OPTIMIZER_STEP_COMPLETED`` fires.

        Raises:
            FloatingPointError: without a scaler, if the gradients hold inf or NaN; the step is not taken.
        """
        targets, divided = self.targets, self.divided
        self.reset()
        if self.distributed:
            targets = distributed.all_reduce_gradients(self.parameters(), targets)
        divisor = 1 if divided else targets
        if not targets:  # only padding: nothing to learn, and momentum or weight decay must not move
            return
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        found_inf = None
        if grads:
            if self.scaler is not None:  # the scaler checked them while unscaling
                if divisor != 1:
                    torch._foreach_div_(grads, divisor)
            elif self.skips_on_device:
                earlier = self._found_inf[-1][0] if self._found_inf else None
                found_inf = divide_and_check(grads, divisor, earlier)
                self._found_inf.append((found_inf, _counters(engine)))
            elif divide_and_check(grads, divisor).item():  # one read per step, as GradScaler makes
                raise _non_finite(_where(*_counters(engine)))
        engine.state.step_targets = targets
        engine.state.optimizer_step += 1
        fire(engine, TBPTTEvents.OPTIMIZER_STEP_STARTED)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            skipped = self._scaler_skipped()
            self.scaler.update()
            if skipped:
                on_skip()
        elif found_inf is not None:
            self.optimizer.found_inf = found_inf
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
        else:
            self.optimizer.step()
        fire(engine, TBPTTEvents.OPTIMIZER_STEP_COMPLETED)

    def _scaler_skipped(self) -> bool:
        """Whether ``scaler.step`` skipped the step for inf/NaN gradients: one read, before ``update()`` forgets.

        The finiteness flags ``unscale_`` left per device (``GradScaler._found_inf_per_device``, what its own
        ``step`` decided on), rather than the scale before and after ``update()``, which costs two reads.
        """
        if not self.scaler.is_enabled():
            return False
        flags = list(self.scaler._found_inf_per_device(self.optimizer).values())
        if not flags:  # no gradients to check
            return False
        if len(flags) == 1:
            return bool(flags[0].item())
        return bool(torch.stack([f.to(flags[0].device) for f in flags]).amax().item())

    def failure(self) -> FloatingPointError | None:
        """Read the device's decisions on the steps taken since the last call (one read), and forget them.

        Returns:
            The error for the first step refused for inf/NaN gradients, or ``None`` if there was none. That
            step and every one after it were skipped on the device.
        """
        if not self._found_inf:
            return None
        decisions, self._found_inf = self._found_inf, []
        refused = torch.stack([found for found, _ in decisions]).tolist()
        first = next((counters for value, (_, counters) in zip(refused, decisions) if value), None)
        return None if first is None else _non_finite(_where(*first), later_skipped=True)

    def state_dict(self) -> dict[str, Any]:
        """Accumulated windows, their target count and gradients, and the scaler's state."""
        return {
            "group_windows": self.windows,
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
        self.windows, self.targets = state["group_windows"], state["group_targets"]
        for p, g in zip(params, state["grads"]):
            p.grad = None if g is None else g.to(p.device)
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])


def skips_on_device(optimizer: Any) -> bool:
    """Whether ``optimizer.step()`` skips itself on the device when ``optimizer.found_inf`` is set.

    The protocol ``GradScaler`` uses with the fused optimizers (``torch.optim.SGD``, ``Adam`` and ``AdamW`` with
    ``fused=True``, on CUDA and on CPU): ``_step_supports_amp_scaling``, without the older ``grad_scaler`` argument.
    """
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        return False
    try:
        return "grad_scaler" not in inspect.signature(optimizer.step).parameters
    except (TypeError, ValueError):
        return False


def _counters(engine: Engine) -> tuple[int, int, int]:
    # The step about to be taken; formatted only if it is refused.
    return engine.state.optimizer_step + 1, engine.state.window, engine.state.iteration


def _where(step: int, window: int, iteration: int) -> str:
    return f"optimizer step {step} (window {window}, iteration {iteration})"


def _non_finite(where: str, later_skipped: bool = False) -> FloatingPointError:
    later = " and every later step of the iteration were" if later_skipped else " was"
    return FloatingPointError(
        f"non-finite gradients at {where}; the step{later} not taken and the parameters are unchanged. Lower "
        "the learning rate, clip gradients (GradientClipping), or pass scaler=True to skip such steps and go on."
    )


def divide_and_check(grads: list[torch.Tensor], divisor: int, earlier: torch.Tensor | None = None) -> torch.Tensor:
    """Divide ``grads`` by ``divisor`` in place; return 1.0 if any holds inf or NaN, else 0.0.

    ``GradScaler``'s fused unscale-and-check kernel, one per device and dtype, multiplies float32, float16 and
    bfloat16 gradients by ``1 / divisor`` (rounded to float32, as the scaler's inverse scale is) while it checks
    them: on CPU a third of the time of a division followed by a check. Float64 and sparse gradients are divided
    exactly, then checked with the kernel's scale at one.

    Args:
        grads: the gradients.
        divisor: the target count, at least 1.
        earlier: a decision to carry over (a refused step refuses every later one), or ``None``.

    Returns:
        A float32 0-dim tensor on the first gradient's device: 1.0 if any gradient (or ``earlier``) is non-finite.
    """
    first = grads[0]
    device, dtype = first.device, first.dtype
    if (
        dtype in _SCALED_DTYPES
        and (earlier is None or earlier.device == device)
        and all(not g.is_sparse and g.dtype == dtype and g.device == device for g in grads)
    ):  # the usual case, one kernel: dense gradients of one dtype on one device
        found = (earlier if earlier is not None else _zero(device)).clone()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, _inverse(device, divisor))
        return found
    # One kernel per device, dtype and whether it divides (GradScaler groups alike: one dtype per kernel).
    groups: dict[tuple[torch.device, torch.dtype, bool], list[torch.Tensor]] = {}
    divided = []  # divided exactly first, then checked with scale one
    for g in grads:
        scaled = not g.is_sparse and g.dtype in _SCALED_DTYPES
        if not scaled:
            divided.append(g)
            g = g.coalesce().values() if g.is_sparse else g
        groups.setdefault((g.device, g.dtype, scaled), []).append(g)
    if divided:
        torch._foreach_div_(divided, divisor)
    flags = []
    for (device, _, scaled), group in groups.items():
        carried = earlier is not None and not flags and earlier.device == device
        found = (earlier if carried else _zero(device)).clone()
        scale = _inverse(device, divisor if scaled else 1)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found, scale)
        flags.append(found)
    first = flags[0]
    if earlier is not None and earlier.device != first.device:
        flags.append(earlier)
    return first if len(flags) == 1 else torch.stack([f.to(first.device) for f in flags]).amax()


_SCALED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=64)
def _inverse(device: torch.device, divisor: int) -> torch.Tensor:
    # The kernel's inverse scale, never written to: one tensor per device and target count, reused every step.
    return torch.full((), 1.0 / divisor, device=device, dtype=torch.float32)


@functools.lru_cache(maxsize=16)
def _zero(device: torch.device) -> torch.Tensor:
    # A float32 0.0 per device, never written to: a step's decision starts as its clone, cheaper than zeros().
    return torch.zeros((), device=device, dtype=torch.float32)
