"""Windows run as programs: the program executor, and a window's calls and its backward pass as one.

Where the model is small, a GPU step is bound by kernel launches: a window of a GRU of 8 units is some fifty launches
of a few microseconds each, which a CUDA graph records once and replays as one. :class:`ProgramExecutor`, the second
executor, runs a window whole as one :class:`WindowProgram` where planning says so
(:func:`~ignite_tbptt.planning.plan_window`), one window per replay, and every other window segment by segment, as the
eager :class:`~ignite_tbptt.runtime.SegmentExecutor` runs it. :class:`Execution` names how: eagerly; as programs
uncaptured (the same operations on the same buffers every window, on any device: the eager parameters bit for bit);
captured in CUDA graphs; or recorded and run again under capture's rules on any device
(:mod:`~ignite_tbptt.runtime.programs.recording`).

A window program runs the window's model calls at their fixed places (each resetting the columns that start a sequence
at its first step, as a mask), their losses, and one backward pass to the window's start, which is its cut: a window
that reaches back into earlier windows (k2 > k1), or one a later window reaches, keeps graphs across windows and runs
eagerly, as does every window in recomputation mode (planning says so). It reads its inputs from static buffers
written before each run (the window's input and targets, the hidden state at its start, the calls' reset masks), and
adds its gradient to the parameters' static ``.grad`` buffers, where the step programs (:mod:`.step`) read them: for a
window of one call and one window a step, the eager trainer's arithmetic, bit for bit. With ``target_count_fn``, the
calls' counts stay on the device; a call without targets adds no gradient of its own loss.

Sources: PyTorch's CUDA semantics notes, "CUDA Graphs" (whole-network capture: warm-up on a side stream, static
inputs copied in, outputs read after ``replay()``, ``torch.autocast(..., cache_enabled=False)`` under capture).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from ...planning import ClosePlan, RuntimeFacts, SegmentPlan
from .. import hidden as hs
from ..executor import SegmentExecutor, SegmentResult
from ..loss_rule import LossRule
from ..model_call import ModelCall
from ..module_state import repoint_caches
from ..profiling import profiling
from ..reset import Resets
from ..stream import StreamState
from .capture import GraphCapture, Program, ProgramCache, StaticInputs, copied_out
from .recording import Recorder
from .step import StepPrograms

__all__ = ["Execution", "build_executor", "ProgramExecutor", "WindowProgram", "WindowResults", "Call", "CallPass"]


class Execution(enum.Enum):
    """How a trainer's windows run, decided once where its options are read (``cuda_graphs``)."""

    #: Every segment by the eager :class:`~ignite_tbptt.runtime.SegmentExecutor` (``cuda_graphs=False``).
    EAGER = "eager"
    #: Windows as programs where planning says so, run uncaptured, on any device (``cuda_graphs="uncaptured"``).
    UNCAPTURED = "uncaptured"
    #: Windows as programs where planning says so, captured in CUDA graphs (``cuda_graphs=True``).
    CUDA_GRAPHS = "cuda_graphs"
    #: Programs recorded once, the recording run again without their Python, under capture's rules, on any device
    #: (``cuda_graphs="recorded"``, :mod:`~ignite_tbptt.runtime.programs.recording`).
    RECORDED = "recorded"

    def graph_capture(self, warmup: int = 3) -> GraphCapture | None:
        """What captures this execution's programs: a CUDA graph's, a recording's, or nothing (run every time)."""
        if self is Execution.CUDA_GRAPHS:
            return GraphCapture(warmup)
        if self is Execution.RECORDED:
            return Recorder(warmup)
        return None


def build_executor(
    execution: Execution,
    model_call: ModelCall,
    loss: LossRule,
    stream: StreamState,
    target_count_fn: Callable[[Any, Any], int | torch.Tensor] | None,
    steps: StepPrograms | None,
) -> SegmentExecutor:
    """The executor ``execution`` names, over ``stream``; ``steps``: the step programs (``None`` where eager)."""
    if execution is Execution.EAGER:
        return SegmentExecutor(model_call, loss, stream, target_count_fn)
    assert steps is not None, "the trainer makes step programs wherever windows may run as programs"
    return ProgramExecutor(model_call, loss, stream, target_count_fn, steps)


