"""One call of the model on a segment: ``model_fn`` under autocast, with the weight hooks where asked."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from operator import attrgetter
from typing import Any

import torch

from ..checks import refusal_of_call
from ..layout import Layout
from . import hidden as hs
from .compiled import retainable
from .in_place import find_write, mentions_in_place, written_leaf
from .module_state import ModuleState
from .reset import default_reset_hidden, reset_to
from .weight_versions import ParameterVersions

# A tensor's version counter, which every in-place write bumps.
_VERSION = attrgetter("_version")

__all__ = ["ModelCall", "build_model_call", "default_model_fn", "autocast_for", "device_type_of"]

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


def autocast_for(
    device_type: str, dtype: torch.dtype | None, cache_enabled: bool = True
) -> Callable[[], AbstractContextManager]:
    """A factory of ``torch.autocast`` contexts for ``dtype``, or of null contexts when ``dtype`` is None.

    ``cache_enabled=False`` for calls captured in CUDA graphs, as PyTorch's notes require.
    """

    def autocast() -> AbstractContextManager:
        if dtype is None:
            return _NO_CONTEXT
        return torch.autocast(device_type, dtype=dtype, cache_enabled=cache_enabled)

    return autocast


class ModelCall:
    """Runs ``model_fn(model, x, hidden)`` for the trainer and checks what it did with the hidden state.

    Args:
        model: the model.
        model_fn: ``model_fn(model, x, hidden) -> (y_pred, hidden)``.
        autocast: a factory of the autocast context the model and the loss run under.
        reset_hidden: ``reset_hidden(hidden, starts) -> hidden``, applied to the input hidden state of a call
            that starts new sequences in some columns (:mod:`ignite_tbptt.runtime.reset`).
        initial_state: ``initial_state(batch_size) -> hidden``, the state at a stream's start and, per column, at
            every sequence start (a learned one: its parameters get the gradient of the windows that reach it), or
            ``None`` for the model's own (``model(x)`` at a stream's start, ``reset_hidden`` at sequence starts).
        layout: the time and batch axes of ``x``; the initial state has one row per column.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]],
        autocast: Callable[[], AbstractContextManager],
        reset_hidden: Callable[[Any, torch.Tensor], Any],
        initial_state: Callable[[int], Any] | None,
        layout: Layout,
    ) -> None:
        self.model, self.model_fn, self.autocast, self.reset_hidden = model, model_fn, autocast, reset_hidden
        self.initial_state, self.layout = initial_state, layout
        #: The state the last call returned (a recomputation's in the backward sweep included), while
        #: :attr:`remembers`: a model may keep its tensors in attributes
        #: (:func:`~ignite_tbptt.runtime.module_state.attributes_with_graph`).
        self.returned: Any = None
        #: Whether calls keep :attr:`returned`; the trainer stops them once it has checked the attributes, so that no
        #: graph is held longer than the stream holds it.
        self.remembers = True
        #: Whether the model and the loss run under autocast: else no context is entered around them.
        self.autocasts = autocast() is not _NO_CONTEXT
        # The call is the model's own, ``model(x, hidden)``: called directly, one Python frame instead of three.
        self._direct = model_fn is default_model_fn and initial_state is None
        self._check_columns = True  # the first state returned, against the batch's columns

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
            TypeError: if ``model_fn`` does not return a pair, or returns a state holding an object the trainer
                cannot see into.
            ValueError: if the hidden state changed structure or shape.
            StateWrittenInPlace: if the model wrote into a tensor of ``hidden`` in place.
        """
        tensors = hs.tensors(hidden)
        counters_before = list(map(_VERSION, tensors))  # no comprehension's frame: once a call
        try:
            if versions is None and not self.autocasts:  # k2 <= k1 without autocast: no context to enter
                if self._direct and hidden is not None and starts is None:
                    output = self.model(x, hidden)
                else:
                    output = self._run(x, hidden, starts)
            else:
                hooks = versions.hooks() if keep_weights and versions is not None else _NO_CONTEXT
                with self.autocast(), hooks, retainable(versions is not None):
                    output = self._run(x, hidden, starts)
        except RuntimeError as error:  # autograd stopped a write into a state tensor that requires grad
            if tensors and mentions_in_place(error):
                found = find_write(lambda state: self.model_fn(self.model, x, state), hidden)
                if found is not None:
                    raise found from error
            raise
        if tensors and list(map(_VERSION, tensors)) != counters_before:
            written = written_leaf(hidden, tensors, counters_before)
            if written is not None:
                raise written
        if not isinstance(output, (tuple, list)) or len(output) != 2:
            raise TypeError(
                "model_fn must return (y_pred, hidden), e.g. an nn.LSTM-based model whose forward returns "
                f"(output, (h, c)); got {type(output).__name__}. Wrap the model or pass model_fn to adapt it; a model "
                "that keeps its state in attributes and returns its outputs alone (snnTorch's neurons with "
                "init_hidden=True) is trained with module_state=['lif1.mem', ...] naming them "
                "(docs/howto/stateful-models.md)."
            )
        y_pred, hidden_out = output
        if hidden is None:  # once per stream: the state's structure is fixed from here on
            hs.check_visible(hidden_out)
            if self._check_columns and isinstance(x, torch.Tensor) and x.dim() >= 2:
                self._check_columns = False
                _check_columns(hidden_out, x, self.layout)
        elif not hs.interchangeable(hidden_out, hidden):
            raise ValueError(
                "the model returned its hidden state in another structure or shape than it was given: "
                f"{hs.signature(hidden)} -> {hs.signature(hidden_out)}. The trainer feeds each segment's hidden "
                "state to the next model call, so model_fn must return it as it takes it (a model that rebuilds "
                "or reshapes its state, or a batch of another size in the same stream, breaks this)."
            )
        if self.remembers:
            self.returned = hidden_out
        return y_pred, hidden_out

    def forget_returned(self) -> None:
        """Stop keeping :attr:`returned`, once the model's attributes are checked: no graph outlives the stream."""
        self.remembers, self.returned = False, None

    @property
    def default_reset(self) -> bool:
        """Whether ``reset_hidden`` is :func:`~ignite_tbptt.runtime.default_reset_hidden`, whose shapes are checked."""
        return self.reset_hidden is default_reset_hidden

    def _run(self, x: torch.Tensor, hidden: Any, starts: torch.Tensor | None) -> Any:
        # The initial state is computed inside the call (and its graph), so that the windows reaching it
        # backpropagate into its parameters, with the weights of this call.
        if hidden is None:
            if self.initial_state is not None:
                hidden = self.initial_state(self.layout.columns(x))
        elif starts is not None:
            if self.initial_state is None:
                hidden = self.reset_hidden(hidden, starts)
            else:
                hidden = reset_to(hidden, starts, self.initial_state(starts.shape[0]))
        return self.model_fn(self.model, x, hidden)


