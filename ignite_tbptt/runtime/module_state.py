"""Hidden state that a model keeps in its own attributes, carried by the trainer as if the model returned it.

Spiking neurons (snnTorch's ``init_hidden=True`` keeps ``mem``, ``syn`` and ``spk`` on the neuron), Keras-style
stateful layers and modules that write ``self.h`` keep their state in attributes, and their forward takes none.
Told once where that state lives (``module_state=["lif1.mem", "lif2.mem"]``), the trainer writes the state it
carries into those attributes before each model call and reads them back after it, as a tree ``{"modules":
{path: tensor}, "returned": hidden}`` (``returned`` is whatever ``model_fn`` returns beside the predictions). From
there every rule of SPEC.md applies as to a returned state ("State that is not a fresh returned tree"): carried
across windows and batches, treated as a constant at each cut, reset per column at sequence starts, saved in
checkpoints. After each call the attributes hold detached tensors, so that no graph hangs on the model between
calls. A model that keeps a graph in an attribute the trainer was not told of is found after the first window
(:func:`attributes_with_graph`), unless that attribute holds a tensor of the state the model returned (snnTorch's
neurons with ``init_hidden=False`` keep their returned membrane in ``mem``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import hidden as hs
from .in_place import tensors_with_paths

__all__ = ["ModuleState", "attributes_with_graph", "check_attributes", "check_state_cut", "repoint_caches"]

# What every module holds in its __dict__ (its parameters, buffers, submodules and hooks): never a cache of the state.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))

# module -> {attribute: the value every stream starts from}, for every ModuleState naming the attribute.
_INITIAL: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


class ModuleState:
    """Where a model keeps its hidden state: attributes given by their paths from the model, ``"lif1.mem"``.

    Args:
        model: the model.
        paths: the attributes, each ``"submodule.path.attribute"`` from ``model`` (``"h"`` for ``model.h``).

    Raises:
        TypeError: if ``paths`` is not a sequence of strings.
        ValueError: if a path names no submodule or no attribute.
    """

    def __init__(self, model: torch.nn.Module, paths: Sequence[str]) -> None:
        if isinstance(paths, str) or not all(isinstance(p, str) for p in paths):
            raise TypeError(f"module_state must be a list of attribute paths such as ['lif1.mem'], got {paths!r}.")
        self.places: dict[str, tuple[torch.nn.Module, str]] = {}
        for path in paths:
            owner, _, name = path.rpartition(".")
            try:
                module = model.get_submodule(owner)
            except AttributeError:
                raise ValueError(f"module_state: the model has no submodule {owner!r} (in {path!r}).") from None
            if not hasattr(module, name):
                raise ValueError(
                    f"module_state: {type(module).__name__} at {owner or 'the model'!r} has no attribute {name!r} "
                    f"(in {path!r}); create it in the module's __init__ (its value at a stream's start)."
                )
            self.places[path] = (module, name)
        # What a stream starts from: the attributes as the first trainer or evaluator naming them found them, shared
        # by all that name them later (an evaluator built after training must not start from training's last state).
        self.initial = {}
        for path, (module, name) in self.places.items():
            initial = _INITIAL.setdefault(module, {})
            if name not in initial:
                initial[name] = _detached(getattr(module, name))  # snnTorch: an empty tensor, filled on first use
            self.initial[path] = initial[name]

    def write(self, values: dict[str, Any] | None) -> None:
        """Set the attributes to ``values``, or at a stream's start (``None``) to their initial values.

        The initial value of an attribute is the one it held when the first trainer or evaluator naming it was built.
        """
        values = self.initial if values is None else values
        for path, (module, name) in self.places.items():
            value = values[path]
            # A stream starts from a copy, so that a model writing into its state leaves the initial value intact.
            setattr(module, name, _cloned(value) if values is self.initial else value)

    def read(self) -> dict[str, Any]:
        """The attributes' values, ``{path: value}``."""
        return {path: getattr(module, name) for path, (module, name) in self.places.items()}

    def wrap(self, model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]] | None) -> Callable:
        """A ``model_fn`` that carries the attributes in the state, around ``model_fn`` (default: ``model(x)``).

        The wrapped ``model_fn(model, x, hidden)`` returns ``(y_pred, hidden)`` where ``hidden`` is the model's own
        returned state, or ``None`` for a model that keeps all of it in attributes.
        """
        inner = model_fn if model_fn is not None else _predictions_only

        def call(model: torch.nn.Module, x: Any, hidden: Any) -> tuple[Any, dict[str, Any]]:
            self.write(None if hidden is None else hidden["modules"])
            y_pred, returned = inner(model, x, None if hidden is None else hidden["returned"])
            modules = self.read()
            self.write({path: _detached(value) for path, value in modules.items()})
            return y_pred, {"modules": modules, "returned": returned}

        return call


