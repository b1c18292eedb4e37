"""Window programs of windows that reach back (k2 > k1): the retained segments in reach run again inside the program.

With k2 > k1 a window's backward pass reaches ``k2 - k1`` steps before its start, into segments that earlier windows
ran with the weights of earlier optimizer steps. The eager trainer keeps their graphs, and the weights those graphs
saved (:mod:`~ignite_tbptt.runtime.weight_versions`); a program keeps no graph from one run to the next. A
:class:`ReachingProgram` holds, in static buffers written before each run, what recomputes them: the hidden state at
the window's cut, the input (and reset mask) of each retained segment from the cut to the window's start, and the
weights each of them ran with, copied from its weight version. Its body runs those segments' forward passes again,
each with its own weights in the place of the parameters (``torch.func.functional_call``), then the window's model
call and loss, and backpropagates the loss through all of it to the cut. This is recomputation (Chen et al. 2016,
"Training deep nets with sublinear memory cost", arXiv:1604.06174, section 3) with each segment's own weights, as
the eager trainer's ``recompute`` mode rebuilds its segments, inside one program. Each segment's weights get their
own gradient, added to the parameters' in the order of the eager sweep: the window's own, then the retained
segments' from the latest back. Without accumulation that is the eager trainer's arithmetic, bit for bit.

The window joins the retained history as what recomputes it (input, input state, weight version), without a graph:
a later window reaches it, a program or an eager one (which rebuilds it as ``recompute`` does).

A window runs as a reaching program where (:meth:`ProgramExecutor.run
<ignite_tbptt.runtime.window_programs.ProgramExecutor.run>` checks it):

- it is one model call from its start to its end (the schedule's later cuts never split it: ``k2 - k1`` is a
  multiple of ``k1``; a sequence start or a batch's end splits it, and it runs eagerly), and its gradient reach is
  not recorded;
- the retained segments tile the steps from its cut to its start, and the cut has a state: a stream's first windows,
  whose cut is its start, run eagerly;
- the model draws no random numbers (dropout in training mode): the segments run again would draw others than they
  drew the first time. The first run of each program checks the random generators, and a model that drew is refused;
- the parameters of the optimizer that the forward pass uses belong to the model, or to ``initial_state`` where it
  is a module: the weights are swapped in there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from . import hidden as hs
from . import rng
from .backward_sweep import Replay, Segment
from .graph_capture import Program, kept

if TYPE_CHECKING:
    from .window_programs import ProgramExecutor

__all__ = ["ReachingProgram", "SwappedWeights", "reach_of"]

_RANDOM = (
    "cuda_graphs with k2 > k1 runs the retained segments a window reaches again inside the window's program, and the "
    "model drew random numbers in a window (dropout in training mode, say): the segments run again would draw other "
    "numbers than they drew the first time, and the gradients would not be the eager trainer's. Use k2 = k1, a model "
    "that draws none (dropout=0), or cuda_graphs=False."
)


def reach_of(segments: Sequence[Segment], cut: int, start: int) -> list[Replay] | None:
    """What recomputes the retained segments from ``cut`` to ``start``, oldest first, or ``None``: run eagerly.

    ``None`` unless they tile those steps, owe no loss gradient, and the first has a state to start from (the
    stream's start has none).
    """
    end, reach = start, []
    for segment in reversed(segments):
        if end <= cut:
            break
        owes = segment.y_pred is not None or segment.loss is not None or segment.y_grad is not None
        if segment.end != end or segment.replay is None or owes:
            return None
        reach.append(segment.replay)
        end = segment.start
    if end != cut or not reach or reach[-1].hidden is None:
        return None
    reach.reverse()
    return reach


class _Holder(torch.nn.Module):
    # The modules whose parameters a model call uses, under one root for torch.func.functional_call; calling it runs
    # the function it is given, so that model_fn and the initial state run with the weights swapped.
    def __init__(self, model: torch.nn.Module, initial_state: Any) -> None:
        super().__init__()
        self.model = model
        if isinstance(initial_state, torch.nn.Module):
            self.initial_state = initial_state

    def forward(self, fn: Callable[[], Any]) -> Any:
        return fn()


class SwappedWeights:
    """Runs a model call with other tensors in the place of the trained parameters.

    Args:
        model: the model.
        initial_state: the trainer's ``initial_state`` (its parameters are swapped too where it is a module).
        trained: the parameters to swap, in the optimizer's order.
    """

    def __init__(self, model: torch.nn.Module, initial_state: Any, trained: Sequence[torch.Tensor]) -> None:
        self.holder = _Holder(model, initial_state)
        names = {id(p): name for name, p in self.holder.named_parameters()}
        self.names = [names.get(id(p)) for p in trained]  # None: used by the loss alone, never swapped

    def __call__(self, weights: Sequence[torch.Tensor], fn: Callable[[], Any]) -> Any:
        """``fn()``, with ``weights[i]`` in the place of the ``i``-th trained parameter."""
        swapped = {name: w for name, w in zip(self.names, weights) if name is not None}
        return torch.func.functional_call(self.holder, swapped, (fn,), strict=False)


class _Piece(NamedTuple):
    # A retained segment's buffers: its input, its reset mask, and its weights (leaves: their own gradient).
    x: torch.Tensor
    starts: torch.Tensor | None
    weights: list[torch.Tensor]


class ReachingProgram:
    """One shape of a reaching window and of its reach: its retained segments' forward passes, then the window's.

    Args:
        executor: the :class:`~ignite_tbptt.runtime.window_programs.ProgramExecutor` it belongs to.
        reach: the retained segments from the window's cut to its start, oldest first (their :class:`Replay`).
        x, y: the window's input and targets, ``(T, B, *)`` along the time dimension, which give the buffers' shapes.
        resets: whether the window resets columns at its first step (a ``(B,)`` bool mask buffer).
        backward_mean: the loss is backpropagated as the mean over the window's targets, else as their sum.
    """

    def __init__(
        self,
        executor: ProgramExecutor,
        reach: Sequence[Replay],
        x: torch.Tensor,
        y: torch.Tensor,
        resets: bool,
        backward_mean: bool,
    ) -> None:
        self.executor = executor
        self.x, self.y = torch.empty_like(x), torch.empty_like(y)
        self.starts = (
            torch.zeros(executor.model_call.layout.columns(x), dtype=torch.bool, device=x.device) if resets else None
        )
        self.cut = [torch.empty_like(t) for t in hs.flatten(reach[0].hidden)]
        self.cut_tree = hs.unflatten(reach[0].hidden, self.cut)
        trained = executor.trained
        self.pieces = [
            _Piece(
                torch.empty_like(r.x),
                None if r.starts is None else torch.empty_like(r.starts),
                [torch.empty_like(p.detach()).requires_grad_() for p in trained],
            )
            for r in reach
        ]
        self.leaves = [w for piece in self.pieces for w in piece.weights]
        self.swapped = SwappedWeights(executor.model_call.model, executor.model_call.initial_state, trained)
        self.backward_mean = backward_mean
        self.targets = y.numel()
        self.checked = False  # whether a run checked that the model draws no random numbers
        self.program = Program(self._body, executor.graphs, "the window")

    @staticmethod
    def key(reach: Sequence[Replay]) -> tuple:
        """What a reach must share with another for one program to run both."""
        return tuple((r.x.shape, r.x.dtype, r.starts is not None) for r in reach)

    def __call__(
        self,
        reach: Sequence[Replay],
        values: Callable[[Replay], list[torch.Tensor]],
        x: torch.Tensor,
        y: torch.Tensor,
        starts: torch.Tensor | None,
    ) -> tuple[Any, Any, Any, int]:
        """Run the window on ``x``, ``y`` after its ``reach``; ``values(replay)``: the trained weights it ran with.

        Returns:
            As :class:`~ignite_tbptt.runtime.window_programs.WindowProgram`: the window's mean loss, the tensors of its
            returned hidden state and its predictions, all detached, and its target count.

        Raises:
            ValueError: at a program's first run, if the model drew random numbers; nothing of the window is
                applied (no gradient added, the stream not advanced).
        """
        with torch.no_grad():
            into, sources = [self.x, self.y, *self.cut], [x, y, *hs.flatten(reach[0].hidden)]
            if self.starts is not None:
                into.append(self.starts)
                sources.append(starts)
            for piece, replay in zip(self.pieces, reach):
                into.append(piece.x)
                sources.append(replay.x)
                if piece.starts is not None:
                    into.append(piece.starts)
                    sources.append(replay.starts)
                into += piece.weights
                sources += values(replay)
            torch._foreach_copy_(into, sources)
        before = None if self.checked else rng.capture(x.device)
        (mean, hidden_out, y_pred, grads, count), fresh = self.program()
        if before is not None:
            self.checked = True
            if not _same_random_state(before, rng.capture(x.device)):
                raise ValueError(_RANDOM)
        targets = self.targets if count is None else int(count)
        if targets:
            self.executor.add_window_gradients(grads)
        return (*kept((mean, hidden_out, y_pred), fresh), targets)

    def _body(self) -> tuple[Any, list[torch.Tensor], Any, list, Any]:
        executor = self.executor
        call = executor.model_call
        state = self.cut_tree
        for piece in self.pieces:
            _, state = self.swapped(piece.weights, _bound(call, piece.x, state, piece.starts))
        window = executor.window_pass(
            self.x, self.y, state, self.starts, self.targets, self.backward_mean, also=self.leaves
        )
        n = len(executor.trained)
        grads = list(window.grads[:n])
        # The eager sweep adds the window's gradient, then each retained segment's from the latest back.
        for j in range(len(self.pieces) - 1, -1, -1):
            for i, g in enumerate(window.grads[n + j * n : n + (j + 1) * n]):
                if g is not None:
                    grads[i] = g if grads[i] is None else grads[i] + g
        return window.mean, hs.flatten(window.state), hs.detached(window.predictions), grads, window.count


def _bound(call: Callable, x: torch.Tensor, state: Any, starts: torch.Tensor | None) -> Callable[[], Any]:
    return lambda: call(x, state, None, False, starts)


def _same_random_state(a: rng.RNGState, b: rng.RNGState) -> bool:
    return all(torch.equal(s, t) for s, t in zip(a, b) if s is not None)
