"""Hidden states and predictions as trees of tensors, via ``torch.utils._pytree``.

A state may be a tensor or any nesting of tuples, lists, dicts, namedtuples and dataclasses of tensors (leaves that
are not floating point, counters or masks, are carried but never differentiated). A segment's input hidden state
is a fresh leaf, detached from the segment before it, so that each segment's graph ends at its own boundary; the
backward sweep carries gradients across boundaries by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = [
    "flatten",
    "tensors",
    "unflatten",
    "as_leaves",
    "detached",
    "signature",
    "interchangeable",
    "cat",
    "check_visible",
]

# Leaves the trainer carries as they are: no tensor inside to detach, reset or save.
_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, torch.dtype, torch.device)


def flatten(tree: Any) -> list[torch.Tensor]:
    """Tensors of ``tree`` in a fixed traversal order (the order ``unflatten`` fills them back)."""
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def tensors(tree: Any) -> tuple[torch.Tensor, ...] | list[torch.Tensor]:
    """:func:`flatten`, with the shortest path for a tensor or a tuple of tensors (once per model call)."""
    if tree is None:
        return ()
    plain = _plain(tree)
    return plain if plain is not None else flatten(tree)


def check_visible(tree: Any) -> None:
    """Check that the trainer sees every tensor of the state ``tree``; dataclasses become tree nodes on first sight.

    Raises:
        TypeError: naming the path and type of a leaf that is neither a tensor nor a plain value (an object the
            trainer could not detach at a cut, reset at a sequence start or save in a checkpoint).
    """
    if _plain(tree) is not None:
        return
    for path, leaf in pytree.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, (torch.Tensor, *_PLAIN_LEAVES)):
            continue
        if dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            pytree.register_dataclass(type(leaf))
            return check_visible(tree)  # its fields are seen now
        raise TypeError(
            f"the hidden state holds a {type(leaf).__module__}.{type(leaf).__qualname__} at "
            f"state{pytree.keystr(path)}, which the trainer cannot see into: it could not detach it at a cut, reset "
            "it at a sequence start or save it in a checkpoint. Return the state as tensors in tuples, lists, dicts, "
            "namedtuples or dataclasses, or register the class with torch.utils._pytree.register_pytree_node "
            "(docs/howto/stateful-models.md); check_model(model, x) then checks the rest of what TBPTT needs of it."
        )


def unflatten(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """A copy of ``tree``'s nesting with its tensors replaced, in order, by ``tensors``."""
    it = iter(tensors)
    return pytree.tree_map_only(torch.Tensor, lambda _: next(it), tree)


def as_leaves(tree: Any, requires_grad: bool) -> tuple[Any, list[torch.Tensor]]:
    """Detached copy of ``tree`` whose floating-point tensors are leaves that may require grad.

    Returns:
        The new tree and its tensors in ``flatten`` order.
    """
    if isinstance(tree, torch.Tensor):  # nn.RNN and nn.GRU: one model call each, so the shortest path
        t = _leaf(tree, requires_grad)
        return t, [t]
    plain = _plain(tree)
    if plain is not None:
        leaves = [_leaf(t, requires_grad) for t in plain]
        return tuple(leaves), leaves
    new = pytree.tree_map_only(torch.Tensor, lambda t: _leaf(t, requires_grad), tree)
    return new, flatten(new)


def _leaf(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    t = t.detach()
    return t.requires_grad_() if requires_grad and (t.is_floating_point() or t.is_complex()) else t


def has_graph(tree: Any) -> bool:
    """Whether some tensor of ``tree`` was computed with a graph (a state an eager call returned, not a loaded one)."""
    return any(t.grad_fn is not None for t in tensors(tree))


def detached(tree: Any) -> Any:
    """``tree`` with every tensor detached from its graph (``None`` stays ``None``), e.g. to save or return it."""
    return pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, tree)


def signature(tree: Any) -> Any:
    """Nesting, shapes and dtypes of ``tree``; equal signatures mean interchangeable hidden states."""
    return pytree.tree_map_only(torch.Tensor, lambda t: (tuple(t.shape), t.dtype), tree)


def interchangeable(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` have the same :func:`signature` (checked once per model call, so tensors first)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype
    plain_a, plain_b = _plain(a), _plain(b)
    if plain_a is None or plain_b is None or isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return signature(a) == signature(b)
    return len(plain_a) == len(plain_b) and all(
        s.shape == t.shape and s.dtype == t.dtype for s, t in zip(plain_a, plain_b)
    )


def _plain(tree: Any) -> tuple[torch.Tensor, ...] | None:
    # The hidden states of nn.RNN, nn.GRU and nn.LSTM, a tensor or a tuple of tensors, need no tree walk: the
    # helpers that run once per model call take this shortcut.
    if isinstance(tree, torch.Tensor):
        return (tree,)
    if type(tree) is not tuple:
        return None
    for t in tree:
        if not isinstance(t, torch.Tensor):
            return None
    return tree


def cat(parts: list[Any], dim: int) -> Any:
    """Join same-structured ``parts`` (e.g. the predictions of consecutive segments) along ``dim``."""
    if len(parts) == 1:
        return parts[0]
    return unflatten(parts[0], [torch.cat(ts, dim=dim) for ts in zip(*(flatten(p) for p in parts))])
