"""The graph wing: windows and optimizer steps run as programs over static buffers (``cuda_graphs``).

A program is a body of tensor operations on static buffers that runs eagerly every time (``"uncaptured"``), is
captured once in a CUDA graph and replayed (``True``, :mod:`.capture`), or is recorded operator by operator and
replayed under capture's rules on any device (``"replayed"``, :mod:`.replayed_capture`). :class:`ProgramExecutor`
(:mod:`.executor`), the second executor, runs a window that is one model call paid at once, or several calls, or one
that reaches back (k2 > k1), as a :class:`SweepProgram` (:mod:`.sweep`), and the optimizer step after it as a
:class:`StepProgram` (:mod:`.step`): one window per replay, and one step. Programs are kept by shape in a
:class:`ProgramCache` (:mod:`.cache`), which counts captures, replays, warm-ups and eager windows
(:class:`ProgramCounts`). Modules here import the rest of :mod:`ignite_tbptt.runtime` and
:mod:`ignite_tbptt.planning`; the runtime imports this package only in its own ``__init__``.
"""

from .cache import ProgramCache, ProgramCounts
from .capture import GraphCapture, GraphCaptureError, Program
from .executor import Execution, ProgramExecutor, build_executor
from .replayed_capture import GraphReplayError, ReplayedCapture
from .step import StaticGradients, StepHandler, StepHandlers, StepProgram, StepPrograms
from .sweep import SwappedWeights, SweepProgram

__all__ = [
    "Execution",
    "build_executor",
    "ProgramExecutor",
    "SweepProgram",
    "SwappedWeights",
    "StepPrograms",
    "StepProgram",
    "StepHandler",
    "StepHandlers",
    "StaticGradients",
    "Program",
    "GraphCapture",
    "GraphCaptureError",
    "ReplayedCapture",
    "GraphReplayError",
    "ProgramCache",
    "ProgramCounts",
]
