"""Whether a window or an optimizer step runs as a program (``cuda_graphs``), and why not: decided here alone.

Where the trainer runs windows as programs, the stream loop asks :func:`plan_window` at every window boundary and
:func:`plan_step` before every optimizer step; both take what the runtime knows as data (:class:`RuntimeFacts`: the
profiler, the model call's first checks, the optimizer, a distributed run, the step's handlers) and give their answer
through one function, :func:`program_refused`, so that a rule changed there changes every path. A window runs whole as
one program (its model calls and one backward pass to its start) where its whole course is planned before it runs and
stays inside it: the batch holds all of it, every step gets the gradient of the whole window, its gradient reach is not
recorded, it reaches back into no earlier window and no later one reaches into it (k2 = k1), and its calls keep their
activations (no ``recompute``). Otherwise it runs segment by segment, eagerly, and :class:`EagerReason` says why. An
optimizer step runs as a program where its optimizer skips itself on the device, in one process, with no handler of
``OPTIMIZER_STEP_STARTED`` that runs on the host. One window per replay: no program runs several windows (SPEC.md, "One
window per replay"). The window sources a program cannot run are refused here too, as a source is installed
(:func:`check_source`).
"""

from __future__ import annotations

import enum
import warnings
from typing import NamedTuple

from .batch_plan import BatchPlan
from .segment_plan import SegmentPlan
from .stream_planner import StreamPlanner
from .walk import StreamWalk
from .window import WindowSource

__all__ = [
    "EagerReason",
    "RuntimeFacts",
    "WindowExecution",
    "check_source",
    "plan_step",
    "plan_window",
    "program_refused",
]


class EagerReason(enum.Enum):
    """Why a window or an optimizer step runs eagerly where programs may run; its value names its count.

    A user reads the counts as ``engine.state.programs.eager`` (:class:`~ignite_tbptt.runtime.ProgramCounts`).
    """

    #: A stream's first windows: the model call's checks that need an eager call (the state returned was read from
    #: the state given, the columns a reset handles) are not yet done, or there is no hidden state yet.
    CHECKS = "checks"
    #: torch's profiler is running, whose ranges a program would not show.
    PROFILER = "profiler"
    #: The window's gradient reach is recorded (:class:`~ignite_tbptt.GradientReach`), a read on the host per segment.
    RECORDED = "recorded"
    #: The batch ends inside the window: its course depends on the next batch.
    BATCH_ENDS_INSIDE = "batch_ends_inside"
    #: Some steps of the window get their own loss only (a k2 < k1 cut).
    OWN_LOSS_ONLY = "own_loss_only"
    #: The window reaches back into earlier windows, or a later window reaches into it (k2 > k1): their segments keep
    #: their graphs across windows, which a program does not.
    REACHES_BACK = "reaches_back"
    #: Recomputation mode (``recompute``): the sweep rebuilds each segment's graph as it reaches it.
    RECOMPUTE = "recompute"
    #: An optimizer step whose optimizer cannot skip itself on the device (``_step_supports_amp_scaling``: torch's
    #: fused ``SGD``, ``Adam``, ``AdamW`` can).
    OPTIMIZER = "optimizer"
    #: An optimizer step of a distributed run: the gradients are summed over processes first, on the host's count.
    DISTRIBUTED = "distributed"
    #: An optimizer step with a handler of ``TBPTTEvents.OPTIMIZER_STEP_STARTED`` that runs on the host (one without
    #: a ``device_part``, or attached with a filter or arguments) after the division and before the step.
    HOST_HANDLERS = "host_handlers"


class RuntimeFacts(NamedTuple):
    """What the runtime knows as a window opens or a step is prepared: facts, which :func:`program_refused` weighs."""

    #: torch's profiler is running.
    profiling: bool = False
    #: The model call's checks that need an eager call are not done, or the stream has no hidden state yet.
    checks_pending: bool = False
    #: The optimizer skips its own step on the device, given the inf/NaN decision.
    optimizer_skips: bool = True
    #: Gradients are summed over processes before each step.
    distributed: bool = False
    #: A handler of ``OPTIMIZER_STEP_STARTED`` runs on the host, between the gradients' division and the step.
    host_handlers: bool = False


class WindowExecution(NamedTuple):
    """How the window that just opened runs (:func:`plan_window`)."""

    #: Its segments, planned, where it runs whole as one program; ``()`` where it runs segment by segment.
    segments: tuple[SegmentPlan, ...]
    #: Why it runs segment by segment; ``None`` where it runs as a program.
    eager: EagerReason | None


def program_refused(facts: RuntimeFacts, step: bool) -> EagerReason | None:
    """Why no program may run now, for a window (``step`` False) or an optimizer step; ``None`` where one may.

    The one rule every program of the trainer is run under: :func:`plan_window` and :func:`plan_step` ask it.
    """
    if facts.profiling:
        return EagerReason.PROFILER
    if not step:
        return EagerReason.CHECKS if facts.checks_pending else None
    if not facts.optimizer_skips:
        return EagerReason.OPTIMIZER
    if facts.distributed:
        return EagerReason.DISTRIBUTED
    return EagerReason.HOST_HANDLERS if facts.host_handlers else None


