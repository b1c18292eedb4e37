"""Capture's rules on any device: a program recorded operator by operator once, the recording then run without Python.

A CUDA graph replays the kernels its capture recorded, on the addresses it recorded, and nothing else: the Python
that launched them does not run again. A program that is right only because its Python runs every time is wrong
captured, and running it uncaptured (``cuda_graphs="uncaptured"``) cannot show it. Three kinds of fault hide there:

- a read of a device value on the host inside the program (``.item()``, ``int()``, ``bool()``, ``if tensor:``,
  ``nonzero()``, a shape made from data, ``.tolist()``, ``.cpu()``, ``.numpy()``, a copy between devices), which a
  capture refuses;
- a Python value read at capture that changes later (a learning rate, a count): the graph keeps the one it saw;
- a tensor the graph reads that its owner has freed, or moved (``p.data = ...``, an optimizer's state reset): the
  graph reads whatever memory is there now.

:class:`Recorder` (``cuda_graphs="recorded"``) keeps these rules on the CPU. Its warm-up runs the program
eagerly, as a CUDA warm-up does. Its capture runs the program once under a recording
:class:`~torch.utils._python_dispatch.TorchDispatchMode`, which sees every ATen operator, the backward pass's
included, and refuses, naming the operator and the line that called it, what a capture refuses. Each tensor an
operator reads is an internal output (made by an earlier recorded operator, kept by the recording as a graph's
memory pool keeps it) or an external input (made before the capture: a parameter, a static buffer, an optimizer's
state), tracked by its storage as PyTorch's ``_CUDAGraphInputLivenessTracker`` tracks a graph's inputs, and not
kept alive by the recording. A replay runs the recorded operators again, below autograd, on the same tensors, and
writes each result into the tensor the capture made (a graph writes the same addresses): no Python of the program
runs, so a value read at capture stays as captured. An external input freed, moved or resized since the capture is
a :class:`RecordingError` naming it.

A value baked at capture is caught where the program's Python makes it, as ``torch.compile``'s guards catch what its
graphs assumed: every warm-up run after a program's first is outlined (each operator, the shapes and dtypes of its
tensors, its other arguments, the value of each tensor made from host data), and the capture compares its run with
the run before it, operator by operator. An operator, a shape, a Python number or a constant tensor that differs is
a :class:`~ignite_tbptt.runtime.programs.capture.GraphCaptureError` naming the operator and the line, raised before
the capture's run adds anything: a replay would use the capture's value in every later window. A program's first run
is not compared (it may make what later runs find, an optimizer's state say), so the check needs two warm-up runs; the
default has three.

The capture's own run is the program's first run (a CUDA capture runs nothing, and the replay that follows it runs
the program): the first :meth:`RecordedGraph.replay` after a capture runs nothing again. What cannot be seen here:
operators on CPU tensors inside a CUDA program, which a graph does not replay at all (on the CPU every tensor is
such a tensor), and a model whose kernels differ on the GPU (cuDNN's RNNs).

Sources: PyTorch's CUDA semantics notes, "CUDA Graphs" (constraints: no synchronisation with the CPU, static
addresses, "the graph replays the same kernels with the same arguments"); ``torch/utils/_cuda_debug.py`` (torch 2.13:
external inputs against internal outputs, by storage); ``torch/utils/_python_dispatch.py`` (``TorchDispatchMode``).
"""

from __future__ import annotations

import itertools
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .capture import GraphCapture, GraphCaptureError

__all__ = ["Recorder", "RecordedGraph", "RecordingError", "GraphReplayError", "HOST_READS"]

aten = torch.ops.aten

#: Operators that read a device value back to the host, or make a shape from data: a capture refuses them.
HOST_READS: dict[Any, str] = {
    aten._local_scalar_dense: "reads a value back to the host (.item(), int(), float(), bool(), `if tensor:`)",
    aten.is_nonzero: "reads a value back to the host (bool(tensor), `if tensor:`)",
    aten.equal: "reads a value back to the host (torch.equal)",
    aten.nonzero: "makes its shape from data (nonzero(), a boolean mask as an index)",
    aten.masked_select: "makes its shape from data (masked_select, a boolean mask as an index)",
    aten._unique: "makes its shape from data (unique)",
    aten._unique2: "makes its shape from data (unique)",
    aten.unique_dim: "makes its shape from data (unique)",
    aten.unique_consecutive: "makes its shape from data (unique_consecutive)",
    aten.bincount: "makes its shape from data (bincount)",
}
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
_CONSTANTS = {aten.lift_fresh}  # a tensor made from Python data in the program: its value is the capture's
#: Tensor methods that hand a tensor's values to the host without an operator the dispatcher sees on the CPU.
_TO_HOST = {
    torch.Tensor.tolist: "hands its values to the host (.tolist())",
    torch.Tensor.numpy: "hands its values to the host (.numpy())",
    torch.Tensor.cpu: "copies it to the host (.cpu())",
}


