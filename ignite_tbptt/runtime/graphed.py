"""Windows run as one program over static buffers, captured once in a CUDA graph and replayed.

Where the model is small, a GPU step is bound by kernel launches: a window of a GRU of 8 units is some fifty
launches of a few microseconds each. A CUDA graph records them once and replays them as one. What a graph can
replay is a window whose whole course is fixed before it runs: at k1 = k2, a window that opens and closes in
one model call, whose loss is backpropagated at once and of which nothing is retained
(:attr:`~ignite_tbptt.planning.SegmentPlan.whole_window` with ``backward_now``), with the hidden-state reset of
columns that start a sequence at its first step as a mask. Each shape of such a window is a
:class:`WindowProgram`: its input, targets, hidden state and reset mask are copied into static buffers, the
model, the loss and the backward pass run on them, and the window's gradient is added into each parameter's
``.grad``, which stays the same tensor from window to window. Everything else (the first window of a stream,
windows split by a sequence start, the short last window of a new shape past the bound) runs eagerly, and the
optimizer step runs eagerly between windows, so handlers, clipping, the inf/NaN check and learning-rate
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
        self.outputs: tuple[Any, list[torch.Tensor], Any] | None = None  # the captured run's static outputs

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
            return self._body()
        if self.graph is None:
            if self.runs < graphs.warmup:
                self.runs += 1
                return graphs.on_side_stream(self._body)
            self.graph, self.outputs = graphs.captured(self._body)
        self.graph.replay()
        mean, hidden_out, y_pred = self.outputs
        # Fresh tensors: the next replay overwrites the static ones, and a handler may keep a window's values.
        return mean.clone(), [t.clone() for t in hidden_out], pytree.tree_map_only(torch.Tensor, torch.clone, y_pred)

    def _body(self) -> tuple[Any, list[torch.Tensor], Any]:
        graphs = self.graphs
        y_pred, hidden_out = graphs.model_call(self.x, self.tree, None, False, self.starts)
        if graphs.model_call.autocasts:
            with graphs.model_call.autocast():
                mean = graphs.loss_fn(y_pred, self.y)
        else:
            mean = graphs.loss_fn(y_pred, self.y)
        loss = mean if self.backward_mean else mean * self.targets
        root = graphs.scaler.scale(loss) if graphs.scaler is not None else loss
        params = graphs.trained
        window_grads = torch.autograd.grad(root, params, allow_unused=True)
        pairs = [(p.grad, g) for p, g in zip(params, window_grads) if g is not None]
        if pairs:
            # Into the gradients the optimizer reads, in place: the tensors a graph writes stay the parameters' own.
            torch._foreach_add_([a for a, _ in pairs], [g for _, g in pairs])
        return mean.detach(), [t.detach() for t in hs.flatten(hidden_out)], hs.detached(y_pred)


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
        self.trained: list[torch.Tensor] = []  # the parameters that require grad
        self._grads: list[torch.Tensor] = []  # their gradient buffers, the tensors the programs add into
        self._pointers: list[int] = []  # their storage when the programs were built
        self._pool: Any = None
        self._side: Any = None

    def clear(self) -> None:
        """Forget every program: the next windows run eagerly and are captured afresh."""
        self.programs.clear()
        self.trained, self._grads, self._pointers = [], [], []

    def run(
        self, plan: Any, x: torch.Tensor, y: torch.Tensor, hidden: Any, starts: torch.Tensor | None
    ) -> tuple[Any, Any, Any] | None:
        """Run the window of ``plan`` as a program, or return ``None`` if it must run eagerly.

        Returns:
            Its mean loss, its returned hidden state and its predictions, all detached.
        """
        key = (x.shape, x.dtype, y.shape, y.dtype, starts is not None, plan.backward_mean)
        program = self.programs.get(key)
        if program is None:
            if len(self.programs) >= self.limit or not self._check_parameters():
                return None
            program = self.programs[key] = WindowProgram(self, x, y, hidden, starts is not None, plan.backward_mean)
        elif not self._check_parameters():
            return None
        mean, hidden_out, y_pred = program(x, y, hidden, starts)
        return mean, hs.unflatten(hidden, hidden_out), y_pred

    def _check_parameters(self) -> bool:
        # The programs add into the same gradient tensors and read the same parameter storage every window: a
        # zero_grad(set_to_none=True) or an eager window's backward between them gives a parameter another .grad,
        # whose values are moved back; parameters given new storage (model.to(), p.data = ...) mean new programs.
        if not self.trained:
            self.trained = [p for p in self.parameters() if p.requires_grad]
            self._grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.trained]
            for p, g in zip(self.trained, self._grads):
                p.grad = g
            self._pointers = [p.data_ptr() for p in self.trained]
            return True
        for p, grad, pointer in zip(self.trained, self._grads, self._pointers):
            if p.data_ptr() != pointer:
                self.clear()
                return self._check_parameters()
            if p.grad is not grad:
                if p.grad is None:
                    grad.zero_()
                else:
                    grad.copy_(p.grad)
                p.grad = grad
        return True

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
                "in the model, model_fn or loss_fn; remove the read, or pass cuda_graphs=False."
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
