"""A model call must not write into the hidden state it was given: such a write is found at once and named.

The trainer keeps the state it hands to a model call: the retained history backpropagates through it, recomputation
runs the call again from it, and checkpoints save it. A model that copies its new state into the old one (xLSTMLarge's
``state[i][j].copy_(new)``, Hugging Face caches' slice assignments) breaks all three, and autograd reports it later
and far away ("one of the variables needed for gradient computation has been modified by an inplace operation", or
"a leaf Variable that requires grad is being used in an in-place operation"). SPEC.md, "In-place writes": the call
is refused with an error that names the leaf. Each call reads one version counter per state tensor before and
after; where autograd stops the call first, the call is run once more under a ``TorchFunctionMode`` that finds the
write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

__all__ = ["StateWrittenInPlace", "written_leaf", "find_write", "mentions_in_place"]

_HOWTO = "docs/howto/stateful-models.md"


class StateWrittenInPlace(RuntimeError):
    """A model call changed, in place, a tensor of the hidden state it was given.

    Args:
        path: the tensor's path in the state tree, e.g. ``state[1][0]`` or ``state['h']``.
        shape: its shape.
    """

    def __init__(self, path: str, shape: tuple[int, ...]) -> None:
        self.path, self.shape, self.where = path, shape, ""
        super().__init__(self._message())

    def locate(self, where: str) -> StateWrittenInPlace:
        """Add where the call ran (its window and segment) to the message; returns ``self``."""
        self.where = f" in {where}"
        self.args = (self._message(),)
        return self

    def _message(self) -> str:
        return (
            f"the model wrote in place into {self.path} of the hidden state it was given (shape {self.shape})"
            f"{self.where}. The trainer keeps that state (the retained history backpropagates through it, "
            "recomputation and checkpoints read it), so the model must return new tensors instead: write "
            "h = h * a + b rather than h.mul_(a).add_(b) or h.copy_(...), or pass a model_fn that calls the model's "
            f"parts and returns a fresh state ({_HOWTO}); check_model(model, x) then checks the rest of what TBPTT "
            "needs of it."
        )


def tensors_with_paths(tree: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors of ``tree`` with their paths, ``state[1][0]``, in ``flatten`` order."""
    leaves, _ = pytree.tree_flatten_with_path(tree)
    return [(f"state{pytree.keystr(path)}", t) for path, t in leaves if isinstance(t, torch.Tensor)]


def written_leaf(tree: Any, tensors: Sequence[torch.Tensor], versions: list[int]) -> StateWrittenInPlace | None:
    """The error for the first of ``tensors`` (``tree``'s, in ``flatten`` order) whose version moved, if any."""
    for t, version in zip(tensors, versions):
        if t._version != version:
            for path, leaf in tensors_with_paths(tree):
                if leaf is t:
                    return StateWrittenInPlace(path, tuple(t.shape))
    return None


def mentions_in_place(error: BaseException) -> bool:
    """Whether autograd's ``error`` is about an in-place operation (on a leaf, or on a saved tensor)."""
    text = str(error)
    return "in-place operation" in text or "inplace operation" in text


class _WatchWrites(TorchFunctionMode):
    """Raises :class:`StateWrittenInPlace` at the first in-place operation on a watched tensor's storage."""

    def __init__(self, watched: list[tuple[str, torch.Tensor]]) -> None:
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr(): (path, t) for path, t in watched if t.numel()}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        writes = (
            name == "__setitem__"
            or (name.startswith("__i") and name.endswith("__") and name != "__index__")  # h += x
            or (name.endswith("_") and not name.startswith("_") and name != "requires_grad_")  # copy_, add_
        )
        target = kwargs.get("out", args[0] if args and writes else None)
        if isinstance(target, torch.Tensor) and target.numel():
            found = self.storages.get(target.untyped_storage().data_ptr())
            if found is not None:
                path, t = found
                raise StateWrittenInPlace(path, tuple(t.shape))
        return func(*args, **kwargs)


def find_write(call: Callable[[Any], Any], state: Any) -> StateWrittenInPlace | None:
    """Run ``call(state)`` once more without a graph, watching ``state``'s tensors; the error for a write, if any.

    Only for a call that autograd already stopped: the model runs a second time (its random draws and any attributes
    it sets move on), which matters no more once the run is refused.
    """
    try:
        with torch.no_grad(), _WatchWrites(tensors_with_paths(state)):
            call(state)
    except StateWrittenInPlace as error:
        return error
    except Exception:  # noqa: BLE001 - whatever else fails in the replay, the first error stands
        return None
    return None