class RecordingError(RuntimeError):
    """A recorded program reads a tensor that was freed, moved or resized since its capture."""


@dataclass
class _External:
    """A tensor the program reads that was made before its capture, held by its storage's weak reference."""

    storage: weakref.ref
    pointer: int
    nbytes: int
    what: str
    #: The tensors seen on the storage, by weak reference: one alive on other storage now was moved.
    tensors: list[weakref.ref]

    def check(self, program: str) -> Any:
        """The storage, as it was at capture.

        Raises:
            RecordingError: if it was freed, or moved or resized since.
        """
        storage = self.storage()
        moved = any(t is not None and t.untyped_storage().data_ptr() != self.pointer for t in map(_call, self.tensors))
        if storage is not None and not moved and storage.data_ptr() == self.pointer and storage.nbytes() >= self.nbytes:
            return storage
        if storage is None and not moved:
            raise RecordingError(
                f"{program} reads {self.what}, which was freed since the program was captured: a graph would read "
                "whatever memory is there now. Keep the tensor alive while the program may replay, or make a new "
                "program for the new tensor."
            )
        raise RecordingError(
            f"{program} reads {self.what}, whose memory was moved or resized since the program was captured "
            "(p.data = ..., resize_(), a state reassigned): a graph would read the old addresses. Write into the "
            "tensor in place (copy_), or make a new program for the new tensor."
        )
        return storage


@dataclass
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    outputs: list  # per output: the tensor its result is written into, or None where it aliases an input


@dataclass
class _Outline:
    """What a program's run did, operator by operator: what a capture's run is compared with."""

    #: Each operator and the plain form of its arguments (:func:`_plain`).
    ops: list[tuple[Any, Any]] = field(default_factory=list)
    #: The value of each tensor made from host data (``torch.tensor(...)``), in order.
    constants: list[torch.Tensor] = field(default_factory=list)


def _plain(value: Any) -> Any:
    """An operator's argument as the run's outline keeps it: a tensor by its shape and dtype, a number by its value."""
    if isinstance(value, torch.Tensor):
        return ("a", _shape(value), str(value.dtype).removeprefix("torch."), "tensor")
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, float):
        return ("=", repr(value))  # NaN equal to NaN
    if value is None or isinstance(value, _PLAIN):
        return value
    return ("a", type(value).__name__)  # an object (a profiler's record, a generator): compared by its kind only


