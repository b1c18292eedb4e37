"""Save and restore a TBPTT stream mid-epoch, retained history included.

Autograd graphs cannot be saved, so a checkpoint holds what rebuilds them: for each retained segment its
input, its input hidden state, the random state its forward pass started from, its owed loss gradient, and
the weights it ran with (one copy per optimizer step still reached by the history, at most
``ceil((k2 - k1) / (k1 * gradient_accumulation_steps)) + 1``). Restoring re-runs those forward passes with
those weights, under the same saved-tensor hooks as in training, which on a deterministic device gives the
graphs of the uninterrupted run bit for bit: resuming does not change the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import hidden as hs
from .history import Replay, Segment

if TYPE_CHECKING:
    from .trainer import TBPTTStep

__all__ = ["snapshot", "restore", "load_weights"]


def _detached(tree: Any) -> Any:
    return None if tree is None else hs.as_leaves(tree, False)[0]


def snapshot(step: TBPTTStep) -> dict[str, Any]:
    """The stream state of ``step`` as plain tensors and numbers (what ``TBPTTStep.state_dict`` returns)."""
    versions: list[Any] = []
    for segment in step.history.segments:
        version = segment.replay.version
        if version is not None and all(version is not v for v in versions):
            versions.append(version)
    segments = []
    for segment in step.history.segments:
        replay = segment.replay
        segments.append(
            {
                "start": segment.start,
                "end": segment.end,
                "x": replay.x,
                "hidden": _detached(replay.hidden),
                "hidden_requires_grad": replay.hidden_grad,
                "rng": replay.rng,
                "version": next((i for i, v in enumerate(versions) if v is replay.version), None),
                "y_grad": segment.y_grad,
            }
        )
    weights = [[t.clone() for t in step.versions.values(v)] for v in versions]
    current = next((i for i, v in enumerate(versions) if not v.frozen), None)
    return {
        "position": step.position,
        "streams": step.streams,
        "hidden": _detached(step.hidden),
        "window": step.window,
        "window_loss": step.window_loss,
        "window_targets": step.window_targets,
        "group_windows": step.group_windows,
        "group_targets": step.group_targets,
        "grads": [None if p.grad is None else p.grad.clone() for p in step.parameters()],
        "segments": segments,
        "weights": weights,
        "current_weights": current,
        "scaler": step.scaler.state_dict() if step.scaler is not None else None,
    }


def restore(step: TBPTTStep, state: dict[str, Any]) -> None:
    """Put ``step`` back into ``state`` (from :func:`snapshot`), rebuilding the retained graphs.

    Call it once the model and the optimizer hold the checkpoint's values: the parameters are borrowed for
    the rebuild (older weights are copied in and out again) and end as they were.
    """
    step.reset_stream()
    step.reset_accumulation()
    step.position, step.hidden, step.window = state["position"], state["hidden"], state["window"]
    step.streams = state["streams"]
    step.window_loss, step.window_targets = state["window_loss"], state["window_targets"]
    step.group_windows, step.group_targets = state["group_windows"], state["group_targets"]
    params = step.parameters()
    if len(state["grads"]) != len(params):
        raise ValueError(
            f"the checkpoint's TBPTT state has gradients for {len(state['grads'])} parameters, the optimizer "
            f"holds {len(params)}: load it into a trainer built with the same model and optimizer."
        )
    for p, g in zip(params, state["grads"]):
        p.grad = None if g is None else g.to(p.device)
    if step.scaler is not None and state["scaler"] is not None:
        step.scaler.load_state_dict(state["scaler"])
    if state["segments"]:
        _rebuild(step, state)


def _rebuild(step: TBPTTStep, state: dict[str, Any]) -> None:
    params = step.parameters()
    current = [p.detach().clone() for p in params]
    loaded = state["current_weights"]  # the live parameters are the current weights
    step.model.train()
    for saved in state["segments"]:
        version = saved["version"]
        if version != loaded:
            if loaded is not None:
                step.versions.freeze()
            load_weights(params, state["weights"][version])
            loaded = version
        kept = step.versions is not None
        version = step.versions.current if kept else None
        replay = Replay(saved["x"], saved["hidden"], saved["rng"], version, saved["hidden_requires_grad"])
        if step.recompute is not None:  # recomputation mode rebuilds graphs in the backward sweep anyway
            segment = Segment(saved["start"], saved["end"], [], None, None, saved["y_grad"], replay)
        else:
            inputs, y_pred, hidden_out = step.replay(replay, kept)
            owed = hs.flatten(y_pred) if saved["y_grad"] is not None else None
            segment = Segment(
                saved["start"], saved["end"], inputs, hs.flatten(hidden_out), owed, saved["y_grad"], replay
            )
        step.history.append(segment)
    if loaded != state["current_weights"]:
        step.versions.freeze()
        load_weights(params, current)


@torch.no_grad()
def load_weights(params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    """Copy ``values`` into ``params`` in place (both in the optimizer's parameter order)."""
    for p, v in zip(params, values):
        p.copy_(v)
