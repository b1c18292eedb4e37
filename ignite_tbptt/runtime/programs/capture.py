"""A program: a body of tensor operations on static buffers, run eagerly or captured once in a CUDA graph and replayed.

Window and step programs (:mod:`~ignite_tbptt.runtime.programs.window`, :mod:`~ignite_tbptt.runtime.programs.step`)
are bodies of this kind: they read their inputs from buffers written before each run and leave their results in
tensors read right after it. Uncaptured, a :class:`Program` runs its body every time, on any device: the same
operations on the same buffers, which is how programs are tested on the CPU. Captured, it runs its body eagerly
``warmup`` times on a side stream (what a captured body needs must exist before capture: an optimizer's state,
cuDNN's workspaces), is captured once, and is replayed after. Warm-up and capture run on streams of the programs'
own device, made for it (torch's default capture stream is made once per process, on whichever device captured
first), and a capture is checked against this thread only (``capture_error_mode="thread_local"``): a data loader's
thread that touches CUDA meanwhile does not invalidate it.

Every graph of a trainer shares one memory pool (:class:`GraphCapture`): no two run at once, and each graph's
outputs are copied out before the next replay, so one graph's temporaries may reuse another's memory (torch vouches
for that only in capture order, and window and step graphs replay in another). What must outlive a replay (an inf/NaN
decision carried from step to step, a split step's decisions between its two graphs, the window's state the model
keeps in attributes, an optimizer's state) is allocated outside the pool, before capture.

A trainer keeps at most a limit of programs (:class:`ProgramCache`), one per shape of window or step: shapes that stop
coming (sequence starts at places that do not recur, a batch length seen once) do not hold their slot, the least
recently used is dropped for a new one and the drop counted. :class:`ProgramCounts` counts how they ran, which a user
reads as ``engine.state.programs`` and :func:`~ignite_tbptt.attach_tensorboard` logs under ``train/programs/``.

Sources: PyTorch's CUDA semantics notes, "CUDA Graphs" (whole-network capture: warm-up on a side stream, static
inputs copied in, outputs read after ``replay()``; "Graph memory management": graphs sharing a pool).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ...planning import EagerReason
from ..profiling import NO_CONTEXT

__all__ = [
    "GraphCapture",
    "Program",
    "GraphCaptureError",
    "StaticInputs",
    "copied_out",
    "ProgramCounts",
    "ProgramCache",
]


class GraphCaptureError(RuntimeError):
    """A program could not be captured in a CUDA graph; the message says why and what to change."""


class GraphCapture:
    """What a trainer's captured programs share: the warm-up count, the side stream and the graphs' memory pool.

    Args:
        warmup: eager runs of a program, on a side stream, before it is captured.
    """

    def __init__(self, warmup: int = 3) -> None:
        self.warmup = warmup
        self._pool: Any = None
        # The warm-up's and the capture's streams, by device: a stream belongs to the device it was made on.
        self._side: dict[Any, Any] = {}
        self._capture: dict[Any, Any] = {}
        #: How the programs ran: captures, replays and warm-up runs counted here.
        self.counts = ProgramCounts()
        #: The device the programs' parameters are on (set as they are read): warm-up, capture and replay run with
        #: it current, as a model on ``cuda:1`` needs, whatever device the process has current.
        self.device: torch.device | None = None
        self._check_input_liveness = False

    @property
    def check_input_liveness(self) -> bool:
        """Capture with torch's liveness tracker (``torch.cuda.graph(check_input_liveness=True)``, torch >= 2.13).

        A replay then raises where an input the graph reads was freed since. For tests and debugging: it costs a check
        per replay.

        Raises:
            RuntimeError: set to True on a torch without the tracker (before 2.13).
        """
        return self._check_input_liveness

    @check_input_liveness.setter
    def check_input_liveness(self, check: bool) -> None:
        if check and "check_input_liveness" not in inspect.signature(torch.cuda.graph).parameters:
            raise RuntimeError(
                "check_input_liveness needs torch 2.13 or later (torch.cuda.graph(check_input_liveness=True)); this "
                f"is torch {torch.__version__}. Upgrade torch, or capture without the check."
            )
        self._check_input_liveness = check

    def on_device(self) -> AbstractContextManager:
        """The programs' CUDA device made current, for a warm-up, a capture or a replay."""
        device = self.device
        if device is None or device.type != "cuda" or device.index is None:
            return NO_CONTEXT
        return torch.cuda.device(device)

    def on_side_stream(self, body: Callable[[], Any]) -> Any:
        """Run ``body`` eagerly on a side stream of the programs' device, as warm-up before capture must."""
        with self.on_device():
            current = torch.cuda.current_stream()
            side = self._stream(self._side)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                result = body()
            current.wait_stream(side)
        return result

    def _stream(self, streams: dict[Any, Any]) -> Any:
        # The current device's stream of ``streams``, made on it the first time (on_device() made it current).
        device = torch.cuda.current_device()
        if device not in streams:
            streams[device] = torch.cuda.Stream()
        return streams[device]

    def captured(self, body: Callable[[], Any], what: str) -> tuple[Any, Any]:
        """Capture ``body`` in a CUDA graph (nothing runs); the graph and its static outputs.

        Raises:
            GraphCaptureError: if ``what`` (the window, the optimizer step) cannot be captured: it reads a value
                back to the host, or makes shapes from data. The message names the fix.
        """
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        try:
            # On the programs' device: capturing on another's stream would record none of their kernels.
            with self.on_device():
                graph = torch.cuda.CUDAGraph()
                checked: dict[str, Any] = {"check_input_liveness": True} if self.check_input_liveness else {}
                stream = self._stream(self._capture)
                with torch.cuda.graph(
                    graph, pool=self._pool, stream=stream, capture_error_mode="thread_local", **checked
                ):
                    outputs = body()
        except RuntimeError as error:
            raise GraphCaptureError(
                f"{what} could not be captured in a CUDA graph ({error}). A captured program may not read a value "
                "back to the host (.item(), float(), a Python condition on a tensor, nonzero() or a shape from data) "
                "in the model, model_fn, loss_fn, target_count_fn or a handler of TBPTTEvents.OPTIMIZER_STEP_STARTED "
                "run inside the step; remove the read, or pass cuda_graphs=False. A failed capture can leave CUDA's "
                "random generator unusable in this process (later random draws fail with 'Offset increment outside "
                "graph capture'): start a new process for the next run."
            ) from error
        return graph, outputs