def build_model_call(
    model: torch.nn.Module,
    model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]],
    *,
    device: str | torch.device | None,
    autocast_dtype: torch.dtype | None,
    reset_hidden: Callable[[Any, torch.Tensor], Any],
    module_state: Sequence[str] | None,
    initial_state: Callable[[int], Any] | None,
    layout: Layout,
    cache_casts: bool = True,
) -> ModelCall:
    """The model call of a trainer or an evaluator, from their arguments (documented there).

    ``cache_casts=False`` turns autocast's cache of cast weights off, for calls captured in CUDA graphs.

    Raises:
        TypeError: if ``module_state`` is not a list of paths or ``initial_state`` is not callable; if the model is
            called as ``model(x)`` at a stream's start (the default ``model_fn``, no ``initial_state``) and its
            ``forward`` needs more (PyTorch's word-language-model example: ``forward(input, hidden)``).
        ValueError: if a path of ``module_state`` names no attribute, or both ``initial_state`` and a
            ``reset_hidden`` of one's own are given (the initial state is what a reset restores).
    """
    if initial_state is not None:
        if not callable(initial_state):
            raise TypeError(
                f"initial_state must be callable, initial_state(batch_size) -> hidden (a module holding the learned "
                f"state, say), got {type(initial_state).__name__}."
            )
        if reset_hidden is not default_reset_hidden:
            raise ValueError(
                "pass initial_state or reset_hidden, not both: with initial_state, a column starting a sequence is "
                "reset to its columns of initial_state(batch_size)."
            )
    if model_fn is default_model_fn and initial_state is None:
        _check_first_call(model)
    _check_declared_layout(model, layout)
    if module_state is not None:
        model_fn = ModuleState(model, module_state).wrap(None if model_fn is default_model_fn else model_fn)
    autocast = autocast_for(device_type_of(model, device), autocast_dtype, cache_casts)
    return ModelCall(model, model_fn, autocast, reset_hidden, initial_state, layout)


def _check_first_call(model: torch.nn.Module) -> None:
    # Before anything runs: otherwise the first batch fails inside the model with Python's "missing 1 required
    # positional argument", which does not say that the trainer gives no state at a stream's start.
    if refusal_of_call(model.forward, None) is not None:
        fix = "model.init_hidden(batch_size)" if callable(getattr(model, "init_hidden", None)) else "..."
        raise TypeError(
            f"{type(model).__name__}.forward{inspect.signature(model.forward)} needs more than the input at a "
            f"stream's start, where the trainer calls model(x) (and model(x, hidden) after): pass initial_state=lambda "
            f"batch_size: {fix}, the state to start every stream from, or a model_fn that builds it "
            "(docs/howto/migrating.md)."
        )


_TIME_DIM_FIX = (
    "Batches of shape (B, T, *), batch first, need time_dim=1 (and time_dim=0 is (T, B, *)): docs/howto/sequences.md."
)


def _check_declared_layout(model: torch.nn.Module, layout: Layout) -> None:
    # A recurrent layer that declares batch-first input, given batches the trainer cuts along their first axis:
    # the windows run across the batch instead of along time, and nothing fails.
    if layout.time_dim != 0:
        return
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.RNNBase) and module.batch_first:
            warnings.warn(
                f"model.{name or 'self'} is a {type(module).__name__} with batch_first=True, but time_dim=0: the "
                f"trainer cuts windows along the batches' first axis. {_TIME_DIM_FIX}",
                stacklevel=5,
            )
            return


def _check_columns(hidden: Any, x: torch.Tensor, layout: Layout) -> None:
    # The state holds one row per column: where no floating-point leaf has the batch's number of columns along any
    # axis, the batch's axes are most likely read the wrong way round (batch-first data with time_dim=0).
    leaves = [t for t in hs.flatten(hidden) if t.is_floating_point() and t.dim() > 0]
    columns = layout.columns(x)
    if leaves and not any(columns in t.shape for t in leaves):
        shapes = ", ".join(str(tuple(t.shape)) for t in leaves[:4])
        warnings.warn(
            f"with time_dim={layout.time_dim}, the input of shape {tuple(x.shape)} has {columns} columns and "
            f"{layout.length(x)} steps, but no leaf of the state the model returned has {columns} rows ({shapes}). "
            f"{_TIME_DIM_FIX}",
            stacklevel=2,
        )
