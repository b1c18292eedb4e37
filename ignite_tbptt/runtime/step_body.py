"""The optimizer step's body, run eagerly or in a program: the division and check, the step, the scale's update.

An optimizer step over accumulated windows runs the same operations whether it runs eagerly
(:class:`~ignite_tbptt.engine.optimizer_step.OptimizerStep`) or inside a step program
(:mod:`ignite_tbptt.runtime.programs.step`): with a ``GradScaler``, its ``unscale_`` (which checks the gradients for
inf/NaN into the scaler's record) and the division by the step's target count (:func:`unscale_and_divide`); without,
the division and the check in one kernel (:func:`~ignite_tbptt.runtime.divide_and_check`); then the optimizer's
step, handed the decision as ``optimizer.found_inf`` where it skips itself on the device, or the scaler's ``step``
and ``update`` (:func:`step_optimizer`). Only where the values live differs: the eager step's divisor is an int and
its decision may be read at once; a program's are buffers on the device, read after it runs.

Sources: ``torch.amp.GradScaler`` (``unscale_``, ``step``, ``update``, and the ``found_inf`` protocol of the fused
optimizers); torchtune's ``scale_grads`` for the one division by the token count at the step.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["parameters_of", "gradients_of", "unscale_and_divide", "divide_gradients", "step_optimizer"]


def parameters_of(optimizer: Any) -> list[torch.Tensor]:
    """The parameters the optimizer updates, in its order (its groups', one after the other)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def gradients_of(optimizer: Any) -> list[torch.Tensor]:
    """The ``.grad`` of the optimizer's parameters that have one, in its order."""
    return [g for p in parameters_of(optimizer) if (g := p.grad) is not None]


def unscale_and_divide(
    optimizer: Any, scaler: torch.amp.GradScaler, grads: list[torch.Tensor], divisor: int | torch.Tensor
) -> None:
    """With a ``GradScaler``, the step's first part: ``unscale_`` (its check, into its record), then the division.

    ``grads`` (:func:`gradients_of`) are divided by ``divisor`` in place.

    Without a scaler the first part is :func:`~ignite_tbptt.runtime.divide_and_check`, the division and the check in
    one kernel, eager and in programs alike.

    Args:
        optimizer: the optimizer, whose gradients ``grads`` are.
        scaler: the ``GradScaler``.
        grads: the gradients.
        divisor: the step's target count, or 1 where its one window backpropagated its mean; or a float64 0-dim
            tensor on the gradients' device holding it (a program's buffer, read by no host).
    """
    scaler.unscale_(optimizer)
    divide_gradients(grads, divisor)


def divide_gradients(grads: list[torch.Tensor], divisor: int | torch.Tensor) -> None:
    """Divide ``grads`` by ``divisor`` in place, without a check: :func:`unscale_and_divide`'s division.

    Also the whole first part where the optimizer's own step unscales and checks through the scaler (Lightning's
    optimizer wrapper under its mixed-precision plugin): the scaled gradients are divided, and the unscaling after
    it, by a power of two, changes no bit of the result. ``divisor`` as :func:`unscale_and_divide` takes it.
    """
    if isinstance(divisor, torch.Tensor):
        if {g.dtype for g in grads} == {torch.float32}:  # keeps torch's fused kernel; a count below 2**24 is exact
            divisor = divisor.float()
        torch._foreach_div_(grads, divisor)
    elif divisor != 1 and grads:
        torch._foreach_div_(grads, divisor)


def step_optimizer(
    optimizer: Any, scaler: torch.amp.GradScaler | None, found_inf: torch.Tensor | None = None
) -> torch.Tensor | None:
    """The step's second part: the optimizer's step (through the scaler, if any) and the scale's update.

    Args:
        optimizer: the optimizer.
        scaler: the ``GradScaler``, or ``None``.
        found_inf: without a scaler, the decision handed to an optimizer that skips itself on the device where it is
            1.0 (``optimizer.found_inf``); ``None`` steps it unconditionally.

    Returns:
        With an enabled scaler, whether it skipped the step for inf/NaN gradients: a 0-dim tensor on the device,
        taken before ``update()`` forgets the scaler's record (one read where the caller needs it on the host);
        else ``None``.
    """
    if scaler is None:
        if found_inf is None:
            optimizer.step()
            return None
        optimizer.found_inf = found_inf
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
        return None
    scaler.step(optimizer)
    skipped = None
    if scaler.is_enabled():
        # The flags unscale_ left per device, what scaler.step decided on (one device: the flag itself, which
        # update() reads and does not change).
        flags = list(scaler._found_inf_per_device(optimizer).values())
        if len(flags) == 1:
            skipped = flags[0]
        elif flags:
            skipped = torch.stack([f.to(flags[0].device) for f in flags]).amax()
    scaler.update()
    return skipped
