"""Keep the weights that retained history was computed with across optimizer steps.

With k2 > k1 a window's backward pass reaches into steps that ran before the last optimizer step. Their
graphs saved the parameters they used, and ``optimizer.step()`` updates those parameters in place. Autograd
would refuse to backpropagate ("modified by an inplace operation"); copying the weights on every forward
would waste memory. Instead, the forward pass of such steps runs under ``saved_tensors_hooks`` that mark every
saved tensor living in a parameter's storage, and just before an optimizer step the storages marked since the
previous step are copied once. Backward then reads the copy: the gradient of the weights each step was
computed with, as SPEC.md requires.

Saved parameters are matched by *storage*, not identity, because graphs often save views (a linear layer
saves ``weight.t()``; cuDNN's RNN saves its flat weight buffer). And since hooks switch off autograd's own
version check, every saved tensor carries its version and is checked again on unpacking, so an in-place
change nobody announced still raises instead of giving silently wrong gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import torch
from torch.autograd.graph import saved_tensors_hooks

__all__ = ["ParameterVersions"]

_MODIFIED = (
    "a tensor saved for the retained backward history was modified in place (version {saved} -> {now}). "
    "Do not change parameters in place between optimizer steps of a TBPTT trainer with k2 > k1, or use k2 <= k1."
)


class _Version:
    """Parameter storages seen between two optimizer steps, and their copies once a step is taken."""

    __slots__ = ("aliases", "copies", "frozen_versions")

    def __init__(self) -> None:
        self.aliases: dict[int, torch.Tensor] = {}
        self.copies: dict[int, torch.UntypedStorage] | None = None
        self.frozen_versions: dict[int, int] = {}


class _SavedParameter:
    __slots__ = ("version", "key", "tensor", "saved")

    def __init__(self, version: _Version, key: int, tensor: torch.Tensor) -> None:
        self.version, self.key, self.tensor, self.saved = version, key, tensor, tensor._version

    def unpack(self) -> torch.Tensor:
        v, t = self.version, self.tensor
        if v.copies is None:
            now = t._version
            source = t
        else:
            now = v.frozen_versions[self.key]
            source = t.new_empty(0).set_(v.copies[self.key], t.storage_offset(), t.size(), t.stride())
        if now != self.saved:
            raise RuntimeError(_MODIFIED.format(saved=self.saved, now=now))
        return source


class _SavedTensor:
    __slots__ = ("tensor", "saved")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.saved = tensor, tensor._version

    def unpack(self) -> torch.Tensor:
        if self.tensor._version != self.saved:
            raise RuntimeError(_MODIFIED.format(saved=self.saved, now=self.tensor._version))
        return self.tensor


class ParameterVersions:
    """Saved-tensor hooks that let retained graphs outlive in-place optimizer steps.

    Args:
        parameters: a callable returning the parameters an optimizer may update (read on every ``hooks()``
            so that moving the model to another device is followed).

    Examples:
        >>> lin = torch.nn.Linear(1, 1, bias=False)
        >>> _ = lin.weight.data.fill_(3.0)
        >>> versions = ParameterVersions(lin.parameters)
        >>> x = torch.ones(1, 1, requires_grad=True)
        >>> with versions.hooks():
        ...     out = lin(x).sum()
        >>> versions.freeze()  # right before the optimizer step: the weight is copied once
        >>> with torch.no_grad():
        ...     _ = lin.weight.add_(1.0)  # the optimizer step, in place
        >>> out.backward()  # sees the weight the forward pass used
        >>> x.grad
        tensor([[3.]])
    """

    def __init__(self, parameters: Callable[[], Iterable[torch.Tensor]]) -> None:
        self._parameters = parameters
        self._storages: set[int] = set()
        self._current = _Version()

    def hooks(self) -> AbstractContextManager:
        """Context manager under which the forward pass of retained steps runs."""
        self._storages = {p.untyped_storage().data_ptr() for p in self._parameters() if p.numel()}
        return saved_tensors_hooks(self._pack, _unpack)

    def freeze(self) -> None:
        """Copy the parameter storages saved since the last call; call it right before ``optimizer.step()``."""
        v = self._current
        if v.aliases:
            v.frozen_versions = {key: t._version for key, t in v.aliases.items()}
            v.copies = {key: t.untyped_storage().clone() for key, t in v.aliases.items()}
            v.aliases = {}
            self._current = _Version()

    def _pack(self, tensor: torch.Tensor) -> _SavedParameter | _SavedTensor:
        # detach(): the record must not hold the tensor's grad_fn, or an output saved by its own node forms a
        # reference cycle through C++ that Python's collector cannot break. The alias shares the version counter.
        alias = tensor.detach()
        key = tensor.untyped_storage().data_ptr()
        if key in self._storages:
            self._current.aliases.setdefault(key, alias)
            return _SavedParameter(self._current, key, alias)
        return _SavedTensor(alias)


def _unpack(saved: _SavedParameter | _SavedTensor) -> torch.Tensor:
    return saved.unpack()
