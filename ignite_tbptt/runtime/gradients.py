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


def divide_and_check(
    grads: list[torch.Tensor],
    divisor: int | torch.Tensor,
    earlier: torch.Tensor | None = None,
    *,
    into: torch.Tensor | None = None,
) -> torch.Tensor:
    """Divide ``grads`` by ``divisor`` in place; return 1.0 if any holds inf or NaN, else 0.0.

    ``GradScaler``'s fused unscale-and-check kernel, one per device and dtype, multiplies float32, float16 and
    bfloat16 gradients by ``1 / divisor`` (rounded to float32, as the scaler's inverse scale is) while it checks
    them: on CPU a third of the time of a division followed by a check. Float64 and sparse gradients are divided
    exactly, then checked with the kernel's scale at one. On the CPU, where nothing divides (a scale of one, exact
    in every dtype), one kernel checks gradients of every dtype.

    Args:
        grads: the gradients.
        divisor: the target count, at least 1; or a float64 0-dim tensor holding it, on the gradients' device (a
            step program's buffer: nothing is read from it on the host, and the same values result).
        earlier: a decision to carry over (a refused step refuses every later one), or ``None``; it is not changed.
        into: a float32 0-dim decision to set in place instead of a new one (it only ever goes from 0.0 to 1.0, so
            a caller may reuse one while it reads 0.0), or ``None``.

    Returns:
        A float32 0-dim tensor on the first gradient's device (``into`` itself where one kernel checks all): 1.0 if any
        gradient is non-finite or ``earlier`` (``into``) was already 1.0.

    Raises:
        ValueError: if both ``earlier`` and ``into`` are given.
    """
    if earlier is not None and into is not None:
        raise ValueError("pass earlier (a decision to copy) or into (one to set in place), not both.")
    start = into if into is not None else earlier
    first = grads[0]
    cpu = first.is_cpu
    divides = isinstance(divisor, torch.Tensor) or divisor != 1
    # Off the CPU a kernel launch per dtype, as GradScaler groups them: a mixed list would cost one per tensor.
    if _alike(grads, first, cpu, divides or not cpu) and (start is None or _same_device(start, first)):
        # The usual case, one kernel: dense gradients on one device (of one dtype where it divides, or off the CPU).
        device = _CPU if cpu else first.device
        found = into if into is not None else earlier.clone() if earlier is not None else _zero(device).clone()
        try:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, _inverse(device, divisor))
            return found
        except NotImplementedError:
            # A sparse gradient, whose layout the dispatch refuses before anything runs; or, on the CPU without a
            # division, a dtype the kernel has no loop for, met after the others were checked at a scale of one,
            # which changed nothing. The grouped path below checks them all again.
            pass
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
    flags: list[torch.Tensor] = []
    for (device, _, scaled), group in groups.items():
        carried = start is not None and not flags and start.device == device
        if carried and into is not None:
            found = into
        elif carried and start is not None:
            found = start.clone()
        else:
            found = _zero(device).clone()
        scale = _inverse(device, divisor if scaled else 1)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found, scale)
        flags.append(found)
    first = flags[0]
    if start is not None and start.device != first.device:
        flags.append(start)
    return first if len(flags) == 1 else torch.stack([f.to(first.device) for f in flags]).amax()


_SCALED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CPU = torch.device("cpu")


def _alike(grads: list[torch.Tensor], first: torch.Tensor, cpu: bool, one_dtype: bool) -> bool:
    # On first's device and, if one_dtype, of first's dtype, one it scales (float64 is divided exactly apart): a
    # scale of one is exact in every dtype. Sparse gradients are not looked for here: the kernel's dispatch
    # has none for their layout and refuses before anything runs. A plain loop over flags, once per optimizer step:
    # a torch.device made per gradient, or a generator, costs more than the check's kernel on a small model.
    if one_dtype:
        dtype = first.dtype
        if dtype not in _SCALED_DTYPES:
            return False
        for g in grads:
            if g.dtype is not dtype or g.is_cpu is not cpu:
                return False
    else:
        for g in grads:
            if g.is_cpu is not cpu:
                return False
    return cpu or all(g.device == first.device for g in grads)


def _same_device(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Two flags read before a torch.device is made: the CPU case costs no object.
    return a.is_cpu and b.is_cpu or a.device == b.device


def _inverse(device: torch.device, divisor: int | torch.Tensor) -> torch.Tensor:
    # The kernel's inverse scale, rounded to float32 as the scaler's is: from a tensor divisor, on the device (1 / d
    # in float64 then float32 gives the value torch.full makes from the same division in Python).
    if isinstance(divisor, torch.Tensor):
        return divisor.to(device).reciprocal().float()
    return _inverse_of(device, divisor)


@functools.lru_cache(maxsize=64)
def _inverse_of(device: torch.device, divisor: int) -> torch.Tensor:
    # Never written to: one tensor per device and target count, reused every step.
    return torch.full((), 1.0 / divisor, device=device, dtype=torch.float32)


@functools.lru_cache(maxsize=16)
def _zero(device: torch.device) -> torch.Tensor:
    # A float32 0.0 per device, never written to: a step's decision starts as its clone, cheaper than zeros().
    return torch.zeros((), device=device, dtype=torch.float32)
