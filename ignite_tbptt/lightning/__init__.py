"""Lightning: exact TBPTT(k1, k2) on PyTorch Lightning's ``Trainer`` (``pip install "ignite-tbptt[lightning]"``).

:class:`TBPTTModule` is a ``LightningModule`` whose ``training_step`` runs the batch through the trainer of
:func:`~ignite_tbptt.create_tbptt_trainer`, built by :func:`~ignite_tbptt.tbptt_training_step`: Lightning supplies the
loop over batches and epochs, the optimizer wrapper, the logging and the checkpoints, never its own windows, cuts or
normalisation. Modules here import Lightning, and the package's public names.

Raises:
    ModuleNotFoundError: on import, where PyTorch Lightning is not installed; the message names the extra to install.
"""

try:
    import lightning.pytorch  # noqa: F401  (the one dependency the rest of the package does without)
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        'ignite_tbptt.lightning needs PyTorch Lightning 2.6 or newer: pip install "ignite-tbptt[lightning]" '
        f"(importing it failed: {error})",
        name=error.name,
    ) from error

from .module import TBPTTModule  # noqa: E402

__all__ = ["TBPTTModule"]
