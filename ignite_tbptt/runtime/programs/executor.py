"""The second executor: windows run as programs over static buffers, captured once in CUDA graphs and replayed.

Where the model is small, a GPU step is bound by kernel launches: a window of a GRU of 8 units is some fifty
launches of a few microseconds each, which a CUDA graph records once and replays as one. :class:`ProgramExecutor`
runs a window whole as one sweep program (:mod:`~ignite_tbptt.runtime.programs.sweep`) where planning says it may
(:func:`~ignite_tbptt.planning.plan_window`), one window per replay, and every other window segment by segment, as
the eager :class:`~ignite_tbptt.runtime.SegmentExecutor` runs it. Its programs read their inputs from static
buffers and add the window's gradients into the parameters' static ``.grad`` buffers as autograd's backward pass
would, where the step programs (:mod:`~ignite_tbptt.runtime.programs.step`) read them.

:class:`Execution` names how: eagerly; as programs uncaptured (the same operations on the same buffers every window,
on any device: the eager parameters bit for bit); captured in CUDA graphs (``warmup`` eager runs on a side stream, one
capture, replays after); or recorded and replayed under capture's rules on any device
(:mod:`~ignite_tbptt.runtime.programs.replayed_capture`).

Sources: PyTorch's CUDA semantics notes, "CUDA Graphs" (whole-network capture: warm-up on a side stream, static
inputs copied in, outputs read after ``replay()``, ``torch.autocast(..., cache_enabled=False)`` under capture,
a memory pool shared by graphs that do not run concurrently).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...planning import ClosePlan, RuntimeFacts, SegmentPlan
from .. import hidden as hs
from .. import rng
from ..backward_sweep import Recomputation, Segment
from ..executor import SegmentExecutor, SegmentResult
from ..loss_rule import LossRule
from ..model_call import ModelCall
from ..module_state import repoint_caches
from ..profiling import profiling
from ..reset import Resets
from ..stream import StreamState
from .cache import ProgramCache
from .capture import GraphCapture
from .replayed_capture import ReplayedCapture
from .step import StepPrograms
from .sweep import Call, CallPass, ReachWeights, SweepProgram, reach_of, recomputable_from

__all__ = ["Execution", "build_executor", "ProgramExecutor"]


class Execution(enum.Enum):
    """How a trainer's windows run, decided once where its options are read (``cuda_graphs``)."""

    #: Every segment by the eager :class:`~ignite_tbptt.runtime.SegmentExecutor` (``cuda_graphs=False``).
    EAGER = "eager"
    #: Windows as programs where planning says so, run uncaptured, on any device (``cuda_graphs="uncaptured"``).
    PROGRAMS = "programs"
    #: Windows as programs where planning says so, captured in CUDA graphs (``cuda_graphs=True``).
    CUDA_GRAPHS = "cuda_graphs"
    #: Programs recorded once and replayed without their Python, under capture's rules, on any device
    #: (``cuda_graphs="replayed"``, :mod:`~ignite_tbptt.runtime.programs.replayed_capture`).
    REPLAYED = "replayed"

    def graph_capture(self, warmup: int = 3) -> GraphCapture | None:
        """What captures this execution's programs: a CUDA graph's, a recording's, or nothing (run every time)."""
        if self is Execution.CUDA_GRAPHS:
            return GraphCapture(warmup)
        if self is Execution.REPLAYED:
            return ReplayedCapture(warmup)
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


def _storages_by_name(model: torch.nn.Module) -> dict[int, str]:
    named = [*model.named_parameters(), *model.named_buffers()]
    return {t.untyped_storage().data_ptr(): f"the model's {name}" for name, t in named}


