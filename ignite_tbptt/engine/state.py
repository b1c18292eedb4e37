"""``TBPTTState``: the attributes a TBPTT trainer keeps in ``engine.state``, typed for the code that reads them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ignite.engine import Engine, State

if TYPE_CHECKING:
    import torch

__all__ = ["TBPTTState", "tbptt_state"]


class TBPTTState(State):
    """ignite's ``State`` with the attributes :class:`~ignite_tbptt.TBPTTProcessFunction` and its handlers set on it.

    ignite's ``State`` takes any attribute; this class only names and types those of a TBPTT trainer, for a type
    checker. It is never instantiated: :func:`tbptt_state` gives an engine's state as one. The counters are
    described by :class:`~ignite_tbptt.TBPTTEvents`, the rest by the code that sets them.
    """

    #: Windows started in the run (:class:`~ignite_tbptt.TBPTTEvents`).
    window: int
    #: Optimizer steps started in the run.
    optimizer_step: int
    #: ``(start, end, cut)`` of the current window, in stream steps, while its handlers run (None before).
    window_bounds: tuple[int, int, int] | None
    #: The current window's mean per-target loss, a detached 0-dim tensor, while its handlers run (None before).
    window_loss: torch.Tensor | None
    #: Targets of the last window, of the last optimizer step and of the run.
    window_targets: int
    step_targets: int
    targets_seen: int
    #: The trainer's ``GradScaler``, where it has one.
    scaler: torch.amp.GradScaler | None
    #: Counts of the programs run under ``cuda_graphs`` (else None).
    programs: Any
    #: Set by handlers: the gradient norm of the step (:func:`~ignite_tbptt.gradient_norm`) and its stamp.
    grad_norm: torch.Tensor
    grad_norm_stamp: tuple[int, float]
    #: Set by :class:`~ignite_tbptt.GradientReach`: the recorded window's reach, lag -> gradient norm, or None.
    gradient_reach: dict[int, float] | None
    #: Set by :class:`~ignite_tbptt.AdaptiveTruncation`: the k2 in use.
    k2: int
    #: Set by the TensorBoard logger's handlers.
    loss_scale: float
    targets_per_second: float
    peak_memory_mib: float


def tbptt_state(engine: Engine) -> TBPTTState:
    """``engine.state``, typed with the attributes of a TBPTT trainer (the same object, not a copy)."""
    return cast(TBPTTState, engine.state)
