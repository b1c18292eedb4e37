"""Gradient clipping at the optimizer step, after the gradients are final."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from ignite.engine import Engine

from ..engine import TBPTTEvents, tbptt_state

__all__ = ["GradientClipping", "gradient_norm"]

Parameters = torch.nn.Module | Iterable[torch.Tensor] | Callable[[], Iterable[torch.Tensor]]


def _parameters(parameters: Parameters) -> Callable[[], list[torch.Tensor]]:
    if isinstance(parameters, torch.nn.Module):
        return lambda: list(parameters.parameters())
    if callable(parameters):
        return lambda: list(parameters())
    fixed = list(parameters)
    return lambda: fixed


def gradient_norm(engine: Engine, parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """Total ``norm_type``-norm of the gradients, as ``torch.nn.utils.clip_grad_norm_`` computes it.

    Computed once per optimizer step and kept in ``engine.state.grad_norm`` (a 0-dim tensor, no device
    synchronisation): whoever asks first during ``TBPTTEvents.OPTIMIZER_STEP_STARTED`` gets the norm before
    any clipping, and so does everyone after.
    """
    state = tbptt_state(engine)
    if getattr(state, "grad_norm_stamp", None) != (state.optimizer_step, float(norm_type)):
        keep_norm(engine, total_norm(parameters, norm_type), norm_type)
    return state.grad_norm


def keep_norm(engine: Engine, norm: torch.Tensor, norm_type: float = 2.0) -> None:
    """After a step program: ``norm`` in ``engine.state.grad_norm``, unless a handler before kept this step's norm.

    What :func:`gradient_norm` leaves, for the handlers that ran inside the step program and computed the norm there
    (``device_part``): the first of them keeps it, as the first to ask does eagerly.
    """
    state = tbptt_state(engine)
    stamp = (state.optimizer_step, float(norm_type))
    if getattr(state, "grad_norm_stamp", None) != stamp:
        state.grad_norm, state.grad_norm_stamp = norm, stamp


def step_norm(shared: dict, parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """Inside a step program: the step's norm, computed by the first handler that asks and kept in ``shared``.

    What :func:`gradient_norm` does eagerly with ``engine.state``: every handler of the step gets the norm before any
    clipping.
    """
    key = ("norm", float(norm_type))
    norm = shared.get(key)
    if norm is None:
        norm = shared[key] = total_norm(parameters, norm_type)
    return norm


def total_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The total ``norm_type``-norm of the parameters' gradients, as ``clip_grad_norm_`` computes it (0 without any)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norms = torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads])
    return torch.linalg.vector_norm(norms, norm_type)


class GradientClipping:
    """Clip gradients by total norm or by value, once per optimizer step.

    Attached to ``TBPTTEvents.OPTIMIZER_STEP_STARTED`` by default, it runs after the accumulated windows'
    gradients are summed, normalised by their target count and unscaled by the ``GradScaler``, and before
    ``optimizer.step()``: the place where a hand-written loop calls ``clip_grad_norm_``. It records the norm
    before clipping in ``engine.state.grad_norm`` (a 0-dim tensor). On a step whose gradients hold inf or NaN
    (which the ``GradScaler`` will skip) the gradients are left as they are, so no clipping turns an overflow
    into a finite step.

    With window programs (``cuda_graphs``), it runs inside the optimizer step's program, captured in its CUDA
    graph on a GPU, where it is the last handler of ``OPTIMIZER_STEP_STARTED`` (or only such handlers follow it):
    its operations never read the device.

    Args:
        parameters: a module, an iterable of parameters, or a callable returning them.
        max_norm: clip so that the total norm is at most ``max_norm`` (``clip_grad_norm_``'s formula).
        norm_type: the norm's order, e.g. ``2.0`` or ``float("inf")``.
        max_value: instead of ``max_norm``, clamp every gradient element to ``[-max_value, max_value]``.

    Raises:
        ValueError: if not exactly one of ``max_norm`` and ``max_value`` is given, or it is not positive.

    Examples:
        .. code-block:: python

            GradientClipping(model, max_norm=1.0).attach(trainer)

            @trainer.on(TBPTTEvents.OPTIMIZER_STEP_COMPLETED(every=100))
            def log(engine):
                print(engine.state.optimizer_step, engine.state.grad_norm.item())
    """

    def __init__(
        self,
        parameters: Parameters,
        max_norm: float | None = None,
        *,
        norm_type: float = 2.0,
        max_value: float | None = None,
    ) -> None:
        if (max_norm is None) == (max_value is None):
            raise ValueError("pass exactly one of max_norm (clip by total norm) and max_value (clip by value).")
        limit = max_norm if max_norm is not None else max_value
        if limit is None or not limit > 0:
            raise ValueError(f"the clipping limit must be positive, got {limit!r}.")
        self.parameters = _parameters(parameters)
        self.max_norm, self.norm_type, self.max_value = max_norm, norm_type, max_value

    def __call__(self, engine: Engine) -> None:
        """Clip the gradients of the step about to be taken."""
        params = [p for p in self.parameters() if p.grad is not None]
        norm = gradient_norm(engine, params, self.norm_type)
        if params:
            self._clip([p.grad for p in params if p.grad is not None], norm)

    def device_part(self, engine: Engine, shared: dict) -> torch.Tensor:
        """Inside a step program (``cuda_graphs``): the norm and the clipping, device operations only; the norm.

        The norm is the step's first, computed inside the program (``shared`` holds it for the step's handlers), not
        taken from ``engine.state``: a captured step reads nothing the host made for one step only.
        """
        params = [p for p in self.parameters() if p.grad is not None]
        norm = step_norm(shared, params, self.norm_type)
        if params:
            self._clip([p.grad for p in params if p.grad is not None], norm)
        return norm

    def host_part(self, engine: Engine, norm: torch.Tensor) -> None:
        """After a step program: ``engine.state.grad_norm`` as :meth:`__call__` leaves it."""
        keep_norm(engine, norm, self.norm_type)

    def _clip(self, grads: list[torch.Tensor], norm: torch.Tensor) -> None:
        finite = torch.isfinite(norm)
        if self.max_norm is not None:
            coef = torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)
            # No host synchronisation: a non-finite norm multiplies by one.
            torch._foreach_mul_(grads, torch.where(finite, coef, torch.ones_like(coef)))
        elif self.max_value is not None:
            for g in grads:
                g.copy_(torch.where(finite, g.clamp(-self.max_value, self.max_value), g))

    def attach(self, engine: Engine, event: object = TBPTTEvents.OPTIMIZER_STEP_STARTED) -> GradientClipping:
        """Run at ``event`` of ``engine``; returns the handler."""
        engine.add_event_handler(event, self)
        return self
