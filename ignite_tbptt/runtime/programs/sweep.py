"""Sweep programs: a window, its model calls, its reach back (k2 > k1) and its backward sweep, as one program.

A window program (:mod:`~ignite_tbptt.runtime.programs.executor`), one model call paid at once, is the simplest: a
sweep program of one call that reaches nothing. The other windows the eager trainer runs as segments and a backward
sweep (:mod:`~ignite_tbptt.runtime.backward_sweep`): a window that a sequence start splits (the reset falls between
two model calls), one split where a later window's cut falls (k2 > k1 where ``k2 - k1`` is not a multiple of
``k1``), and every window of k2 > k1, whose sweep reaches ``k2 - k1`` steps before its start, into segments earlier
windows ran with the weights of earlier optimizer steps. A
:class:`SweepProgram` runs such a window whole: its model calls at their fixed places in the window (each resetting
the columns that start a sequence at its first step, as a mask), their losses, and one backward pass to the cut.

A program keeps no graph from one run to the next, so the retained segments in reach run again inside it. Its static
buffers, written before each run, hold what recomputes them: the hidden state at the window's cut, the input (and
reset mask) of each retained segment from the cut to the window's start, and the weights each ran with, copied from
its weight version. Its body runs those segments' forward passes with their own weights in the place of the
parameters (``torch.func.functional_call``), then the window's calls. This is recomputation (Chen et al. 2016,
"Training deep nets with sublinear memory cost", arXiv:1604.06174, section 3) with each segment's own weights, as the
eager trainer's ``recompute`` mode rebuilds its segments, inside one program. Each segment's weights get their own
gradient, added to the parameters' in the order of the eager sweep: the window's own, then the retained segments'
from the latest back; for a window of one call and one window a step, the eager trainer's arithmetic, bit for bit.

The window's segments that a later window reaches join the retained history as what recomputes them (input, input
state, weight version), not as graphs: a later window reaches them, a program or an eager one (which rebuilds them as
``recompute`` does).

Which windows run as sweep programs is planned (:func:`~ignite_tbptt.planning.plan_window`; a window that runs
eagerly is counted with its :class:`~ignite_tbptt.planning.Eager` reason); here, its reach must be retained whole
(:func:`reach_of`: the retained segments tile the steps from its cut to its start, and the cut has a state, which a
stream's first windows of k2 > k1 lack). Refused rather than run: a model that draws random numbers where forward
passes run again (the window reaches back, or ``recompute``; dropout in training mode), which the first run of each
such program checks, since they would draw others than the first time; and, where windows reach back, trained
parameters that are neither the model's nor ``initial_state``'s (a module): the weights are swapped in there
(:class:`SwappedWeights`, checked as the window source is installed).

With ``target_count_fn``, the calls' counts stay on the device; a call without targets adds no gradient of its own
loss (its backward pass runs apart from the others', and its gradient is masked), as an eager segment without
targets runs none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

import torch
from torch.utils.checkpoint import checkpoint

from .. import hidden as hs
from .. import rng
from ..backward_sweep import Recomputation, Segment
from ..model_call import ModelCall
from ..weight_versions import ParameterVersions, WeightVersion
from .capture import GraphCapture, Program, StaticInputs, copied_out
from .step import StaticGradients

__all__ = [
    "SweepProgram",
    "SweepResults",
    "Call",
    "CallPass",
    "WindowCalls",
    "ReachWeights",
    "SwappedWeights",
    "reach_of",
    "recomputable_from",
    "rnn_weights_kept",
]

_RANDOM = (
    "cuda_graphs runs forward passes again inside a window's program (the retained segments a window reaches with "
    "k2 > k1; every call with recompute), and the model drew random numbers in a window (dropout in training mode, "
    "say): a forward pass run again would draw other numbers than it drew the first time, and the gradients would "
    "not be the eager trainer's. Use k2 = k1 without recompute, a model that draws none (dropout=0), or "
    "cuda_graphs=False."
)


def reach_of(segments: Sequence[Segment], cut: int, start: int) -> list[Recomputation] | None:
    """What recomputes the retained segments from ``cut`` to ``start``, oldest first, or ``None``: run eagerly.

    ``None`` unless they tile those steps, owe no loss gradient, and the first has a state to start from (the
    stream's start has none). Empty where the cut is the window's start.
    """
    end, reach = start, []
    for segment in reversed(segments):
        if end <= cut:
            break
        owes = segment.y_pred is not None or segment.loss is not None or segment.y_grad is not None
        if segment.end != end or segment.recomputation is None or owes:
            return None
        reach.append(segment.recomputation)
        end = segment.start
    if end != cut or (reach and reach[-1].hidden is None):
        return None
    reach.reverse()
    return reach


def recomputable_from(segments: Sequence[Segment], position: int) -> frozenset[int]:
    """The cuts from which :func:`reach_of` finds the retained segments up to ``position`` whole; ``position`` too."""
    found, end = {position}, position
    for segment in reversed(segments):
        owes = segment.y_pred is not None or segment.loss is not None or segment.y_grad is not None
        if segment.end != end or segment.recomputation is None or owes:
            break
        if segment.recomputation.hidden is not None:
            found.add(segment.start)
        end = segment.start
    return frozenset(found)


class ReachWeights:
    """The trained parameters' values in the weight versions a reach ran with, made once per version.

    A frozen version's values are views into its copies (a few microseconds of Python each, per parameter); a
    per-token window reaches ``k2 - 1`` segments, each of another version, so each is made once rather than once per
    window that reaches it. Only the versions of the last reach are kept, so that no copy outlives the history.
    """

    def __init__(self) -> None:
        self._made: dict[int, tuple[WeightVersion, bool, list[torch.Tensor]]] = {}

    def __call__(self, versions: ParameterVersions, reach: Sequence[Recomputation], index: Sequence[int]) -> list[list]:
        """For each segment of ``reach``, the values of the parameters at ``index`` in its version."""
        made: dict[int, tuple[WeightVersion, bool, list[torch.Tensor]]] = {}
        out = []
        for recomputation in reach:
            version = recomputation.version
            assert version is not None, "a reach's segments ran where weight versions are kept (k2 > k1)"
            hit = made.get(id(version)) or self._made.get(id(version))
            if hit is None or hit[0] is not version or hit[1] != version.frozen:  # the current version froze since
                values = versions.values(version)
                hit = (version, version.frozen, [values[i] for i in index])
            made[id(version)] = hit
            out.append(hit[2])
        self._made = made
        return out

    def clear(self) -> None:
        """Forget every version's values (the trained parameters changed)."""
        self._made = {}


class _SwapRoot(torch.nn.Module):
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

    Raises:
        ValueError: if a trained parameter is neither the model's nor ``initial_state``'s: it could not be swapped,
            and a segment run again would run with its value now, not the one it ran with.
    """

    def __init__(self, model: torch.nn.Module, initial_state: Any, trained: Sequence[torch.Tensor]) -> None:
        self.holder = _SwapRoot(model, initial_state)
        self.rnns = [m for m in model.modules() if isinstance(m, torch.nn.RNNBase)]
        self.names = self._names_in(self.holder, trained)

    @staticmethod
    def check(model: torch.nn.Module, initial_state: Any, trained: Sequence[torch.Tensor]) -> None:
        """Refuse, before a run, trained parameters that a swap would not reach (see the class's ``Raises``)."""
        SwappedWeights._names_in(_SwapRoot(model, initial_state), trained)

    @staticmethod
    def _names_in(holder: torch.nn.Module, trained: Sequence[torch.Tensor]) -> list[str]:
        # Each trained parameter's name under the holder; raises for one it does not hold.
        names = {id(p): name for name, p in holder.named_parameters()}
        found = [names.get(id(p)) for p in trained]
        missing = [tuple(p.shape) for p, name in zip(trained, found) if name is None]
        if missing:
            raise ValueError(
                f"cuda_graphs with k2 > k1 runs the retained segments a window reaches again with the weights they ran "
                f"with, swapped into the model and initial_state, and the optimizer trains parameters of shapes "
                f"{missing} that are neither's (held by model_fn, the loss, or an initial_state that is a function): "
                "hold them in the model, or pass initial_state as a module; or pass cuda_graphs=False."
            )
        return [name for name in found if name is not None]  # every one of them, by now

    def __call__(self, weights: Sequence[torch.Tensor], fn: Callable[[], Any]) -> Any:
        """``fn()``, with ``weights[i]`` in the place of the ``i``-th trained parameter."""
        swapped = dict(zip(self.names, weights))
        with rnn_weights_kept(self.rnns):
            return torch.func.functional_call(self.holder, swapped, (fn,), strict=False)


@contextmanager
def rnn_weights_kept(rnns: Sequence[torch.nn.RNNBase]) -> Iterator[None]:
    """A block that swaps the weights of torch's RNN modules (``functional_call``) without moving their own.

    Given other weights, an ``nn.RNN``, ``nn.GRU`` or ``nn.LSTM`` flattens them on CUDA into one new buffer
    (``flatten_parameters``), and its own again at its next call: the parameters' storage would move every window,
    which the weight versions, the programs' buffers and a graph's recorded addresses all rely on. Inside the block it
    runs on the weights as given (cuDNN copies them per call); after it, it holds its own, as flattened before.
    """
    # Copies: setting a weight writes into the module's list in place.
    kept = [(list(m._flat_weights), list(m._flat_weight_refs)) for m in rnns]
    for m in rnns:
        # An instance attribute, on purpose: the class's method is untouched.
        m.flatten_parameters = lambda: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m, (weights, refs) in zip(rnns, kept):
            del m.flatten_parameters
            m._flat_weights, m._flat_weight_refs = weights, refs


class CallPass(NamedTuple):
    """One model call of a window inside a program, with its loss (:meth:`WindowCalls.window_call`)."""

    #: Its mean loss, with its graph.
    mean: Any
    #: Its predictions, with their graph.
    predictions: Any
    #: The hidden state it returned, with its graph.
    state: Any
    #: Where its backward pass starts: its loss, as backpropagated and scaled.
    root: Any
    #: ``target_count_fn``'s count, a 0-dim int64 tensor on the device; ``None`` without it.
    count: Any


class WindowCalls(Protocol):
    """What a sweep program runs its window's calls with: the program executor's model call, parameters and capture.

    :class:`~ignite_tbptt.runtime.programs.executor.ProgramExecutor` is the one; the protocol keeps this module
    below it.
    """

    #: Runs the model on a call's steps.
    model_call: ModelCall
    #: The parameters that require grad, in the optimizer's order: what the backward pass differentiates.
    trained: list[torch.Tensor]
    #: What captures the programs after their warm-up (``None``: run every time).
    graphs: GraphCapture | None
    #: The parameters' static ``.grad`` buffers, into which a window's gradients are added as autograd's backward
    #: pass would add them (:meth:`~ignite_tbptt.runtime.programs.step.StaticGradients.take`).
    gradients: StaticGradients

    def window_call(
        self, x: Any, y: Any, state: Any, starts: torch.Tensor | None, targets: int, backward_mean: bool
    ) -> CallPass:
        """One model call of a window, and its loss as the eager executor computes it."""

    def state_after(self, state: Any) -> Any:
        """A window's returned state, detached, once its backward pass ran."""


class Call(NamedTuple):
    """One model call of a window: its steps, counted from the window's start, and whether it resets columns."""

    start: int
    end: int
    resets: bool
    #: Its loss is read as the mean over its targets (the call is its window), else as their sum.
    whole: bool


class SweepResults(NamedTuple):
    """What a sweep program's run gave, per call of its window (detached)."""

    #: Each call's loss: the mean over its targets where the call is its window, else their sum.
    losses: list[Any]
    #: Each call's target count.
    counts: list[int]
    #: The tensors of the hidden state after each call (the last: the window's).
    states: list[list[torch.Tensor]]
    #: Each call's predictions.
    predictions: list[Any]


class _ReachedSegment(NamedTuple):
    # A retained segment's buffers: its input, its reset mask, and its weights (leaves: their own gradient).
    x: torch.Tensor
    starts: torch.Tensor | None
    weights: list[torch.Tensor]


class SweepProgram:
    """One shape of a window and of its reach: its retained segments' forward passes, then the window's calls.

    Args:
        executor: what runs its window's calls (the program executor it belongs to).
        reach: the retained segments from the window's cut to its start, oldest first (their :class:`Recomputation`).
        state: the window's input hidden state (the cut's where the reach is empty).
        x, y: the window's input and targets, ``(T, B, *)`` along the time dimension, which give the buffers' shapes.
        calls: the window's model calls.
        backward_mean: the loss is backpropagated as the mean over the window's targets, else as their sum.
        rebuilds: recomputation mode (``recompute``): each call's and each retained segment's activations are
            computed again in the backward pass rather than kept (Chen et al. 2016, section 3).
    """

    def __init__(
        self,
        executor: WindowCalls,
        reach: Sequence[Recomputation],
        state: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        calls: Sequence[Call],
        backward_mean: bool,
        rebuilds: bool = False,
    ) -> None:
        self.executor, self.calls, self.backward_mean, self.rebuilds = executor, calls, backward_mean, rebuilds
        # Written before each run in this order: input, targets, the cut's state, the calls' reset masks, and each
        # retained segment's input, reset mask and weights (leaves: their own gradient).
        inputs = self.inputs = StaticInputs()
        self.x, self.y = inputs.like(x), inputs.like(y)
        model_call, layout = executor.model_call, executor.model_call.layout
        first = reach[0].hidden if reach else state
        self.cut_tree = hs.unflatten(first, [inputs.like(t) for t in hs.flatten(first)])
        mask = torch.zeros(layout.columns(x), dtype=torch.bool, device=x.device)
        self.starts = [inputs.like(mask) if call.resets else None for call in calls]
        trained = executor.trained
        self.pieces = [
            _ReachedSegment(
                inputs.like(r.x),
                None if r.starts is None else inputs.like(r.starts),
                [inputs.like(p).requires_grad_() for p in trained],
            )
            for r in reach
        ]
        self.leaves = [w for piece in self.pieces for w in piece.weights]
        self.swapped = SwappedWeights(model_call.model, model_call.initial_state, trained) if reach else None
        self.targets = [layout.steps(y, c.start, c.end).numel() for c in calls]
        # Whether a run checked that the model draws no random numbers, where they would be drawn again.
        self.checked = not reach and not rebuilds
        self.program = Program(self._body, executor.graphs, "the window")

    @staticmethod
    def key(reach: Sequence[Recomputation]) -> tuple:
        """What a reach must share with another for one program to run both."""
        return tuple((r.x.shape, r.x.dtype, r.starts is not None) for r in reach)

    def __call__(
        self,
        reach: Sequence[Recomputation],
        values: Sequence[list[torch.Tensor]],
        state: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        starts: Sequence[torch.Tensor | None],
        keep_predictions: bool = False,
    ) -> SweepResults:
        """Run the window on ``x``, ``y`` after its ``reach``, from ``state`` where the reach is empty.

        ``values``: for each retained segment, the trained weights it ran with; ``starts``: each call's reset mask;
        ``keep_predictions``: return the calls' predictions (a replay's are copied out for it), else ``None`` each.

        Raises:
            ValueError: at a program's first run, if it runs forward passes again (it reaches back, or rebuilds its
                calls) and the model drew random numbers; nothing of the window is applied (no gradient added, the
                stream not advanced), and the next run checks again.
        """
        first = reach[0].hidden if reach else state
        sources = [x, y, *hs.flatten(first), *(mask for mask in starts if mask is not None)]
        for r, weights in zip(reach, values):
            sources += [r.x, *([] if r.starts is None else [r.starts]), *weights]
        self.inputs.write(sources)  # a mask where the key has one: the buffers match
        if not self.checked:  # before the generators are compared, which on CUDA would not show cuDNN's own state
            rng.refuse_own_dropout_state(
                self.executor.model_call.model,
                "cuda_graphs (a window reaching back, k2 > k1, or recompute)",
                "cuda_graphs=False",
            )
        before = None if self.checked else rng.capture(x.device)
        (losses, states, predictions, grads, counts), fresh = self.program()
        if before is not None:
            if not rng.same(before, rng.capture(x.device)):
                raise ValueError(_RANDOM)
            self.checked = True
        # Read once the window has run, as the eager segments read theirs.
        counts = self.targets if counts is None else torch.stack(counts).tolist()
        if any(counts):
            self.executor.gradients.take(self.executor.trained, grads)
        losses, states = copied_out((losses, states), fresh)
        predictions = copied_out(predictions, fresh) if keep_predictions else [None] * len(predictions)
        return SweepResults(losses, counts, states, predictions)

    def _body(self) -> tuple[list, list, list, list, Any]:
        executor = self.executor
        call, steps = executor.model_call, executor.model_call.layout.steps
        state = self.cut_tree
        if self.swapped is not None:  # the window reaches back (else it has no pieces)
            for piece in self.pieces:
                _, state = self._rebuilt(self.swapped, piece.weights, _bound(call, piece.x, state, piece.starts))
        losses, states, predictions, roots, counts = [], [], [], [], []
        for c, starts, targets in zip(self.calls, self.starts, self.targets):
            x, y = steps(self.x, c.start, c.end), steps(self.y, c.start, c.end)
            passed = self._rebuilt(executor.window_call, x, y, state, starts, targets, self.backward_mean)
            state = passed.state
            count = targets if passed.count is None else passed.count
            losses.append(passed.mean.detach() if c.whole else (passed.mean * count).detach())
            states.append([t.detach() for t in hs.flatten(state)])
            predictions.append(hs.detached(passed.predictions))
            roots.append(passed.root)
            counts.append(passed.count)
        grads = self._gradients(roots, counts)
        states[-1] = hs.flatten(executor.state_after(state))  # the model's caches of it let go of the graph too
        return losses, states, predictions, grads, None if counts[0] is None else counts

    def _rebuilt(self, fn: Callable, *args: Any) -> Any:
        # In recomputation mode each call keeps no activation: its backward pass runs its forward pass again, as the
        # eager sweep rebuilds a segment (non-reentrant checkpointing: captured with the rest). Its random draws are
        # not replayed: a model that draws any is refused at the first run.
        if not self.rebuilds:
            return fn(*args)
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)

    def _gradients(self, roots: list, counts: list) -> list:
        # The parameters' gradients: the window's, then each retained segment's from the latest back, as the eager
        # sweep adds them. With counts on the device, each call's loss apart, its gradient masked where it has none.
        trained = self.executor.trained
        leaves, n = [*trained, *self.leaves], len(trained)
        grads: list[torch.Tensor | None]
        if counts[0] is None:
            grads = list(torch.autograd.grad(sum(roots[1:], roots[0]), leaves, allow_unused=True))
        else:
            grads = [None] * len(leaves)
            for i, (root, count) in enumerate(zip(roots, counts)):
                call_grads = torch.autograd.grad(root, leaves, retain_graph=i < len(roots) - 1, allow_unused=True)
                grads = _added(grads, _masked_by_count(call_grads, count))
        total: list[torch.Tensor | None] = grads[:n]
        for j in range(len(self.pieces) - 1, -1, -1):
            total = _added(total, grads[n + j * n : n + (j + 1) * n])
        return total


def _added(so_far: Sequence[torch.Tensor | None], more: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    # Gradients added as autograd adds them into .grad: a missing one (None) is no term.
    return [b if a is None else a if b is None else a + b for a, b in zip(so_far, more)]


def _masked_by_count(grads: Sequence[torch.Tensor | None], count: torch.Tensor) -> list[torch.Tensor | None]:
    """A call's gradients where ``count`` (its targets, a 0-dim tensor on the device) is positive, else zeros.

    A call without targets has the mean 0 / 0 and must add no gradient, as an eager segment without targets runs no
    backward pass; a program cannot read the count to skip the addition, so it adds zeros.
    """
    return [None if g is None else torch.where(count > 0, g, 0.0) for g in grads]


def _bound(call: Callable, x: torch.Tensor, state: Any, starts: torch.Tensor | None) -> Callable[[], Any]:
    return lambda: call(x, state, None, False, starts)
