"""Generalised truncated backpropagation through time, TBPTT(k1, k2), for PyTorch-Ignite.

The package is layered (docs/architecture.md): :mod:`~ignite_tbptt.planning` decides windows, cuts and segments
without torch; :mod:`~ignite_tbptt.runtime` carries the plans out with torch, without ignite;
:mod:`~ignite_tbptt.engine` wires them into ignite; :mod:`~ignite_tbptt.handlers` attach to a trainer;
:mod:`~ignite_tbptt.data` lays out batches. The names below are the public API.
"""

from .data import count_targets, masked_loss
from .engine import (
    DeterministicTBPTTEngine,
    FullStateDict,
    TBPTTEngine,
    TBPTTEvents,
    TBPTTStep,
    create_tbptt_evaluator,
    create_tbptt_trainer,
    load_checkpoint,
    tbptt_training_step,
)
from .handlers import AdaptiveTruncation, GradientClipping, GradientReach, attach_tensorboard, gradient_norm
from .metrics import BitsPerTarget, LossPerTarget, Perplexity
from .planning import ARTBP, RandomWindows, Schedule, Window, WindowSource, walk
from .plot import plot_columns, plot_reach, plot_schedule
from .runtime import default_model_fn, default_reset_hidden
from .version import __version__ as __version__

__all__ = [
    "create_tbptt_trainer",
    "tbptt_training_step",
    "TBPTTStep",
    "TBPTTEngine",
    "DeterministicTBPTTEngine",
    "TBPTTEvents",
    "Schedule",
    "RandomWindows",
    "AdaptiveTruncation",
    "ARTBP",
    "Window",
    "WindowSource",
    "walk",
    "default_model_fn",
    "default_reset_hidden",
    "create_tbptt_evaluator",
    "LossPerTarget",
    "BitsPerTarget",
    "Perplexity",
    "GradientClipping",
    "GradientReach",
    "gradient_norm",
    "plot_schedule",
    "plot_columns",
    "plot_reach",
    "attach_tensorboard",
    "load_checkpoint",
    "FullStateDict",
    "masked_loss",
    "count_targets",
]
