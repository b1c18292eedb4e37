"""Adapters for models of other libraries whose state the trainer cannot carry as they are.

:mod:`~ignite_tbptt.models.mamba2` runs Hugging Face's Mamba2 with its state as a tree of tensors,
:mod:`~ignite_tbptt.models.fla` the models of flash-linear-attention (GatedDeltaNet, GLA, DeltaNet, Mamba2). Each
adapter imports its library only when called, so ``import ignite_tbptt`` needs none of them.
"""

from .fla import fla_model_fn, fla_reset_hidden
from .mamba2 import check_mamba2_schedule, mamba2_model_fn, mamba2_reset_hidden

__all__ = ["mamba2_model_fn", "mamba2_reset_hidden", "check_mamba2_schedule", "fla_model_fn", "fla_reset_hidden"]
