"""The optimizer step of a TBPTT trainer: exact normalisation, unscaling, finiteness check, skip detection.

Windows accumulate per-target *sums* of loss gradients in the parameters' ``.grad``; one optimizer step
follows every ``gradient_accumulation_steps`` windows (and the end of each epoch). In that order it sums the
gradients and target counts of all processes (:mod:`ignite_tbptt.distributed`), unscales the gradients once
(``GradScaler.unscale_``), divides them by the target count (the exact gradient of the mean per-target loss
over its windows, as torchtune's ``scale_grads``), checks them for inf/NaN when no scaler does, fires
``TBPTTEvents.OPTIMIZER_STEP_STARTED`` (where clipping goes) and steps.

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

__all__ = ["OptimizerStep", "non_finite", "skips_on_device"]


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
        self.distributed = False  # whether gradients are summed over processes, set when a run starts
        # Without a scaler: whether the optimizer skips a step on the device, given optimizer.found_inf.
        self.skips_on_device = scaler is None and skips_on_device(optimizer)
        self._found_inf: list[tuple[torch.Tensor, str]] = []  # device decisions not yet read, with their step

    def parameters(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates, in its order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def reset(self) -> None:
        """Forget windows whose gradients were accumulated but not applied."""
        self.windows = self.targets = 0

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
        targets = self.targets
        self.reset()
        params = self.parameters()
        if self.distributed:
            targets = distributed.all_reduce_gradients(params, targets)
        if not targets:  # only padding: nothing to learn, and momentum or weight decay must not move
            return
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in params if p.grad is not None]
        found_inf = None
        if grads:
            torch._foreach_div_(grads, targets)
            if self.skips_on_device:
                found_inf = self._decide_on_device(engine, non_finite(grads))
            elif self.scaler is None and non_finite(grads).item():  # one read per step, as GradScaler makes
                raise _non_finite(_where(engine))
        engine.state.step_targets = targets
        engine.state.optimizer_step += 1
        fire(engine, TBPTTEvents.OPTIMIZER_STEP_STARTED)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < scale:  # the scaler found inf/NaN and skipped the step
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

    def _decide_on_device(self, engine: Engine, found_inf: torch.Tensor) -> torch.Tensor:
        """``found_inf``, or 1.0 if an earlier step not yet read was refused; remembered for :meth:`failure`."""
        if self._found_inf:
            found_inf = torch.maximum(found_inf, self._found_inf[-1][0])
        self._found_inf.append((found_inf, _where(engine)))
        return found_inf

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
        first = next((where for value, (_, where) in zip(refused, decisions) if value), None)
        return None if first is None else _non_finite(first, later_skipped=True)

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


def _where(engine: Engine) -> str:
    return (
        f"optimizer step {engine.state.optimizer_step + 1} (window {engine.state.window}, iteration "
        f"{engine.state.iteration})"
    )


def _non_finite(where: str, later_skipped: bool = False) -> FloatingPointError:
    later = " and every later step of the iteration were" if later_skipped else " was"
    return FloatingPointError(
        f"non-finite gradients at {where}; the step{later} not taken and the parameters are unchanged. Lower "
        "the learning rate, clip gradients (GradientClipping), or pass scaler=True to skip such steps and go on."
    )


def non_finite(grads: list[torch.Tensor]) -> torch.Tensor:
    """1.0 if any of ``grads`` holds inf or NaN, else 0.0: a float32 0-dim tensor on the first gradient's device.

    ``GradScaler``'s fused check, one kernel per device and dtype (its scale here is one, so nothing changes), where
    norms, a stack and a reduction take five. Sparse gradients are checked through their values.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        g = g.coalesce().values() if g.is_sparse else g
        groups.setdefault((g.device, g.dtype), []).append(g)
    flags = []
    for (device, _), group in groups.items():
        found = torch.zeros((), device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found, _one(device))
        flags.append(found)
    first = flags[0]
    return first if len(flags) == 1 else torch.stack([f.to(first.device) for f in flags]).amax()


@functools.cache
def _one(device: torch.device) -> torch.Tensor:
    # The check's scale, never written to: one tensor per device for the whole process.
    return torch.ones((), device=device)
