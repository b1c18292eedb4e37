"""Windows run as one program over static buffers, captured once in a CUDA graph and replayed.

Where the model is small, a GPU step is bound by kernel launches: a window of a GRU of 8 units is some fifty
launches of a few microseconds each. A CUDA graph records them once and replays them as one. What a graph can
replay is a window whose whole course is fixed before it runs: at k1 = k2, a window that opens and closes in
one model call, whose loss is backpropagated at once and of which nothing is retained
(:attr:`~ignite_tbptt.planning.SegmentPlan.whole_window` with ``backward_now``), with the hidden-state reset of
columns that start a sequence at its first step as a mask. Each shape of such a window is a
:class:`WindowProgram`: its input, targets, hidden state and reset mask are copied into static buffers, the
model, the loss and the backward pass run on them, and the window's gradients (the graph's outputs) are added into
the parameters' ``.grad`` after each replay as autograd's backward pass would add them. Everything else (the
first window of a stream, windows split by a sequence start, windows of a new shape past the bound) runs eagerly,
and the optimizer step runs eagerly between windows, so handlers, clipping, the inf/NaN check and learning-rate
schedules work as without graphs.

Without capture (``capture=False``, the CPU), a program runs the same operations on the same buffers every
window: it is how the program is tested to give the eager path's parameters bit for bit.

Sources: PyTorch's CUDA semantics notes, "CUDA Graphs" (whole-network capture: warm-up on a side stream, static
inputs copied in, outputs read after ``replay()``, ``torch.autocast(..., cache_enabled=False)`` under capture,
a memory pool shared by graphs that do not run concurrently).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import hidden as hs
from .model_call import ModelCall
from .module_state import recache

__all__ = ["WindowGraphs", "WindowProgram", "GraphCaptureError", "check_graphable"]


class GraphCaptureError(RuntimeError):
    """A window could not be captured in a CUDA graph; the message says why and what to change."""


class WindowProgram:
    """One window shape: forward, loss and backward over static buffers, captured after ``warmup`` runs.

    Args:
        graphs: the :class:`WindowGraphs` it belongs to (model call, loss, scaler, parameters and pool).
        x, y, hidden: the first window's input, targets and input hidden state, which give the buffers' shapes.
        resets: whether the window resets columns at its first step (a ``(B,)`` bool mask buffer).
        backward_mean: the loss is backpropagated as the mean over the window's targets, else as their sum.
    """

    def __init__(
        self, graphs: WindowGraphs, x: torch.Tensor, y: torch.Tensor, hidden: Any, resets: bool, backward_mean: bool
    ) -> None:
        self.graphs = graphs
        self.x, self.y = torch.empty_like(x), torch.empty_like(y)
        self.hidden = [torch.empty_like(t) for t in hs.flatten(hidden)]
        self.tree = hs.unflatten(hidden, self.hidden)  # the state the model is given: the buffers
        self.starts = (
            torch.zeros(x.shape[graphs.model_call.layout.batch_axis(x)], dtype=torch.bool, device=x.device)
            if resets
            else None
        )
        self.backward_mean = backward_mean
        self.targets = y.numel()
        self.runs = 0  # eager runs so far (warm-up, under capture)
        self.graph: Any = None
        self.outputs: tuple | None = None  # the captured run's static outputs, the window's gradients included

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, hidden: Any, starts: torch.Tensor | None
    ) -> tuple[Any, Any, Any]:
        """Run the window on ``x``, ``y`` from ``hidden``, resetting the ``starts`` columns first.

        Returns:
            The window's mean loss, the tensors of its returned hidden state, and its predictions, all detached.
        """
        with torch.no_grad():  # the state arrives with the graph of an eager window
            self.x.copy_(x)
            self.y.copy_(y)
            for buffer, t in zip(self.hidden, hs.flatten(hidden)):
                buffer.copy_(t)
            if self.starts is not None:
                self.starts.copy_(starts)
        graphs = self.graphs
        if not graphs.capture:
            outputs, fresh = self._body(), True
        elif self.graph is None and self.runs < graphs.warmup:
            self.runs += 1
            outputs, fresh = graphs.on_side_stream(self._body), True
        else:
            if self.graph is None:
                self.graph, self.outputs = graphs.captured(self._body)
            self.graph.replay()
            outputs, fresh = self.outputs, False
        mean, hidden_out, y_pred, window_grads = outputs
        graphs.accumulate(window_grads, fresh)
        if fresh:
            return mean, hidden_out, y_pred
        # Fresh tensors: the next replay overwrites the static ones, and a handler may keep a window's values.
        return mean.clone(), [t.clone() for t in hidden_out], pytree.tree_map_only(torch.Tensor, torch.clone, y_pred)

    def _body(self) -> tuple[Any, list[torch.Tensor], Any, tuple]:
        graphs = self.graphs
        y_pred, hidden_out = graphs.model_call(self.x, self.tree, None, False, self.starts)
        if graphs.model_call.autocasts:
            with graphs.model_call.autocast():
                mean = graphs.loss_fn(y_pred, self.y)
        else:
            mean = graphs.loss_fn(y_pred, self.y)
        loss = mean if self.backward_mean else mean * self.targets
        root = graphs.scaler.scale(loss) if graphs.scaler is not None else loss
        window_grads = torch.autograd.grad(root, graphs.trained, allow_unused=True)
        state = [t.detach() for t in hs.flatten(hidden_out)]
        if graphs.capture:  # a cache of the state would keep this run's graph, of its stream, into the next capture
            recache(graphs.model_call.model, hidden_out, hs.unflatten(hidden_out, state))
        return mean.detach(), state, hs.detached(y_pred), window_grads


class WindowGraphs:
    """The window programs of one trainer, one per window shape, up to ``limit`` of them.

    Args:
        model_call: runs the model (its autocast must not cache casts under capture).
        loss_fn: ``loss_fn(y_pred, y)``, reducing by mean over its targets.
        scaler: the ``GradScaler`` every backward is scaled by, or ``None``.
        parameters: the optimizer's parameters, in its order.
        capture: capture each program in a CUDA graph after ``warmup`` eager runs (on CUDA); else run the same
            program eagerly every window.
        limit: the most window shapes given a program; windows of further shapes run eagerly.
        warmup: eager runs of a program, on a side stream, before it is captured.
    """

    def __init__(
        self,
        model_call: ModelCall,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        scaler: torch.amp.GradScaler | None,
        parameters: Callable[[], list[torch.Tensor]],
        capture: bool,
        limit: int = 8,
        warmup: int = 3,
    ) -> None:
        self.model_call, self.loss_fn, self.scaler = model_call, loss_fn, scaler
        self.parameters, self.capture, self.limit, self.warmup = parameters, capture, limit, warmup
        self.programs: dict[tuple, WindowProgram] = {}
        self.trained: list[torch.Tensor] = []  # the parameters that require grad, as the programs were built
        self._pointers: list[int] = []  # their storage then
        self._pool: Any = None
        self._side: Any = None

    def clear(self) -> None:
        """Forget every program: the next windows run eagerly and are captured afresh."""
        self.programs.clear()
        self.trained, self._pointers = [], []

    def run(
        self, plan: Any, x: torch.Tensor, y: torch.Tensor, hidden: Any, starts: torch.Tensor | None
    ) -> tuple[Any, Any, Any] | None:
        """Run the window of ``plan`` as a program, or return ``None`` if it must run eagerly.

        Returns:
            Its mean loss, its returned hidden state and its predictions, all detached.
        """
        self._check_parameters()
        key = (x.shape, x.dtype, y.shape, y.dtype, starts is not None, plan.backward_mean)
        program = self.programs.get(key)
        if program is None:
            if len(self.programs) >= self.limit:
                return None
            program = self.programs[key] = WindowProgram(self, x, y, hidden, starts is not None, plan.backward_mean)
        mean, hidden_out, y_pred = program(x, y, hidden, starts)
        return mean, hs.unflatten(hidden, hidden_out), y_pred

    def _check_parameters(self) -> None:
        # A program reads the parameters' storage and differentiates the parameters that required grad when it was
        # built: another set (a layer frozen or unfrozen, a parameter group added) or new storage (model.to(),
        # p.data = ...) means new programs.
        trained = [p for p in self.parameters() if p.requires_grad]
        pointers = [p.data_ptr() for p in trained]
        if (
            len(trained) != len(self.trained)
            or pointers != self._pointers
            or any(a is not b for a, b in zip(trained, self.trained))
        ):
            self.clear()
            self.trained, self._pointers = trained, pointers

    def accumulate(self, window_grads: tuple, fresh: bool) -> None:
        """Add a window's gradients into the parameters' ``.grad`` as autograd's backward would.

        A parameter without a gradient from the window keeps its ``.grad`` (``None`` if it had none, so that the
        optimizer skips it, as after an eager window); one whose ``.grad`` is ``None`` takes the window's (a copy of
        a graph's static tensor, which the next replay overwrites); the others add it, in one kernel.
        """
        added, into = [], []
        for p, g in zip(self.trained, window_grads):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g if fresh else g.clone()
            else:
                into.append(p.grad)
                added.append(g)
        if into:
            torch._foreach_add_(into, added)

    # -- capture (CUDA) ----------------------------------------------------------------------------------------
    def on_side_stream(self, body: Callable[[], Any]) -> Any:
        """Run ``body`` eagerly on a side stream, as warm-up before capture must."""
        current = torch.cuda.current_stream()
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side):
            result = body()
        current.wait_stream(self._side)
        return result

    def captured(self, body: Callable[[], Any]) -> tuple[Any, Any]:
        """Capture ``body`` in a CUDA graph (nothing runs); the graph and its static outputs.

        Raises:
            GraphCaptureError: if the window cannot be captured (it reads a value back to the host, or makes
                shapes from data), naming the fix.
        """
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = body()
        except RuntimeError as error:
            raise GraphCaptureError(
                f"the window could not be captured in a CUDA graph ({error}). A captured window may not read a value "
                "back to the host (.item(), float(), a Python condition on a tensor, nonzero() or a shape from data) "
                "in the model, model_fn or loss_fn; remove the read, or pass cuda_graphs=False. A failed capture can "
                "leave CUDA's random generator unusable in this process (later random draws fail with 'Offset "
                "increment outside graph capture'): start a new process for the next run."
            ) from error
        return graph, outputs


def check_graphable(source: Any) -> None:
    """Refuse a window source whose windows reach back into earlier ones or leave steps before their cut.

    Such windows (k2 != k1) retain segments or split them, so none would be captured: refused rather than run
    eagerly while the trainer's argument says otherwise.

    Raises:
        ValueError: naming the source and the fix.
    """
    k1, k2 = getattr(source, "k1", None), getattr(source, "k2", None)
    if source.spans_windows or (k1 is not None and k2 is not None and k1 != k2):
        raise ValueError(
            f"cuda_graphs=True captures windows of TBPTT(k1, k2) with k1 = k2; {type(source).__name__} has k1 = {k1}, "
            f"k2 = {k2}, whose windows retain or split segments and are not captured yet. Use k2 = k1, or pass "
            "cuda_graphs=False."
        )
