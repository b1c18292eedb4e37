"""Engine: the ignite wiring of the trainer and the evaluator.

:func:`create_tbptt_trainer` composes the process function of :func:`tbptt_training_step`, a
:class:`TBPTTProcessFunction`, with an ignite engine whose ``state_dict`` carries the stream (:class:`TBPTTEngine`). The
process function is the ignite adapter: it owns the run's lifecycle, fires :class:`TBPTTEvents`, keeps the counters in
``engine.state`` and saves the stream; the loop along a batch's segments and windows is a
:class:`~ignite_tbptt.engine.stream_loop.StreamLoop` and the accumulation and the optimizer step an
:class:`~ignite_tbptt.engine.optimizer_step.OptimizerStep`, which report what happened and fire nothing. Here too:
gradient reduction across processes, the configuration a checkpoint records, and :func:`create_tbptt_evaluator`. Modules
here may import ignite, :mod:`ignite_tbptt.planning`, :mod:`ignite_tbptt.runtime` and :mod:`ignite_tbptt.data`. Handlers
reach a trainer through :meth:`TBPTTProcessFunction.of`.
"""

from typing import Any

from ..checks import renamed
from .checkpoint import load_checkpoint
from .engine import DeterministicTBPTTEngine, TBPTTEngine
from .evaluator import create_tbptt_evaluator
from .events import TBPTTEvents
from .full_state_dict import FullStateDict
from .model_check import ModelCheck, Verdict, check_model
from .process import TBPTTProcessFunction
from .state import TBPTTState, tbptt_state
from .trainer import TrainingOptions, create_tbptt_trainer, tbptt_training_step

__all__ = [
    "create_tbptt_trainer",
    "tbptt_training_step",
    "TrainingOptions",
    "TBPTTProcessFunction",
    "TBPTTEngine",
    "DeterministicTBPTTEngine",
    "TBPTTEvents",
    "TBPTTState",
    "tbptt_state",
    "create_tbptt_evaluator",
    "load_checkpoint",
    "FullStateDict",
    "check_model",
    "ModelCheck",
    "Verdict",
]


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, {"TBPTTStep": ("TBPTTProcessFunction", TBPTTProcessFunction)})
