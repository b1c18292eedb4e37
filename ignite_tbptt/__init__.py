"""Generalised truncated backpropagation through time, TBPTT(k1, k2), for PyTorch-Ignite."""

from .adaptive import AdaptiveTruncation
from .artbp import ARTBP
from .clipping import GradientClipping, gradient_norm
from .engine import DeterministicTBPTTEngine, TBPTTEngine
from .evaluator import create_tbptt_evaluator
from .events import TBPTTEvents
from .masked import count_targets, masked_loss
from .metrics import BitsPerTarget, LossPerTarget, Perplexity
from .plot import plot_columns, plot_reach, plot_schedule
from .reach import GradientReach
from .resume import load_checkpoint
from .schedule import RandomWindows, Schedule, Window, WindowSource
from .tensorboard import attach_tensorboard
from .trainer import TBPTTStep, create_tbptt_trainer, default_model_fn, tbptt_training_step
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
    "default_model_fn",
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
    "masked_loss",
    "count_targets",
]
