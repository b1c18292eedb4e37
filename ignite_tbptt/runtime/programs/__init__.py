"""The graph wing: windows and optimizer steps run as programs over static buffers (``cuda_graphs``).

A program is a body of tensor operations on static buffers that runs eagerly every time (``"uncaptured"``), is captured
once in a CUDA graph and replayed (``True``), or is recorded operator by operator and its recording run again under
capture's rules on any device (``"recorded"``, :mod:`.recording`); :mod:`.capture` holds the program, its capture, the
cache that keeps programs by shape and the counts of how they ran (:class:`ProgramCounts`). :class:`ProgramExecutor`
(:mod:`.window`), the second executor, runs a window whole as a :class:`WindowProgram`, and the optimizer step after it
as a :class:`StepProgram` (:mod:`.step`): one window per replay, and one step. Modules here import the rest of
:mod:`ignite_tbptt.runtime` and :mod:`ignite_tbptt.planning`; the runtime imports this package only in its own
``__init__``.
"""

from .capture import GraphCapture, GraphCaptureError, Program, ProgramCache, ProgramCounts
from .recording import GraphReplayError, Recorder, RecordingError
from .step import StaticGradients, StepHandler, StepHandlers, StepProgram, StepPrograms
from .window import Execution, ProgramExecutor, WindowProgram, build_executor

__all__ = [
    "Execution",
    "build_executor",
    "ProgramExecutor",
    "WindowProgram",
    "StepPrograms",
    "StepProgram",
    "StepHandler",
    "StepHandlers",
    "StaticGradients",
    "Program",
    "GraphCapture",
    "GraphCaptureError",
    "Recorder",
    "RecordingError",
    "GraphReplayError",
    "ProgramCache",
    "ProgramCounts",
]