def plan_step(facts: RuntimeFacts) -> EagerReason | None:
    """Why the optimizer step about to be taken runs eagerly, or ``None``: it runs as a step program."""
    return program_refused(facts, step=True)


def plan_window(
    planner: StreamPlanner, batch: BatchPlan, position: int, one_window_per_step: bool, facts: RuntimeFacts
) -> WindowExecution:
    """How the window ``planner`` just opened at step ``position`` runs: as one program, or eagerly and why.

    Args:
        planner: the stream's planner, its window open; planning changes nothing.
        batch: the batch at hand.
        position: the stream's step, the window's first.
        one_window_per_step: as :func:`~ignite_tbptt.planning.plan_segment` takes it.
        facts: what the runtime knows now; an :class:`EagerReason` reason or ``None`` (``blocked``, before 0.5) is
            deprecated.

    Examples:
        >>> from ignite_tbptt.planning import RuntimeFacts, Schedule, StreamPlanner, plan_batch
        >>> planner = StreamPlanner(Schedule(k1=4, k2=4))
        >>> batch = plan_batch(0, 10, True, [6])
        >>> _ = planner.open_window(4, 2)
        >>> [(s.start, s.end) for s in plan_window(planner, batch, 4, False, RuntimeFacts()).segments]
        [(4, 6), (6, 8)]
        >>> _ = planner.open_window(8, 3)
        >>> plan_window(planner, plan_batch(8, 1, False, {}), 8, False, RuntimeFacts()).eager
        <EagerReason.BATCH_ENDS_INSIDE: 'batch_ends_inside'>
    """
    if not isinstance(facts, RuntimeFacts):  # the runtime's reason, as planning took it before 0.5 (``blocked``)
        warnings.warn(
            "plan_window(..., blocked) is deprecated: pass what the runtime knows as RuntimeFacts; the reason goes in "
            "0.6.",
            DeprecationWarning,
            stacklevel=2,
        )
        facts, refused = RuntimeFacts(), facts
    else:
        refused = program_refused(facts, step=False)
    if refused is None and planner.recorded:
        refused = EagerReason.RECORDED
    if refused is not None:
        return WindowExecution((), refused)
    segments = _window_segments(planner, batch, position, one_window_per_step)
    if isinstance(segments, EagerReason):
        return WindowExecution((), segments)
    if segments[0].window.cut != position or any(s.reached_later for s in segments):
        return WindowExecution((), EagerReason.REACHES_BACK)
    if segments[0].rebuilt:
        return WindowExecution((), EagerReason.RECOMPUTE)
    return WindowExecution(segments, None)


def _window_segments(
    planner: StreamPlanner, batch: BatchPlan, step: int, one_window_per_step: bool
) -> tuple[SegmentPlan, ...] | EagerReason:
    # The open window's segments as the walk plans them, up to the one that closes it (its close is not planned:
    # the planner is left as it is), or why it cannot run whole.
    plans: list[SegmentPlan] = []
    for plan in StreamWalk(planner, one_window_per_step).segments(batch, step):
        if plan.own_loss_only:
            return EagerReason.OWN_LOSS_ONLY
        plans.append(plan)
        if plan.closes_window:
            return tuple(plans)
    return EagerReason.BATCH_ENDS_INSIDE


def check_source(source: WindowSource, programs: bool, sharded: bool) -> None:
    """Refuse a window source, or a sharded run, that programs (``programs``) or FSDP2 (``sharded``) cannot take.

    Raises:
        ValueError: with programs, a source whose windows are not
            :attr:`~ignite_tbptt.planning.WindowSource.allows_programs` (k2 < k1, windows of varying length that
            reach back, ARTBP), or a sharded model (FSDP2's collectives are not captured); with a sharded model, a
            source that learns from the run (each process would choose its own windows).
    """
    if sharded and not source.standalone:
        raise ValueError(
            f"{type(source).__name__} with a model sharded by FSDP2: each process would choose its own windows from "
            "its own measurements, and their backward passes (each with FSDP2's collectives) would differ. "
            "Use fixed windows (k1, k2), or windows of the same seed on every process (RandomWindows, ARTBP)."
        )
    if not programs:
        return
    if sharded:
        raise ValueError(
            "cuda_graphs with a model sharded by FSDP2: its gathers and reduce-scatters run in every model "
            "call and are not captured. Pass cuda_graphs=False."
        )
    if not source.allows_programs:
        k1, k2 = getattr(source, "k1", None), getattr(source, "k2", None)
        raise ValueError(
            f"cuda_graphs captures fixed windows of TBPTT(k1, k2) with k2 >= k1; {type(source).__name__} has "
            f"k1 = {k1}, k2 = {k2}: steps before a k2 < k1 cut get their own loss only, windows of varying length "
            "are cut at places of every kind, or the gradient is reweighted inside the sweep (ARTBP). Use fixed "
            "windows with k2 >= k1, or pass cuda_graphs=False."
        )