class Program:
    """``body`` run eagerly every time (``capture`` ``None``), or warmed up, captured once and replayed.

    Args:
        body: the operations, on buffers its owner writes before each run; returns the outputs.
        capture: the trainer's :class:`GraphCapture`, or ``None`` to run uncaptured.
        what: what the body is, for a capture's error.
        kind: what its runs are counted as (:attr:`ProgramCounts.kinds
            <ignite_tbptt.runtime.ProgramCounts.kinds>`): ``"window"`` or ``"step"``.
    """

    __slots__ = ("body", "capture", "what", "kind", "runs", "graph", "outputs")

    def __init__(self, body: Callable[[], Any], capture: GraphCapture | None, what: str, kind: str = "window") -> None:
        self.body, self.capture, self.what, self.kind = body, capture, what, kind
        self.runs = 0  # eager runs so far (warm-up, under capture)
        self.graph: Any = None
        self.outputs: Any = None  # the captured run's static outputs

    def __call__(self) -> tuple[Any, bool]:
        """Run the program once.

        Returns:
            Its outputs, and whether they are fresh tensors (an eager run's) rather than a graph's static ones,
            which the next replay overwrites.

        Raises:
            GraphCaptureError: if the capture fails.
        """
        capture = self.capture
        if capture is None:
            return self.body(), True
        if self.graph is None and self.runs < capture.warmup:
            self.runs += 1
            capture.counts.ran(self.kind, "warmups")
            return capture.on_side_stream(self.body), True
        if self.graph is None:
            self.graph, self.outputs = capture.captured(self.body, self.what)
            capture.counts.ran(self.kind, "captures")
        with capture.on_device():
            self.graph.replay()
        capture.counts.ran(self.kind, "replays")
        return self.outputs, False


class StaticInputs:
    """A program's input buffers, made once and written before each run in one kernel.

    A graph reads the addresses it was captured on, so every run's inputs are copied into the same tensors (PyTorch's
    CUDA semantics notes, "CUDA Graphs": static inputs copied in before each replay).
    """

    __slots__ = ("buffers",)

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []

    def like(self, t: torch.Tensor) -> torch.Tensor:
        """A new input of ``t``'s shape, dtype, device and strides, not requiring grad: the next buffer written."""
        buffer = torch.empty_like(t.detach())
        self.buffers.append(buffer)
        return buffer

    def write(self, sources: list[torch.Tensor]) -> None:
        """Copy ``sources`` in, one per buffer in the order they were added."""
        assert len(sources) == len(self.buffers), "one source per input buffer"
        with torch.no_grad():
            torch._foreach_copy_(self.buffers, sources)