def _cloned(value: Any) -> Any:
    return pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, value)


def _predictions_only(model: torch.nn.Module, x: Any, hidden: Any) -> tuple[Any, None]:
    # A model whose state lives in its attributes: forward(x) returns the predictions alone.
    return model(x), None


def _detached(value: Any) -> Any:
    return hs.detached(value)  # a tensor, or a tree of them (an LSTM's (h, c) kept in one attribute)


def attributes_with_graph(model: torch.nn.Module, known: Sequence[str] = (), returned: Any = None) -> list[str]:
    """Paths of the tensors held in ``model``'s attributes (buffers too, not parameters) that carry a graph.

    An attribute may hold a tensor, or a tuple, list or dict of them (an LSTM's ``(h, c)``). Such a tensor is
    hidden state the trainer does not see (it would be neither cut nor reset nor saved), or a tensor the model kept
    by mistake, unless it is a cache of the returned state: the very tensor object (identity,
    not equal values) that is a leaf of ``returned``. snnTorch's neurons built with ``init_hidden=False`` keep the
    membrane they return in ``self.mem``, and a model may keep ``self.last_h = h`` beside returning ``h``. Such a
    cache is safe: the trainer carries, cuts, resets and saves that tensor through the returned tree, and hands each
    call a detached copy of it, so the attribute's graph spans the last model call only, and the next call
    overwrites the attribute. A copy of the state, a function of it or any tensor the returned tree does not hold
    is not a cache. A model that reads the cache back instead of the state it is given is refused by
    :func:`check_state_cut`.

    Args:
        model: the model.
        known: paths to leave out.
        returned: the hidden state the model last returned, a tensor or a tree of them (the stream's hidden
            state; with ``module_state``, the carried tree, which holds it under ``"returned"``). ``None``: no
            attribute is a cache.

    Returns:
        The paths, such as ``"lif1.mem"`` or ``"cell.last[0]"``, in the order of ``model.named_modules()``.
    """
    cached = {id(t) for t in hs.flatten(returned)}  # ``returned`` keeps its tensors alive, so their ids are theirs
    found = []
    for prefix, module in model.named_modules():
        for _, name, value in _held(module):
            path = f"{prefix}.{name}" if prefix else name
            if path in known:
                continue
            if torch.is_tensor(value):
                if value.grad_fn is not None and id(value) not in cached:
                    found.append(path)
            else:  # a tree of them, an LSTM's (h, c) say
                for key, leaf in pytree.tree_flatten_with_path(value)[0]:
                    if torch.is_tensor(leaf) and leaf.grad_fn is not None and id(leaf) not in cached:
                        found.append(path + pytree.keystr(key))
    return found


def _held(module: torch.nn.Module) -> Iterator[tuple[dict, str, Any]]:
    # (where, name, value) for each attribute of `module` that may hold state: a tensor, or a tuple, list or dict
    # (of tensors, perhaps), in its __dict__ or its buffers; not its parameters, submodules or hooks.
    for where in (vars(module), module._buffers):
        for name, value in list(where.items()):  # a copy: repoint_caches() writes values back as it goes
            if torch.is_tensor(value) or isinstance(value, (tuple, list, dict)) and name not in _MODULE_INTERNALS:
                yield where, name, value


