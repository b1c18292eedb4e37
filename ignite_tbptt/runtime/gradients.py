"""The gradients at an optimizer step: divided by the target count and checked for inf/NaN in one kernel.

Sources: ``torch.amp.GradScaler``'s fused unscale-and-check kernel, and the protocol by which it hands its
decision to the fused optimizers (``optimizer.found_inf``); torchtune's ``scale_grads`` for the one division by
the token count at the step.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

__all__ = ["divide_and_check", "skips_on_device"]


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
    if (
        first.dtype in _SCALED_DTYPES
        and _alike(grads, first)
        and (earlier is None or earlier.is_cpu and first.is_cpu or earlier.device == first.device)
    ):
        # The usual case, one kernel: dense gradients of one dtype on one device.
        found = earlier.clone() if earlier is not None else torch.zeros((), device=first.device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, _inverse(first.device, divisor))
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


def _alike(grads: list[torch.Tensor], first: torch.Tensor) -> bool:
    # Dense, of first's dtype, on first's device. A plain loop over flags, once per optimizer step: a torch.device
    # made per gradient, or a generator, costs more than the check's kernel on a small model.
    dtype, cpu = first.dtype, first.is_cpu
    for g in grads:
        if g.is_sparse or g.dtype is not dtype or g.is_cpu is not cpu:
            return False
    return cpu or all(g.device == first.device for g in grads)


@functools.lru_cache(maxsize=64)
def _inverse(device: torch.device, divisor: int) -> torch.Tensor:
    # The kernel's inverse scale, never written to: one tensor per device and target count, reused every step.
    return torch.full((), 1.0 / divisor, device=device, dtype=torch.float32)


@functools.lru_cache(maxsize=16)
def _zero(device: torch.device) -> torch.Tensor:
    # A float32 0.0 per device, never written to: a step's decision starts as its clone, cheaper than zeros().
    return torch.zeros((), device=device, dtype=torch.float32)
