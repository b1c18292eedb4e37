"""Adapters for models of other libraries whose state the trainer cannot carry as they are.

:mod:`~ignite_tbptt.models.mamba2` runs Hugging Face's Mamba2 with its state as a tree of tensors. Each adapter imports
its library only when called, so ``import ignite_tbptt`` needs none of them.
"""

from .mamba2 import check_mamba2_schedule, mamba2_model_fn, mamba2_reset_hidden

__all__ = ["mamba2_model_fn", "mamba2_reset_hidden", "check_mamba2_schedule"]