def copied_out(outputs: Any, fresh: bool) -> Any:
    """``outputs`` as a caller may keep them: a graph's static ones (not ``fresh``) cloned, an eager run's as they are.

    The next replay overwrites a graph's outputs, and a handler may keep a window's values.
    """
    return outputs if fresh else pytree.tree_map_only(torch.Tensor, torch.clone, outputs)


@dataclass
class ProgramCounts:
    """How a trainer's programs ran so far (``cuda_graphs``), summed over window and step programs."""

    #: Programs captured (a CUDA graph, or a recording with ``cuda_graphs="recorded"``).
    captures: int = 0
    #: Replays of captured programs.
    replays: int = 0
    #: Eager runs of programs before their capture, as CUDA's warm-up asks.
    warmups: int = 0
    #: Windows that ran eagerly, segment by segment, outside any program (a stream's first, one the batch ends
    #: inside, ...).
    eager_windows: int = 0
    #: Optimizer steps taken eagerly, outside any program (an optimizer that cannot skip on the device, ...).
    eager_steps: int = 0
    #: Programs dropped, least recently used first, to make room for a new one.
    evictions: int = 0
    #: The windows that ran eagerly by reason (:class:`~ignite_tbptt.planning.EagerReason`'s values), and the steps as
    #: ``step/<reason>``, those with any.
    eager: dict[str, int] = field(default_factory=dict)
    #: The warm-ups, captures and replays by kind of program (``"window"``: window programs, ``"step"``:
    #: step programs), those with any: what a run on a GPU certifies is that each kind was captured and replayed.
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)

    def ran(self, kind: str, how: str) -> None:
        """A program of ``kind`` ran ``how`` (``"warmups"``, ``"captures"``, ``"replays"``): counted, and by kind."""
        setattr(self, how, getattr(self, how) + 1)
        by_kind = self.kinds.setdefault(kind, {})
        by_kind[how] = by_kind.get(how, 0) + 1

    def ran_eagerly(self, reason: EagerReason, kind: str = "window") -> None:
        """A window runs segment by segment, or an optimizer step (``kind="step"``) eagerly, for ``reason``."""
        name = reason.value
        if kind == "step":
            self.eager_steps += 1
            name = f"step/{name}"
        else:
            self.eager_windows += 1
        self.eager[name] = self.eager.get(name, 0) + 1

    def as_dict(self) -> dict[str, int]:
        """The counts by name; the reasons as ``eager/<reason>``, the kinds' as ``<kind>/<count>``."""
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("eager", "kinds")}
        by_kind = {f"{kind}/{how}": n for kind, ns in self.kinds.items() for how, n in ns.items()}
        return {**counts, **{f"eager/{reason}": n for reason, n in self.eager.items()}, **by_kind}


class ProgramCache:
    """Programs by key, at most ``limit``; a new one drops the least recently used.

    Args:
        limit: the most programs kept.
        counts: where the drops are counted.
    """

    def __init__(self, limit: int, counts: ProgramCounts) -> None:
        self.limit, self.counts = limit, counts
        self._programs: OrderedDict[Hashable, Any] = OrderedDict()

    def fetch(self, key: Hashable, make: Callable[[], Any], valid: Callable[[Any], bool] | None = None) -> Any:
        """The program of ``key``, now the most recently used; made by ``make()`` where there is none or it is stale.

        ``valid(program)``: whether it is still valid (what it was made for is unchanged). A new program drops the
        least recently used where the cache is full.
        """
        program = self._programs.get(key)
        if program is not None and (valid is None or valid(program)):
            self._programs.move_to_end(key)
            return program
        self._programs.pop(key, None)
        while len(self._programs) >= self.limit:
            self._programs.popitem(last=False)
            self.counts.evictions += 1
        program = self._programs[key] = make()
        return program

    def clear(self) -> None:
        """Forget every program."""
        self._programs.clear()

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._programs)

    def values(self) -> list[Any]:
        """The programs, least recently used first."""
        return list(self._programs.values())