_PLAIN = (bool, int, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Outlining(TorchDispatchMode):
    """Runs each operator and outlines it (:class:`_Outline`)."""

    def __init__(self) -> None:
        super().__init__()
        self.outline = _Outline()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        self.outline.ops.append((func, _plain((args, kwargs))))
        if func.overloadpacket in _CONSTANTS:
            self.outline.constants.append(args[0].detach().clone())
        return func(*args, **kwargs)


def _differs(now: Any, before: Any) -> str:
    """How an operator's arguments differ from the run before's, in words."""
    (args, kwargs), (old_args, old_kwargs) = now, before
    named = [*(f"argument {i}" for i in range(len(args))), *(f"argument {k!r}" for k in kwargs)]
    for name, a, b in zip(named, (*args, *kwargs.values()), (*old_args, *old_kwargs.values())):
        if a != b:
            return f"its {name} is {_spoken(a)} where the run before gave {_spoken(b)}"
    return "its arguments differ from the run before's"


def _spoken(plain: Any) -> str:
    if isinstance(plain, tuple) and plain[:1] == ("a",):
        return " ".join(plain)
    return plain[1] if isinstance(plain, tuple) and plain[:1] == ("=",) else repr(plain)


def _shape(t: torch.Tensor) -> str:
    """``t``'s shape as the errors write it: ``4x3``, or ``0-dim``."""
    return "x".join(map(str, t.shape)) or "0-dim"


def _storage(t: torch.Tensor) -> Any:
    return t.untyped_storage()


def _call(reference: weakref.ref) -> Any:
    return reference()


def _caller() -> str:
    """The innermost line of the call stack outside torch and this module: where the program did what it did."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.replace("\\", "/")
        if "/torch/" not in name and not name.endswith(("/recording.py", "/contextlib.py")):
            return f"{frame.filename}:{frame.lineno}" + (f" ({frame.line})" if frame.line else "")
    return "an unknown line"


def _describe(t: torch.Tensor, func: Any, position: int, names: dict[int, str]) -> str:
    name = names.get(_storage(t).data_ptr())
    shape = _shape(t)
    known = f"{name}, " if name else ""
    return f"{known}a {shape} {str(t.dtype).removeprefix('torch.')} tensor (argument {position} of {func})"


class _Recording(TorchDispatchMode):
    """Runs and records each operator; refuses those a capture refuses (:data:`HOST_READS`)."""

    def __init__(self, what: str, names: dict[int, str], before: _Outline | None = None) -> None:
        super().__init__()
        self.what, self.names, self.before = what, names, before
        self._constants = 0  # the constants seen so far, to compare with the run before's
        self.ops: list[_Op] = []
        self.externals: list[_External] = []
        self._external_at: dict[int, int] = {}  # storage pointer -> index in externals
        self._internal: set[int] = set()  # storage pointers of the tensors recorded operators made
        self._uses: dict[tuple, _Use] = {}  # each external input's view, by its storage and geometry

    def _refuse(self, func: Any, why: str) -> None:
        raise GraphCaptureError(
            f"{self.what} could not be captured: {func} {why}, called at {_caller()}. A captured program may not read "
            "a value back to the host or make a shape from data (in the model, model_fn, loss_fn, target_count_fn or "
            "a handler of TBPTTEvents.OPTIMIZER_STEP_STARTED): keep the value on the device (torch.where, a mask "
            "multiplied in), or pass cuda_graphs=False."
        )

    def _baked(self, func: Any, why: str) -> None:
        raise GraphCaptureError(
            f"{self.what} could not be captured: operator {len(self.ops)} of its run, {func}, called at {_caller()}, "
            f"{why}. A replay runs no Python: the value its capture saw would be used in every later window. Pass what "
            "changes between windows as a tensor written before the run (a buffer, a 0-dim tensor updated in place), "
            "keep it fixed, or pass cuda_graphs=False."
        )

    def _compare(self, func: Any, args: tuple, kwargs: dict) -> None:
        # The capture's run against the run before it, operator by operator: what differs would be baked.
        before, i = self.before, len(self.ops)
        assert before is not None, "compared only with an outline"
        if i >= len(before.ops):
            self._baked(func, f"is one more than the run before ran ({len(before.ops)} operators)")
        old_func, old_args = before.ops[i]
        if func is not old_func:
            self._baked(func, f"differs from the run before's operator there, {old_func}")
        plain = _plain((args, kwargs))
        if plain != old_args:
            self._baked(func, _differs(plain, old_args))
        if func.overloadpacket in _CONSTANTS:
            old, self._constants = before.constants[self._constants], self._constants + 1
            if not torch.equal(args[0], old):
                self._baked(
                    func, "makes a tensor from host data (torch.tensor(...)) whose values differ from the run before's"
                )

    def finish(self) -> None:
        """The capture's run is over: it must have run as many operators as the run before.

        Raises:
            GraphCaptureError: if it ran fewer.
        """
        if self.before is not None and len(self.ops) < len(self.before.ops):
            func = self.before.ops[len(self.ops)][0]
            raise GraphCaptureError(
                f"{self.what} could not be captured: its run ended after {len(self.ops)} operators, where the run "
                f"before went on with {func}: a replay would run the capture's course every later window. Pass what "
                "decides the course as a tensor (torch.where), or pass cuda_graphs=False."
            )

    def _check(self, func: Any, args: tuple, kwargs: dict) -> None:
        packet = func.overloadpacket
        why = HOST_READS.get(packet)
        if why is not None:
            self._refuse(func, why)
        if packet is aten._to_copy and "device" in kwargs and args and kwargs["device"] != args[0].device:
            self._refuse(func, f"copies a tensor from {args[0].device} to {kwargs['device']}")
        if packet is aten.copy_ and len(args) > 1 and args[0].device != args[1].device:
            self._refuse(func, f"copies a tensor from {args[1].device} to {args[0].device}")
        if packet in _INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
                self._refuse(func, "makes its shape from data (a boolean mask as an index)")
        if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self._refuse(func, "makes its shape from data (repeat_interleave without output_size)")

    def _argument(self, t: torch.Tensor, func: Any, position: int, constant: bool) -> Any:
        storage = _storage(t)
        pointer = storage.data_ptr()
        if constant or storage.nbytes() == 0 or pointer in self._internal:
            # The recording keeps it, as a graph's pool keeps its own memory, but not its autograd graph: the
            # capture's graph would keep the parameters' AccumulateGrad nodes alive into later windows.
            return t.detach()
        index = self._external_at.get(pointer)
        if index is None:
            index = self._external_at[pointer] = len(self.externals)
            what = _describe(t, func, position, self.names)
            self.externals.append(_External(weakref.ref(storage), pointer, storage.nbytes(), what, []))
        seen = self.externals[index].tensors
        if not any(r() is t for r in seen):
            seen.append(weakref.ref(t))
        # Each use of the storage is its own view of it: its geometry is recorded with the use, and a replay makes
        # each view once however many operators read it.
        key = (index, t.dtype, t.device, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        use = self._uses.get(key)
        if use is None:
            use = self._uses[key] = _Use(len(self._uses), *key)
        return use

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        self._check(func, args, kwargs)
        if self.before is not None:
            self._compare(func, args, kwargs)
        constant = func.overloadpacket in _CONSTANTS
        inputs: set[int] = set()
        position = itertools.count()

        def record(t: torch.Tensor) -> Any:
            inputs.add(_storage(t).data_ptr())
            return self._argument(t, func, next(position), constant)

        recorded_args = pytree.tree_map_only(torch.Tensor, record, args)
        recorded_kwargs = pytree.tree_map_only(torch.Tensor, record, kwargs)
        out = func(*args, **kwargs)
        outputs: list[torch.Tensor | None] = []
        for t in _tensors(out):
            pointer = _storage(t).data_ptr()
            if pointer in inputs or pointer in self._external_at or _storage(t).nbytes() == 0:
                outputs.append(None)  # a view of an input, or an input written in place: the replay writes it
            else:
                self._internal.add(pointer)
                outputs.append(t.detach())
        self.ops.append(_Op(func, recorded_args, recorded_kwargs, outputs))
        return out


class _HostCalls(TorchFunctionMode):
    """Refuses the tensor methods that hand values to the host unseen by the dispatcher (:data:`_TO_HOST`)."""

    def __init__(self, recording: _Recording) -> None:
        super().__init__()
        self.recording = recording

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        why = _TO_HOST.get(func)
        if why is not None:
            self.recording._refuse(func.__name__, why)
        return func(*args, **(kwargs or {}))


@dataclass
class _Use:
    """One view of an external input: its storage seen with this geometry."""

    slot: int  # its place among the recording's views
    index: int  # its storage's place among the externals
    dtype: torch.dtype
    device: torch.device
    offset: int | torch.SymInt  # Tensor.storage_offset(): an int outside symbolic tracing
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def tensor(self, storages: list[Any]) -> torch.Tensor:
        return torch.empty((0,), dtype=self.dtype, device=self.device).set_(
            storages[self.index], self.offset, self.size, self.stride
        )


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):  # most operators: one tensor, no traversal
        return [out]
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


class _Call:
    """A recorded operator made ready to replay: where in its arguments each view goes, found once.

    Searching the arguments for views at every replay cost more than the operators of a small model did.
    """

    def __init__(self, op: _Op) -> None:
        self.func = op.func
        self.outputs = op.outputs if any(t is not None for t in op.outputs) else None
        self.args, self.kwargs = list(op.args), dict(op.kwargs)
        self.slots = [*self._slots(enumerate(op.args)), *self._slots(op.kwargs.items())]

    @staticmethod
    def _slots(items: Any) -> list[tuple[Any, Any]]:
        # (place, view) for a view, (place, [(inner place, view)...]) for a list holding views: aten's arguments
        # nest no deeper (cat's tensors, _foreach_'s lists, index's indices).
        slots: list[tuple[Any, Any]] = []
        for key, value in items:
            if isinstance(value, _Use):
                slots.append((key, value))
            elif isinstance(value, (list, tuple)):
                inner = [(j, v) for j, v in enumerate(value) if isinstance(v, _Use)]
                if any(isinstance(v, (list, tuple, dict)) for v in value):
                    raise NotImplementedError("an operator's arguments nested deeper than a list of tensors")
                if inner:
                    slots.append((key, inner))
        return slots

    def run(self, views: list[torch.Tensor]) -> None:
        # Fresh lists each run: views left in the recorded ones would keep the external inputs alive.
        args, kwargs = self.args.copy(), self.kwargs.copy() if self.kwargs else self.kwargs
        for key, use in self.slots:
            where = args if isinstance(key, int) else kwargs
            if isinstance(use, _Use):
                where[key] = views[use.slot]
            else:
                items = list(where[key])
                for j, inner in use:
                    items[j] = views[inner.slot]
                where[key] = items
        out = self.func(*args, **kwargs)
        if self.outputs is not None:
            for recorded, fresh in zip(self.outputs, _tensors(out)):
                if recorded is not None:
                    recorded.copy_(fresh)


class RecordedGraph:
    """The operators a capture recorded, run again on the same tensors without the program's Python.

    It stands in for a ``torch.cuda.CUDAGraph``: :class:`~ignite_tbptt.runtime.programs.capture.Program` calls
    :meth:`replay` as it calls a graph's.

    Args:
        ops: the recorded operators, in order.
        externals: the external inputs, tracked by their storage.
        what: the program, for errors.
    """

    def __init__(self, ops: list[_Op], externals: list[_External], uses: list[_Use], what: str) -> None:
        self.externals, self.uses, self.what = externals, uses, what
        self._calls = [_Call(op) for op in ops]  # what a replay runs: the recorded operators, made ready once
        self._captured_run = True  # the capture ran the program: the first replay has nothing left to do

    def replay(self) -> None:
        """Run the recorded operators again, writing each result where the capture's result is.

        Raises:
            RecordingError: if an external input was freed, moved or resized since the capture.
        """
        storages = [external.check(self.what) for external in self.externals]  # all, before anything is written
        if self._captured_run:
            self._captured_run = False
            return

        with torch._C._AutoDispatchBelowADInplaceOrView(), torch.no_grad():
            views = [use.tensor(storages) for use in self.uses]
            for call in self._calls:
                call.run(views)


class Recorder(GraphCapture):
    """A :class:`~ignite_tbptt.runtime.programs.capture.GraphCapture` that records on any device (``"recorded"``).

    Args:
        warmup: eager runs of a program before it is captured, as on CUDA.
        names: called at each capture, the names of tensors the trainer knows (parameters, optimizer state), by
            storage pointer, for the errors that name an input; :meth:`name_model` and :meth:`name_optimizer` add more.
    """

    def __init__(self, warmup: int = 3, names: Callable[[], dict[int, str]] | None = None) -> None:
        super().__init__(warmup)
        self._namers = [names] if names is not None else []
        # Each program's body, once it ran: the outline of its last warm-up run after its first.
        self._outlines: weakref.WeakKeyDictionary[Any, _Outline | None] = weakref.WeakKeyDictionary()

    def name_model(self, model: torch.nn.Module) -> None:
        """Name ``model``'s parameters and buffers in the errors that name an input."""
        named = model.named_parameters, model.named_buffers
        self._namers.append(
            lambda: {t.untyped_storage().data_ptr(): f"the model's {n}" for tensors in named for n, t in tensors()}
        )

    def name_optimizer(self, optimizer: Any) -> None:
        """Name ``optimizer``'s state tensors, by parameter and key, in the errors that name an input."""

        def names() -> dict[int, str]:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            return {
                t.untyped_storage().data_ptr(): f"the optimizer's state {k!r} of parameter {i}"
                for i, p in enumerate(params)
                for k, t in optimizer.state.get(p, {}).items()
                if isinstance(t, torch.Tensor)
            }

        self._namers.append(names)

    def on_side_stream(self, body: Callable[[], Any]) -> Any:
        """Run ``body`` eagerly: a warm-up run, on the one stream there is; outlined after the program's first run."""
        if body not in self._outlines:  # its first run: it may make what later runs find
            self._outlines[body] = None
            return body()
        outlining = _Outlining()
        with outlining:
            result = body()
        self._outlines[body] = outlining.outline
        return result

    def captured(self, body: Callable[[], Any], what: str) -> tuple[Any, Any]:
        """Run ``body`` once, recording it; the recorded graph and the outputs it writes.

        Raises:
            GraphCaptureError: if ``body`` reads a value back to the host, makes a shape from data or copies between
                devices; or if its run differs from the outlined warm-up run before it (an operator, a shape, a Python
                number or a tensor made from host data): a value that would be baked at capture.
        """
        before = self._outlines.pop(body, None)
        recording = _Recording(what, {k: v for names in self._namers for k, v in names().items()}, before)
        with _HostCalls(recording), recording:
            outputs = body()
        recording.finish()
        return RecordedGraph(recording.ops, recording.externals, list(recording._uses.values()), what), outputs


#: The name :class:`RecordingError` had before 0.5.
GraphReplayError = RecordingError
