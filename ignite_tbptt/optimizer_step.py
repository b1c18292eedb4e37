"""The optimizer step of a TBPTT trainer: exact normalisation, unscaling, finiteness check, skip detection.

Windows accumulate per-target *sums* of loss gradients in the parameters' ``.grad``; one optimizer step
follows every ``gradient_accumulation_steps`` windows (and the end of each epoch). In that order it sums the
gradients and target counts of all processes (:mod:`ignite_tbptt.distributed`), unscales the gradients once
(``GradScaler.unscale_``), divides them by the target count (the exact gradient of the mean per-target loss
over its windows, as torchtune's ``scale_grads``), checks them for inf/NaN when no scaler does, fires
``TBPTTEvents.OPTIMIZER_STEP_STARTED`` (where clipping goes) and steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ignite.engine import Engine

from . import distributed
from .events import TBPTTEvents

__all__ = ["OptimizerStep"]


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
        if distributed.is_distributed():
            targets = distributed.all_reduce_gradients(params, targets)
        if not targets:  # only padding: nothing to learn, and momentum or weight decay must not move
            return
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_div_(grads, targets)
            if self.scaler is None:
                _check_finite(engine, grads)
        engine.state.step_targets = targets
        engine.state.optimizer_step += 1
        engine.fire_event(TBPTTEvents.OPTIMIZER_STEP_STARTED)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < scale:  # the scaler found inf/NaN and skipped the step
                on_skip()
        else:
            self.optimizer.step()
        engine.fire_event(TBPTTEvents.OPTIMIZER_STEP_COMPLETED)

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


def _check_finite(engine: Engine, grads: list[torch.Tensor]) -> None:
    # One host synchronisation per step, as GradScaler makes: never step into NaN weights.
    if not torch.isfinite(torch.stack(torch._foreach_norm(grads))).all():
        raise FloatingPointError(
            f"non-finite gradients at optimizer step {engine.state.optimizer_step + 1} (window "
            f"{engine.state.window}, iteration {engine.state.iteration}); the step was not taken and the "
            "parameters are unchanged. Lower the learning rate, clip gradients (GradientClipping), or pass "
            "scaler=True to skip such steps and go on."
        )
