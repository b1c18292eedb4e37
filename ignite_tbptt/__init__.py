"""Generalised truncated backpropagation through time, TBPTT(k1, k2), for PyTorch-Ignite."""

from .events import TBPTTEvents
from .schedule import Schedule
from .trainer import TBPTTStep, create_tbptt_trainer, default_model_fn, tbptt_training_step

__all__ = ["create_tbptt_trainer", "tbptt_training_step", "TBPTTStep", "TBPTTEvents", "Schedule", "default_model_fn"]
__version__ = "0.1.0"