class ProgramExecutor(SegmentExecutor):
    """The second executor: a window whole as one sweep program, where planning says so.

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
            :class:`~ignite_tbptt.runtime.programs.replayed_capture.ReplayedCapture`, or ``None``: the same program
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
        if isinstance(graphs, ReplayedCapture):  # its errors name the model's tensors
            graphs.name(lambda: _storages_by_name(model_call.model))
        self.programs = ProgramCache(limit, self.counts)  # window and sweep programs
        self.trained: list[torch.Tensor] = []  # the parameters that require grad, as the programs were built
        self._trained_index: list[int] = []  # their places among the parameters
        self.reach_weights = ReachWeights()  # the weights of the versions sweep programs reach
        self._pointers: list[int] = []  # their storage then

    def facts(self) -> RuntimeFacts:
        """What planning weighs as a window opens (:func:`~ignite_tbptt.planning.plan_window`)."""
        # What a model call checks once runs eagerly: a stream's first call (no state), the call that checks that the
        # state returned was read from the state given, the call that checks the reset's columns. In recomputation
        # mode no eager call keeps a graph to check the state's cut on.
        stream = self.stream
        pending = (
            not (self._state_cut_checked or stream.history.rebuilds)
            or stream.hidden is None
            or self._columns_to_check is not None
        )
        return RuntimeFacts(profiling(), pending, recomputable_from(stream.history.segments, stream.position))

    def run_sweep(
        self, plans: Sequence[SegmentPlan], x: Any, y: Any, resets: Resets, offset: int, keep: bool
    ) -> list[SegmentResult]:
        """Run the open window, whose segments ``plans`` lists, as a sweep program (:mod:`.sweep`).

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
            and the window's loss, and the segments a later window reaches have joined the history as what
            recomputes them.

        Raises:
            GraphCaptureError: where the capture of its program fails (``cuda_graphs=True``), or a replayed
                program's recording refuses a host read (``cuda_graphs="replayed"``).
            GraphReplayError: with ``cuda_graphs="replayed"``, if a tensor its recording reads was freed, moved or
                resized since.
            ValueError: at its program's first run, if the window runs forward passes again (k2 > k1, or
                ``recompute``) and the model drew random numbers; nothing of the window is applied.
        """
        stream, steps = self.stream, self.model_call.layout.steps
        first, last = plans[0], plans[-1]
        reach = reach_of(stream.history.segments, first.window.cut, first.start)
        assert reach is not None, "planning runs a window as a program only where its reach recomputes whole"
        xw, yw = steps(x, first.start - offset, last.end - offset), steps(y, first.start - offset, last.end - offset)
        starts = [resets.get(p.start - offset) for p in plans]
        self._check_parameters()
        calls = tuple(
            Call(p.start - first.start, p.end - first.start, mask is not None, p.whole_window)
            for p, mask in zip(plans, starts)
        )
        key = (xw.shape, xw.dtype, yw.shape, yw.dtype, calls, first.backward_mean, SweepProgram.key(reach))
        mean, rebuilds = first.backward_mean, first.rebuilt
        program = self.programs.fetch(
            key, lambda: SweepProgram(self, reach, stream.hidden, xw, yw, calls, mean, rebuilds)
        )
        self.let_state_graph_go()
        history = stream.history
        history.keep_only_recomputations(len(reach))
        # Segments a later window reaches, and so a reach, are kept only where weight versions are (k2 > k1).
        versions = history.versions
        values = []
        if reach:
            assert versions is not None, "a reach back is kept with its weight versions"
            values = self.reach_weights(versions, reach, self._trained_index)
        results = program(reach, values, stream.hidden, xw, yw, starts, keep)
        state = stream.hidden
        for plan, call, mask, after in zip(plans, calls, starts, results.states):
            if plan.reached_later:  # it joins the history as what recomputes it
                assert versions is not None, "a segment a later window reaches is kept with its weight version"
                segment_x = steps(xw, call.start, call.end)
                recomputation = Recomputation(
                    segment_x, state, rng.capture(xw.device), versions.current, plan.hidden_requires_grad, mask
                )
                history.append(Segment(plan.start, plan.end, [], None, recomputation=recomputation))
            state = hs.unflatten(state, after)
        stream.hidden, stream.position = state, last.end
        segments = []
        for plan, loss, n, predictions in zip(plans, results.losses, results.counts, results.predictions):
            stream.window_loss.add(loss, n, plan.whole_window)
            segments.append(SegmentResult(loss, n, predictions if keep else None))
        return segments

    def close_swept(self, plan: ClosePlan) -> None:
        """Close a window a sweep program ran, and swept: only drop the segments no later window reaches."""
        history = self.stream.history
        history.segments = history.segments[plan.keep_from :]

    def window_call(
        self, x: Any, y: Any, state: Any, starts: torch.Tensor | None, targets: int, backward_mean: bool
    ) -> CallPass:
        """One model call of a window and its loss, as a sweep program runs it.

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

    def state_after(self, state: Any) -> Any:
        """A program's window's returned state, detached, once its backward pass ran."""
        detached = hs.unflatten(state, [t.detach() for t in hs.flatten(state)])
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
        self.programs.clear()
        self.reach_weights.clear()
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
            self._trained_index = [i for i, p in enumerate(params) if p.requires_grad]
