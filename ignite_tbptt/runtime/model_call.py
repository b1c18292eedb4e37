"""One call of the model on a segment: ``model_fn`` under autocast, with the weight hooks where asked."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from . import hidden as hs
from .compiled import retainable
from .reset import default_reset_hidden
from .weight_versions import ParameterVersions

__all__ = ["ModelCall", "default_model_fn", "autocast_for", "device_type_of"]

# Reentrant and stateless: one instance serves every model call that needs no context, without an allocation.
_NO_CONTEXT = nullcontext()


def default_model_fn(model: torch.nn.Module, x: torch.Tensor, hidden: Any) -> tuple[Any, Any]:
    """Call ``model`` the way ignite's ``create_supervised_tbptt_trainer`` does.

    ``model(x)`` for the first segment of a stream (``hidden`` is ``None``), ``model(x, hidden)`` after it.
    """
    return model(x) if hidden is None else model(x, hidden)


def device_type_of(model: torch.nn.Module, device: str | torch.device | None) -> str:
    """The device type batches go to: ``device``'s, else that of the model's parameters (``"cpu"`` if none)."""
    if device is not None:
        return torch.device(device).type
    return next((p.device.type for p in model.parameters()), "cpu")


def autocast_for(device_type: str, dtype: torch.dtype | None) -> Callable[[], AbstractContextManager]:
    """A factory of ``torch.autocast`` contexts for ``dtype``, or of null contexts when ``dtype`` is None."""

    def autocast() -> AbstractContextManager:
        return torch.autocast(device_type, dtype=dtype) if dtype is not None else _NO_CONTEXT

    return autocast


class ModelCall:
    """Runs ``model_fn(model, x, hidden)`` for the trainer and checks that it returned ``(y_pred, hidden)``.

    Args:
        model: the model.
        model_fn: ``model_fn(model, x, hidden) -> (y_pred, hidden)``.
        autocast: a factory of the autocast context the model and the loss run under.
        reset_hidden: ``reset_hidden(hidden, starts) -> hidden``, applied to the input hidden state of a call
            that starts new sequences in some columns (:mod:`ignite_tbptt.data.batch`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]],
        autocast: Callable[[], AbstractContextManager],
        reset_hidden: Callable[[Any, torch.Tensor], Any] = default_reset_hidden,
    ) -> None:
        self.model, self.model_fn, self.autocast, self.reset_hidden = model, model_fn, autocast, reset_hidden
        self._plain = autocast() is _NO_CONTEXT  # no context to enter around a call without weight hooks

    def __call__(
        self,
        x: torch.Tensor,
        hidden: Any,
        versions: ParameterVersions | None = None,
        keep_weights: bool = False,
        starts: torch.Tensor | None = None,
    ) -> tuple[Any, Any]:
        """One model call.

        Args:
            x: the segment's input.
            hidden: its input hidden state, or ``None`` at a stream's start.
            versions: the weight versions of a trainer whose graphs outlive optimizer steps (k2 > k1), else
                ``None``; such graphs are kept free of compiled donated buffers (:mod:`ignite_tbptt.runtime.compiled`).
            keep_weights: run under ``versions``' hooks, which keep the call's weights across optimizer steps.
            starts: shape ``(B,)``; if given, the starting columns of ``hidden`` are reset before the call, inside
                the call's graph, so that the gradient reaching ``hidden`` is cut there.

        Raises:
            TypeError: if ``model_fn`` does not return a pair.
            ValueError: if the hidden state changed structure or shape.
        """
        reset = starts is not None and hidden is not None
        if self._plain and versions is None:  # k2 <= k1 without autocast: no context to enter
            output = self.model_fn(self.model, x, self.reset_hidden(hidden, starts) if reset else hidden)
        else:
            hooks = versions.hooks() if keep_weights else _NO_CONTEXT
            with self.autocast(), hooks, retainable(versions is not None):
                output = self.model_fn(self.model, x, self.reset_hidden(hidden, starts) if reset else hidden)
        if not isinstance(output, (tuple, list)) or len(output) != 2:
            raise TypeError(
                "model_fn must return (y_pred, hidden), e.g. an nn.LSTM-based model whose forward returns "
                f"(output, (h, c)); got {type(output).__name__}. Wrap the model or pass model_fn to adapt it."
            )
        y_pred, hidden_out = output
        if hidden is not None and not hs.interchangeable(hidden_out, hidden):
            raise ValueError(
                "the model returned its hidden state in another structure or shape than it was given: "
                f"{hs.signature(hidden)} -> {hs.signature(hidden_out)}. The trainer feeds each segment's hidden "
                "state to the next model call, so model_fn must return it as it takes it (a model that rebuilds "
                "or reshapes its state, or a batch of another size in the same stream, breaks this)."
            )
        return y_pred, hidden_out