class ProgramExecutor(SegmentExecutor):
    """The second executor: a window whole as one window program, where planning says so.

    A stream's first windows run eagerly all the same (:meth:`facts`), until the checks of a model call that need
    an eager call are done (the returned state's cut, the columns a reset handles), and so does every window while
    torch's profiler runs; eager segments run as :class:`~ignite_tbptt.runtime.SegmentExecutor` runs them. Up to
    ``limit`` window shapes keep a program; a new shape drops the least recently used.

    Args:
        model_call: runs the model (its autocast must not cache casts under capture).
        loss: how a segment's loss is computed and backpropagated, the eager executor's rule.
        stream: the stream's state.
        target_count_fn: ``target_count_fn(y_pred, y)``, a segment's target count, or ``None`` for ``y.numel()``; in
            a program it runs on the device and is read after the window (under capture: after the replay).
        steps: the optimizer's step programs, whose parameters (in the optimizer's order), static ``.grad`` buffers,
            capture (a CUDA graph's :class:`~ignite_tbptt.runtime.programs.capture.GraphCapture`, a
            :class:`~ignite_tbptt.runtime.programs.recording.Recorder`, or ``None``: the same program
            runs eagerly every window) and counts the window programs share.
        limit: the most window shapes given a program; a new one drops the least recently used.
    """

    def __init__(
        self,
        model_call: ModelCall,
        loss: LossRule,
        stream: StreamState,
        target_count_fn: Callable[[Any, Any], Any] | None,
        steps: StepPrograms,
        *,
        limit: int = 8,
    ) -> None:
        super().__init__(model_call, loss, stream, target_count_fn)
        self.parameters, self.gradients = steps.parameters, steps.gradients
        #: What the programs' graphs share (``None`` uncaptured), the step programs' too.
        self.graphs = graphs = steps.capture
        #: How the programs ran (``engine.state.programs``).
        self.counts = steps.counts
        if isinstance(graphs, Recorder):  # its errors name the model's tensors
            graphs.name_model(model_call.model)
        self.cache = ProgramCache(limit, self.counts)  # the window programs, by shape
        self.trained: list[torch.Tensor] = []  # the parameters that require grad, as the programs were built
        self._pointers: list[int] = []  # their storage then

    def facts(self) -> RuntimeFacts:
        """What planning weighs as a window opens (:func:`~ignite_tbptt.planning.plan_window`)."""
        # What a model call checks once runs eagerly: a stream's first call (no state), the call that checks that the
        # state returned was read from the state given, the call that checks the reset's columns. In recomputation
        # mode no eager call keeps a graph to check the state's cut on.
        stream = self.stream
        checked = self._state_cut_checked or stream.history.rebuilds
        return RuntimeFacts(profiling(), not checked or stream.hidden is None or self._columns_to_check is not None)

    def run_window(
        self, plans: Sequence[SegmentPlan], x: Any, y: Any, resets: Resets, offset: int, keep: bool
    ) -> list[SegmentResult]:
        """Run the open window, whose segments ``plans`` lists, as one :class:`WindowProgram`.

        Args:
            plans: the window's segments, as :func:`~ignite_tbptt.planning.plan_window` planned them.
            x: the batch's input, ``(T, B, *)`` along the time dimension (the trainer's ``time_dim``), whose first
                step is the stream's step ``offset``.
            y: the batch's targets, alike.
            resets: the columns that start a sequence (``(B,)`` bool), by step of the batch.
            offset: the stream's step at the batch's first.
            keep: hand the predictions on (``output_transform``).

        Returns:
            Each segment's result, as :meth:`run` gives it; the stream is then at the window's end, with its state
            and the window's loss.

        Raises:
            GraphCaptureError: where the capture of its program fails (``cuda_graphs=True``), or a
                program's recording refuses a host read (``cuda_graphs="recorded"``).
            RecordingError: with ``cuda_graphs="recorded"``, if a tensor its recording reads was freed, moved or
                resized since.
        """
        stream, steps = self.stream, self.model_call.layout.steps
        first, last = plans[0], plans[-1]
        xw, yw = steps(x, first.start - offset, last.end - offset), steps(y, first.start - offset, last.end - offset)
        starts = [resets.get(p.start - offset) for p in plans]
        self._check_parameters()
        calls = tuple(
            Call(p.start - first.start, p.end - first.start, mask is not None, p.whole_window)
            for p, mask in zip(plans, starts)
        )
        key = (xw.shape, xw.dtype, yw.shape, yw.dtype, calls, first.backward_mean)
        program = self.cache.fetch(key, lambda: WindowProgram(self, stream.hidden, xw, yw, calls, first.backward_mean))
        self.let_state_graph_go()
        results = program(stream.hidden, xw, yw, starts, keep)
        stream.hidden, stream.position = hs.unflatten(stream.hidden, results.states[-1]), last.end
        segments = []
        for plan, loss, n, predictions in zip(plans, results.losses, results.counts, results.predictions):
            stream.window_loss.add(loss, n, plan.whole_window)
            segments.append(SegmentResult(loss, n, predictions if keep else None))
        return segments

    def close_swept(self, plan: ClosePlan) -> None:
        """Close a window a program ran, and swept: drop the retained segments before it, which nothing reaches."""
        history = self.stream.history
        history.segments = history.segments[plan.keep_from :]

    def window_call(
        self, x: Any, y: Any, state: Any, starts: torch.Tensor | None, targets: int, backward_mean: bool
    ) -> CallPass:
        """One model call of a window and its loss, as a window program runs it.

        The eager executor's loss rule, so the same operations give the same gradients. ``target_count_fn``'s count
        stays on the device (a tensor, or an int fixed by the shapes), read once the program has run; as a 0-dim
        integer, as the eager path's ``int()`` makes it: the same multiplication. Without targets the mean is NaN
        (0 / 0), and the caller adds none of its gradients.

        Args:
            x: the call's input (a program's buffer, or a view of one).
            y: its targets, alike.
            state: the hidden state it starts from.
            starts: the columns that start a sequence at its first step (a mask), or ``None``.
            targets: the targets' number of elements.
            backward_mean: backpropagate the mean rather than the sum over the targets.
        """
        y_pred, hidden_out = self.model_call(x, state, None, False, starts)
        rule = self.loss
        count = None
        if self.target_count_fn is not None:
            count = torch.as_tensor(self.target_count_fn(y_pred, y)).reshape(()).long()
        mean = rule.mean(y_pred, y, targets, hidden_out)
        n = targets if count is None else count
        # LossRule.backpropagated's count is annotated as an int; it multiplies by a 0-dim tensor count alike.
        root = rule.root(rule.backpropagated(mean, n, backward_mean))
        return CallPass(mean, y_pred, hidden_out, root, count)

    def state_after(self, state: Any, into: list[torch.Tensor] | None = None) -> Any:
        """A program's window's returned state, detached, once its backward pass ran.

        ``into``: buffers made before capture, outside the graphs' memory pool, into which a captured program copies
        the state: the model's caches of the state point at them between replays, where the next graph's temporaries
        cannot reach (torch vouches for graphs sharing a pool only replayed in their capture order).
        """
        detached = hs.unflatten(state, [t.detach() for t in hs.flatten(state)])
        if into is not None:
            with torch.no_grad():
                torch._foreach_copy_(into, hs.flatten(detached))
            detached = hs.unflatten(state, into)
        if self.graphs is not None:  # a cache of the state would keep this run's graph, into the next capture
            repoint_caches(self.model_call.model, state, detached)
        return detached

    def let_state_graph_go(self) -> None:
        """Detach the stream's state before a program reads it, in the model's caches of it too.

        A program's window starts at its cut, so the state's graph (an eager window's; a program's state has none)
        is never backpropagated again. Alive, it would keep the parameters' AccumulateGrad nodes of the stream it
        ran on, which the program's backward pass on another stream, or under capture, would have to wait for.
        """
        stream = self.stream
        if any(t.requires_grad for t in hs.tensors(stream.hidden)):
            eager, stream.hidden = stream.hidden, hs.detached(stream.hidden)
            repoint_caches(self.model_call.model, eager, stream.hidden)
            del eager

    def clear(self) -> None:
        """Forget every program: the next windows run eagerly and are captured afresh."""
        self.cache.clear()
        self.trained, self._pointers = [], []

    def _check_parameters(self) -> None:
        # A program reads the parameters' storage and differentiates the parameters that required grad when it was
        # built: another set (a layer frozen or unfrozen, a parameter group added) or new storage (model.to(),
        # p.data = ...) means new programs.
        params = self.parameters()
        trained = [p for p in params if p.requires_grad]
        pointers = [p.data_ptr() for p in trained]
        if (
            len(trained) != len(self.trained)
            or pointers != self._pointers
            or any(a is not b for a, b in zip(trained, self.trained))
        ):
            self.clear()
            self.trained, self._pointers = trained, pointers
            if self.graphs is not None and trained:
                self.graphs.device = trained[0].device


