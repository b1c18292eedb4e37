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

Parameters sharded by FSDP2 are saved as their unsharded tensors, which FSDP2 frees after the forward pass and
gathers again, with the current weights, before the backward pass (:mod:`ignite_tbptt.runtime.sharded`). They are
recognised by their storage object, and a version keeps this process's *shard* of each, gathered into the unsharded
weights the first time a retained segment of that version is backpropagated after the step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from .compiled import never_traced
from .sharded import gathered, is_sharded, unsharded_storages

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

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


_UNGATHERED = (
    "a parameter sharded by FSDP2 was used by a module whose forward pass FSDP2 did not run, so it was never gathered: "
    "a model_fn that calls the model's parts (model.embedding(x), its blocks, model.lm_head(h)) bypasses the root "
    "module's forward. Apply fully_shard to every part model_fn calls that holds parameters (the embedding, each "
    "block, the final norm, the head), or call the model itself."
)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _view(storage: torch.UntypedStorage, like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0).set_(storage, like.storage_offset(), like.size(), like.stride())


class WeightVersion:
    """The weights between two optimizer steps: the live parameters until frozen, then copies of them."""

    __slots__ = ("copies", "records", "shards", "unsharded", "__weakref__")

    def __init__(self) -> None:
        self.copies: dict[int, torch.UntypedStorage] | None = None
        self.shards: dict[int, torch.Tensor] = {}  # sharded parameters (by id): this process's shard, once frozen
        self.unsharded: dict[int, torch.Tensor] = {}  # the same gathered, once a retained segment needed them
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
        self.version, self.tensor, self.saved = version, tensor, tensor._version
        self.at_freeze: int | None = None  # the version counter when its weights were frozen
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


class _SavedShard:
    """An unsharded FSDP2 parameter saved by a graph: FSDP2's gathered tensor until frozen, then the version's."""

    __slots__ = ("version", "tensor", "parameter", "frozen")

    def __init__(self, version: WeightVersion, tensor: torch.Tensor, parameter: DTensor) -> None:
        self.version, self.tensor, self.parameter = version, tensor, parameter
        self.frozen: torch.Tensor | None = None

    def unpack(self) -> torch.Tensor:
        v = self.version
        if v.copies is None:
            # FSDP2 gathered the weights again before this backward pass, and no step came in between. Its gather
            # writes into the tensor, so the version counter says nothing here.
            return self.tensor
        if self.frozen is None:
            key = id(self.parameter)
            if key not in v.unsharded:  # one all-gather per parameter and version, on every process alike
                # In the dtype the forward pass used: FSDP2's MixedPrecisionPolicy gathers bfloat16, say.
                v.unsharded[key] = gathered(v.shards[key], self.parameter).to(self.tensor.dtype)
            self.frozen = _view(v.unsharded[key].untyped_storage(), self.tensor)
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

    def __init__(self, parameters: Callable[[], Iterable[torch.Tensor]], model: torch.nn.Module | None = None) -> None:
        self._parameters, self._model = parameters, model
        self._storages: set[int] = set()
        self._unsharded: dict[int, Any] | None = None  # FSDP2 parameters by unsharded storage object, if any
        self._trained_shards: set[int] = set()  # the ids of the optimizer's parameters that FSDP2 sharded
        self.current = WeightVersion()

    def hooks(self) -> AbstractContextManager:
        """Context manager under which the forward pass of retained steps runs."""
        params = [p for p in self._parameters() if p.numel()]
        sharded = self._model is not None and any(is_sharded(p) for p in params)
        self._storages = {_key(p) for p in params if not sharded or not is_sharded(p)}
        # FSDP2 makes the unsharded tensors at its first gather, inside the first forward pass: looked up again then.
        self._trained_shards = {id(p) for p in params if is_sharded(p)} if sharded else set()
        model = self._model
        self._unsharded = unsharded_storages(model, self._trained_shards) if model is not None and sharded else None
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
            if not p.numel():
                continue
            if is_sharded(p):  # this process's shard: 1 / world size of the weights
                v.shards[id(p)] = p.to_local().clone()
            elif _key(p) not in v.copies:
                v.copies[_key(p)] = p.untyped_storage().clone()
        self.current = WeightVersion()

    def values(self, version: WeightVersion) -> list[torch.Tensor]:
        """The parameters' values in ``version``, in ``parameters()`` order (views, not copies)."""
        params = list(self._parameters())
        if version.copies is None:
            return [p.detach() for p in params]
        return [_value(version.copies, version.shards, p) for p in params]

    def _pack(self, tensor: torch.Tensor) -> _SavedParameter | _SavedShard | tuple[torch.Tensor, int]:
        # detach(): the record must not hold the tensor's grad_fn, or an output saved by its own node forms a
        # reference cycle through C++ that Python's collector cannot break. The alias shares the version counter.
        if self._unsharded is not None and is_sharded(tensor):
            raise RuntimeError(_UNGATHERED)
        alias = tensor.detach()
        if _key(tensor) in self._storages:
            return _SavedParameter(self.current, alias)
        if self._unsharded is not None:
            storage = tensor.untyped_storage()._cdata
            model = self._model  # not None: hooks() sets _unsharded only with a model
            missing = storage not in self._unsharded and len(self._unsharded) < len(self._trained_shards)
            if missing and model is not None:
                self._unsharded = unsharded_storages(model, self._trained_shards)
            if storage in self._unsharded:
                return _SavedShard(self.current, alias, self._unsharded[storage].sharded_param)
        return alias, alias._version  # a plain tuple: activations are most of what is saved


def _value(copies: dict[int, torch.UntypedStorage], shards: dict[int, torch.Tensor], p: torch.Tensor) -> torch.Tensor:
    # A frozen version's value of p: a view into the copy, or (sharded) the kept shard as the parameter's DTensor.
    if not p.numel():
        return p.detach()
    if is_sharded(p):
        from torch.distributed.tensor import DTensor

        shard = shards[id(p)]
        return DTensor.from_local(shard, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
    return _view(copies[_key(p)], p)


def _unpack(saved: _SavedParameter | _SavedShard | tuple[torch.Tensor, int]) -> torch.Tensor:
    if isinstance(saved, tuple):
        tensor, version = saved
        if tensor._version != version:
            raise RuntimeError(_MODIFIED_ACTIVATION.format(saved=version, now=tensor._version))
        return tensor
    return saved.unpack()
