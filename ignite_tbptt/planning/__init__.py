"""Planning: where windows end and cut, and what is done with each segment; pure arithmetic, free of torch and ignite.

A window source (:class:`WindowSource`) decides each window of a stream, ``[start, end)`` and its cut: fixed
TBPTT(k1, k2) windows (:class:`Schedule`), random lengths (:class:`RandomWindows`) or unbiased truncation
(:class:`ARTBP`). :func:`plan_segment` turns a window and the batch at hand into the decisions for one model call,
a :class:`SegmentPlan`, which the runtime only carries out. Modules here import nothing but the standard library,
each other and :mod:`ignite_tbptt.checks`, so every decision is tested without a tensor. A new window source goes
here, as a subclass of :class:`WindowSource`.
"""

from .artbp import ARTBP
from .random_windows import RandomWindows
from .schedule import Schedule
from .segment_plan import SegmentPlan, plan_segment
from .window import Window, WindowSource

__all__ = ["Window", "WindowSource", "Schedule", "RandomWindows", "ARTBP", "SegmentPlan", "plan_segment"]
