"""A program: a body of tensor operations on static buffers, run eagerly or captured once in a CUDA graph and replayed.

Sweep and step programs (:mod:`~ignite_tbptt.runtime.programs.sweep`, :mod:`~ignite_tbptt.runtime.programs.step`)
are bodies of this kind: they read their inputs from buffers written
before each run and leave their results in tensors read right after it. Uncaptured, a :class:`Program` runs
its body every time, on any device: the same operations on the same buffers, which is how programs are tested on
the CPU. Captured, it runs its body eagerly ``warmup`` times on a side stream (what a captured body needs must exist
before capture: an optimizer's state, cuDNN's workspaces), is captured once, and is replayed after.

Every graph of a trainer shares one memory pool (:class:`GraphCapture`): no two run at once, and each graph's
outputs are read before the next replay, so one graph's temporaries may reuse another's memory. What must outlive a
replay (an inf/NaN decision carried from step to step, an optimizer's state) is allocated outside the pool, before
capture.

Sources: PyTorch's CUDA semantics notes, "CUDA Graphs" (whole-network capture: warm-up on a side stream, static
inputs copied in, outputs read after ``replay()``; "Graph memory management": graphs sharing a pool).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..profiling import NO_CONTEXT
from .cache import ProgramCounts

__all__ = ["GraphCapture", "Program", "GraphCaptureError", "StaticInputs", "copied_out"]


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
        self._side: Any = None
        #: How the programs ran: captures, replays and warm-up runs counted here.
        self.counts = ProgramCounts()
        #: The device the programs' parameters are on (set as they are read): warm-up, capture and replay run with
        #: it current, as a model on ``cuda:1`` needs, whatever device the process has current.
        self.device: torch.device | None = None
        #: Capture with torch's liveness tracker (``torch.cuda.graph(check_input_liveness=True)``, torch >= 2.13):
        #: a replay raises where an input the graph reads was freed since. For tests and debugging: it costs a
        #: check per replay.
        self.check_input_liveness = False

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
            if self._side is None:
                self._side = torch.cuda.Stream()
            self._side.wait_stream(current)
            with torch.cuda.stream(self._side):
                result = body()
            current.wait_stream(self._side)
        return result

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
                with torch.cuda.graph(graph, pool=self._pool, **checked):
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
        self.counts.captures += 1
        return graph, outputs


class Program:
    """``body`` run eagerly every time (``capture`` ``None``), or warmed up, captured once and replayed.

    Args:
        body: the operations, on buffers its owner writes before each run; returns the outputs.
        capture: the trainer's :class:`GraphCapture`, or ``None`` to run uncaptured.
        what: what the body is, for a capture's error.
    """

    __slots__ = ("body", "capture", "what", "runs", "graph", "outputs")

    def __init__(self, body: Callable[[], Any], capture: GraphCapture | None, what: str) -> None:
        self.body, self.capture, self.what = body, capture, what
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
            capture.counts.warmups += 1
            return capture.on_side_stream(self.body), True
        if self.graph is None:
            self.graph, self.outputs = capture.captured(self.body, self.what)
        with capture.on_device():
            self.graph.replay()
        capture.counts.replays += 1
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
