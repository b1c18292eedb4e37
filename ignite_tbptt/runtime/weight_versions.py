"""Keep the weights that retained history was computed with across optimizer steps.

With k2 > k1 a window's backward pass reaches into steps that ran before the last optimizer step. Their
graphs saved the parameters they used, and ``optimizer.step()`` updates those parameters in place. Autograd
would refuse to backpropagate ("modified by an inplace operation"); copying the weights on every forward
would waste memory. Instead, the forward pass of such steps runs under ``saved_tensors_hooks`` that mark every
saved tensor living in a parameter's storage, and right before an optimizer step the parameters are copied
once (:meth:`ParameterVersions.freeze`). Backward then reads the copy: the gradient of the weights each step
was computed with, as SPEC.md requires. The copy also lets a checkpoint rebuild the retained history.

Saved parameters are matched by *storage*, not identity, because graphs often save views (a linear layer
saves ``weight.t()``; cuDNN's RNN saves its flat weight buffer). And since hooks switch off autograd's own
version check, every saved tensor carries its version and is checked again on unpacking, so an in-place
change nobody announced still raises instead of giving silently wrong gradients.

Why not ``torch.autograd.graph.allow_mutation_on_saved_tensors``, which clones a saved tensor when it is
mutated: its context must enclose the forward pass, the mutation and the backward pass, and it clears its
state on exit, so it would have to stay open for the whole run, around every handler of the engine. While
open, a ``TorchDispatchMode`` intercepts every operation of the process (the optimizer's included), it
cannot be nested, and it clones on *any* in-place change of a saved tensor, so a model bug that changes an
activation in place would silently get the old value instead of an error. Here the copy is made once per
optimizer step, only of parameters, and only while retained history exists.

The hooks run inside the model's forward pass; under ``torch.compile`` they are marked for Dynamo not to
trace (:mod:`ignite_tbptt.runtime.compiled`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import torch
from torch.autograd.graph import saved_tensors_hooks

from .compiled import never_traced

__all__ = ["WeightVersion", "ParameterVersions"]

_MODIFIED_PARAMETER = (
    "a parameter saved for the retained backward history was modified in place (version {saved} -> {now}). "
    "Do not change parameters in place between optimizer steps of a TBPTT trainer with k2 > k1, or use k2 <= k1."
)
_MODIFIED_ACTIVATION = (
    "a tensor saved for the retained backward history, computed by the model or handed to it as its hidden state "
    "(not a parameter), was modified in place (version {saved} -> {now}). A model must not write into tensors it "
    "computed or was given (the state): return new ones (docs/howto/stateful-models.md)."
)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _view(storage: torch.UntypedStorage, like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0).set_(storage, like.storage_offset(), like.size(), like.stride())


class WeightVersion:
    """The weights between two optimizer steps: the live parameters until frozen, then copies of them."""

    __slots__ = ("copies", "records", "__weakref__")

    def __init__(self) -> None:
        self.copies: dict[int, torch.UntypedStorage] | None = None
        # Weak references without callbacks: a WeakSet runs Python in the collector, where a Ctrl-C that lands is
        # printed as "Exception ignored" and lost, so training went on.
        self.records: list[weakref.ref[_SavedParameter]] = []

    @property
    def frozen(self) -> bool:
        """Whether an optimizer step has happened since these weights were used."""
        return self.copies is not None


class _SavedParameter:
    __slots__ = ("version", "tensor", "saved", "at_freeze", "frozen", "__weakref__")

    def __init__(self, version: WeightVersion, tensor: torch.Tensor) -> None:
        self.version, self.tensor, self.saved, self.at_freeze = version, tensor, tensor._version, None
        self.frozen: torch.Tensor | None = None  # the view into the copy, made on the first unpack after freezing
        version.records.append(weakref.ref(self))

    def unpack(self) -> torch.Tensor:
        v, t = self.version, self.tensor
        if v.copies is None:
            if t._version != self.saved:
                raise RuntimeError(_MODIFIED_PARAMETER.format(saved=self.saved, now=t._version))
            return t
        if self.frozen is None:  # a retained segment is unpacked once per window that reaches it
            if self.at_freeze != self.saved:
                raise RuntimeError(_MODIFIED_PARAMETER.format(saved=self.saved, now=self.at_freeze))
            self.frozen = _view(v.copies[_key(t)], t)
        return self.frozen


class ParameterVersions:
    """Saved-tensor hooks that let retained graphs outlive in-place optimizer steps.

    Args:
        parameters: a callable returning the parameters an optimizer may update (read on every call, so
            that moving the model to another device is followed).

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
        self.current = WeightVersion()

    def hooks(self) -> AbstractContextManager:
        """Context manager under which the forward pass of retained steps runs."""
        self._storages = {_key(p) for p in self._parameters() if p.numel()}
        never_traced(ParameterVersions._pack, _unpack, _SavedParameter.__init__, _SavedParameter.unpack, _key, _view)
        return saved_tensors_hooks(self._pack, _unpack)

    def freeze(self) -> None:
        """Copy the parameters for the graphs computed since the last call; call it right before the step."""
        v = self.current
        for ref in v.records:
            record = ref()
            if record is not None:  # the graphs that saved it may be gone
                record.at_freeze = record.tensor._version
        v.records, v.copies = [], {}
        for p in self._parameters():
            if p.numel() and _key(p) not in v.copies:
                v.copies[_key(p)] = p.untyped_storage().clone()
        self.current = WeightVersion()

    def values(self, version: WeightVersion) -> list[torch.Tensor]:
        """The parameters' values in ``version``, in ``parameters()`` order (views, not copies)."""
        params = list(self._parameters())
        if version.copies is None:
            return [p.detach() for p in params]
        return [_view(version.copies[_key(p)], p) if p.numel() else p.detach() for p in params]

    def _pack(self, tensor: torch.Tensor) -> _SavedParameter | tuple[torch.Tensor, int]:
        # detach(): the record must not hold the tensor's grad_fn, or an output saved by its own node forms a
        # reference cycle through C++ that Python's collector cannot break. The alias shares the version counter.
        alias = tensor.detach()
        if _key(tensor) in self._storages:
            return _SavedParameter(self.current, alias)
        return alias, alias._version  # a plain tuple: activations are most of what is saved


def _unpack(saved: _SavedParameter | tuple[torch.Tensor, int]) -> torch.Tensor:
    if type(saved) is tuple:
        tensor, version = saved
        if tensor._version != version:
            raise RuntimeError(_MODIFIED_ACTIVATION.format(saved=version, now=tensor._version))
        return tensor
    return saved.unpack()