def repoint_caches(model: torch.nn.Module, old: Any, new: Any) -> None:
    """Point the attributes that cache a tensor of the state ``old`` at the same leaf of ``new``.

    Where the trainer replaces the state it carries outside a model call (by a detached copy, before a window runs
    as a CUDA-graph program, and after each run that captures one), a cache left holding the old tensor would keep
    that call's graph alive, and with it the parameters' AccumulateGrad nodes of the stream it ran on. An attribute
    holding a tree of tensors (an LSTM's ``(h, c)``) is rebuilt with the new leaves. Values are written back where
    they were read, the module's ``__dict__`` or its buffers, without the module's ``__setattr__``.

    Args:
        model: the model.
        old: the state as the model returned it, a tensor or a tree of them.
        new: the state that replaces it, of the same structure.
    """
    pairs = [(a, b) for a, b in zip(hs.flatten(old), hs.flatten(new)) if a is not b]
    if not pairs:
        return
    # By the view a tensor is, not only by identity: an attribute may hold its own detached view of a leaf
    # (module_state writes one back after each call).
    swap = {_view(a): b for a, b in pairs}

    def swapped(t: torch.Tensor) -> torch.Tensor:
        return swap.get(_view(t), t)

    for module in model.modules():
        for where, name, value in _held(module):
            if torch.is_tensor(value):
                if _view(value) in swap:
                    where[name] = swap[_view(value)]
            elif any(_view(t) in swap for t in pytree.tree_leaves(value) if torch.is_tensor(t)):
                where[name] = pytree.tree_map_only(torch.Tensor, swapped, value)


def _view(t: torch.Tensor) -> Any:
    # What makes two tensors the same values: their memory, shape, strides, dtype and device; a tensor without memory
    # of its own (empty, sparse) is only itself.
    if t.numel() == 0 or t.layout != torch.strided:
        return id(t)
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.device


def check_attributes(model: torch.nn.Module, returned: Any = None) -> None:
    """Refuse a model that keeps a graph in an attribute after the stream's first window's backward pass.

    Args:
        model: the model.
        returned: the hidden state the model last returned (the stream's); an attribute holding one of its tensors
            is a cache of it and is accepted (:func:`attributes_with_graph`).

    Raises:
        RuntimeError: naming the attributes, with the fix: tell the trainer (``module_state``), or detach them.
    """
    found = attributes_with_graph(model, returned=returned)
    if found:
        raise RuntimeError(
            f"after the first window the model still holds tensors with a graph in {', '.join(found)}. If they are its "
            "hidden state, the trainer does not see it: it would neither cut it at a window's cut, nor reset it at a "
            f"sequence start, nor save it, and the graph would grow across windows. Pass module_state={found!r} to "
            "the trainer (and the evaluator); if they are not state, store them detached "
            "(docs/howto/stateful-models.md)."
        )


def check_state_cut(returned: Any, previous: Any, limit: int = 100_000) -> None:
    """Refuse a model call whose returned state's graph reaches the state the call before it returned.

    The trainer hands each call a detached copy of the state the previous call returned, so a model that reads its
    state from its argument returns a state whose graph starts at that copy. One that reads it from elsewhere (an
    attribute caching the last state, snnTorch's ``self.mem`` when called without ``mem``) chains every call onto the
    last: the graph grows across windows, and the cuts, resets and checkpoints the trainer applies to the state it
    carries never reach the state the model uses. Checked once, at the first call whose given state came with a
    graph (the stream's second call, :func:`~ignite_tbptt.runtime.hidden.has_graph`): a traversal of that call's graph.

    Args:
        returned: the state the call returned, a tensor or a tree of them.
        previous: the state the call before it returned (the one the trainer handed on, detached).
        limit: the most graph nodes to visit.

    Raises:
        RuntimeError: naming the returned state's leaf whose graph reaches the earlier state, and the fix.
    """
    earlier = {t.grad_fn for t in hs.flatten(previous) if t.grad_fn is not None}
    seen: set = set()  # one graph, walked once whatever the number of leaves
    for path, tensor in tensors_with_paths(returned):
        pending = [tensor.grad_fn]
        while pending and len(seen) < limit:
            node = pending.pop()
            if node is None or node in seen:
                continue
            if node in earlier:
                raise RuntimeError(
                    f"the hidden state the model returned ({path}) has a graph reaching the state it returned one call "
                    "before: the model reads its state from somewhere else than the state it is given (an attribute "
                    "that caches it, say), so its graph grows across windows and the trainer's cuts and resets never "
                    "reach it. Pass the state it is given on to every layer (snnTorch: lif(x, mem), not lif(x)), "
                    "or keep the state in attributes and name them with module_state (docs/howto/stateful-models.md)."
                )
            seen.add(node)
            pending.extend(next_node for next_node, _ in node.next_functions)
