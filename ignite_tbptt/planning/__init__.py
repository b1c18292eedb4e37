"""Planning: where windows end and cut, and what is done with each segment; pure arithmetic, free of torch and ignite.

A window source (:class:`WindowSource`) decides each window of a stream, ``[start, end)`` and its cut: fixed
TBPTT(k1, k2) windows (:class:`Schedule`), random lengths (:class:`RandomWindows`) or unbiased truncation
(:class:`ARTBP`). :func:`plan_segment` turns a window and the batch at hand into the decisions for one model call,
a :class:`SegmentPlan`, and :func:`plan_close` the close of a window into its cut, the next window and every step
of its backward sweep, a :class:`ClosePlan`; the runtime only carries them out. A :class:`StreamPlanner` asks the
source for one stream and makes both plans, each batch's bounds coming from :func:`plan_batch`;
:class:`ReachRequests` decides which windows record their gradient reach, and :func:`plan_window` and
:func:`plan_step` whether a window or an optimizer step runs as a program (``cuda_graphs``), one rule answering both
(:func:`program_refused`). :func:`walk` makes every
plan the trainer makes over a stream without running anything, for whatever needs to know where windows, segments
and cuts fall.
Modules here import nothing but the standard library, each other and :mod:`ignite_tbptt.checks`, so every decision
is tested without a tensor. A new window source goes here, as a subclass of :class:`WindowSource`.
"""

from typing import Any

from ..checks import renamed
from .artbp import ARTBP
from .batch_plan import BatchPlan, plan_batch
from .close_plan import ClosePlan, SweepStep, plan_close
from .execution import EagerReason, RuntimeFacts, WindowExecution, check_source, plan_step, plan_window, program_refused
from .random_windows import RandomWindows
from .reach import ReachRequests
from .schedule import Schedule, k2_cut
from .segment_plan import SegmentPlan, plan_segment
from .stream_planner import StreamPlanner
from .walk import Planned, walk
from .window import Window, WindowSource

__all__ = [
    "Window",
    "WindowSource",
    "Schedule",
    "k2_cut",
    "RandomWindows",
    "ARTBP",
    "SegmentPlan",
    "plan_segment",
    "ClosePlan",
    "SweepStep",
    "plan_close",
    "ReachRequests",
    "StreamPlanner",
    "BatchPlan",
    "plan_batch",
    "Planned",
    "walk",
    "EagerReason",
    "RuntimeFacts",
    "WindowExecution",
    "plan_window",
    "plan_step",
    "program_refused",
    "check_source",
]


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, {"Eager": ("EagerReason", EagerReason)})