class CallPass(NamedTuple):
    """One model call of a window inside a program, with its loss (:meth:`ProgramExecutor.window_call`)."""

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


class Call(NamedTuple):
    """One model call of a window: its steps, counted from the window's start, and whether it resets columns."""

    start: int
    end: int
    resets: bool
    #: Its loss is read as the mean over its targets (the call is its window), else as their sum.
    whole: bool


class WindowResults(NamedTuple):
    """What a window program's run gave, per call of its window (detached)."""

    #: Each call's loss: the mean over its targets where the call is its window, else their sum.
    losses: list[Any]
    #: Each call's target count.
    counts: list[int]
    #: The tensors of the hidden state after each call (the last: the window's).
    states: list[list[torch.Tensor]]
    #: Each call's predictions.
    predictions: list[Any]


class WindowProgram:
    """One shape of a window: its model calls, their losses and one backward pass to the window's start.

    Args:
        executor: what runs its window's calls (the program executor it belongs to).
        state: the window's input hidden state, which gives its buffers' shapes.
        x, y: the window's input and targets, ``(T, B, *)`` along the time dimension, which give the buffers' shapes.
        calls: the window's model calls.
        backward_mean: the loss is backpropagated as the mean over the window's targets, else as their sum.
    """

    def __init__(
        self,
        executor: ProgramExecutor,
        state: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        calls: Sequence[Call],
        backward_mean: bool,
    ) -> None:
        self.executor, self.calls, self.backward_mean = executor, calls, backward_mean
        # Written before each run in this order: input, targets, the input state, the calls' reset masks.
        inputs = self.inputs = StaticInputs()
        self.x, self.y = inputs.like(x), inputs.like(y)
        layout = executor.model_call.layout
        self.state = hs.unflatten(state, [inputs.like(t) for t in hs.flatten(state)])
        mask = torch.zeros(layout.columns(x), dtype=torch.bool, device=x.device)
        self.starts = [inputs.like(mask) if call.resets else None for call in calls]
        self.targets = [layout.steps(y, c.start, c.end).numel() for c in calls]
        self.state_out: list[torch.Tensor] | None = None  # where a captured program leaves the window's state
        self.program = Program(self._body, executor.graphs, "the window")

    def __call__(
        self,
        state: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        starts: Sequence[torch.Tensor | None],
        keep_predictions: bool = False,
    ) -> WindowResults:
        """Run the window on ``x``, ``y`` from ``state``.

        ``starts``: each call's reset mask; ``keep_predictions``: return the calls' predictions (a replay's are copied
        out for it), else ``None`` each.
        """
        # A mask where the key has one: the buffers match.
        self.inputs.write([x, y, *hs.flatten(state), *(mask for mask in starts if mask is not None)])
        (losses, states, predictions, grads, counts), fresh = self.program()
        # Read once the window has run, as the eager segments read theirs.
        counts = self.targets if counts is None else torch.stack(counts).tolist()
        if any(counts):
            self.executor.gradients.take(self.executor.trained, grads)
        losses, states = copied_out((losses, states), fresh)
        if fresh and self.state_out is not None:  # a warm-up's: the buffers are written again by the next run
            states[-1] = [t.clone() for t in states[-1]]
        predictions = copied_out(predictions, fresh) if keep_predictions else [None] * len(predictions)
        return WindowResults(losses, counts, states, predictions)

    def _body(self) -> tuple[list, list, list, list, Any]:
        executor = self.executor
        steps = executor.model_call.layout.steps
        state = self.state
        losses, states, predictions, roots, counts = [], [], [], [], []
        for c, starts, targets in zip(self.calls, self.starts, self.targets):
            x, y = steps(self.x, c.start, c.end), steps(self.y, c.start, c.end)
            passed = executor.window_call(x, y, state, starts, targets, self.backward_mean)
            state = passed.state
            count = targets if passed.count is None else passed.count
            losses.append(passed.mean.detach() if c.whole else (passed.mean * count).detach())
            states.append([t.detach() for t in hs.flatten(state)])
            predictions.append(hs.detached(passed.predictions))
            roots.append(passed.root)
            counts.append(passed.count)
        grads = self._gradients(roots, counts)
        if executor.graphs is not None and self.state_out is None:  # at the first run, before any capture
            self.state_out = [torch.empty_like(t) for t in hs.flatten(state)]
        # The model's caches of the state let go of the graph, and point outside the graphs' pool.
        states[-1] = hs.flatten(executor.state_after(state, self.state_out))
        return losses, states, predictions, grads, None if counts[0] is None else counts

    def _gradients(self, roots: list, counts: list) -> list:
        # The parameters' gradients of the window. With counts on the device, each call's loss apart, its gradient
        # masked where it has none.
        trained = self.executor.trained
        if counts[0] is None:
            return list(torch.autograd.grad(sum(roots[1:], roots[0]), trained, allow_unused=True))
        grads: list[torch.Tensor | None] = [None] * len(trained)
        for i, (root, count) in enumerate(zip(roots, counts)):
            call_grads = torch.autograd.grad(root, trained, retain_graph=i < len(roots) - 1, allow_unused=True)
            grads = _added(grads, _masked_by_count(call_grads, count))
        return grads


def _added(so_far: Sequence[torch.Tensor | None], more: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    # Gradients added as autograd adds them into .grad: a missing one (None) is no term.
    return [b if a is None else a if b is None else a + b for a, b in zip(so_far, more)]


def _masked_by_count(grads: Sequence[torch.Tensor | None], count: torch.Tensor) -> list[torch.Tensor | None]:
    """A call's gradients where ``count`` (its targets, a 0-dim tensor on the device) is positive, else zeros.

    A call without targets has the mean 0 / 0 and must add no gradient, as an eager segment without targets runs no
    backward pass; a program cannot read the count to skip the addition, so it adds zeros.
    """
    return [None if g is None else torch.where(count > 0, g, 0.0) for g in grads]
