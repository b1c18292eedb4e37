"""Lightning: exact TBPTT(k1, k2) on PyTorch Lightning's ``Trainer`` (``pip install "ignite-tbptt[lightning]"``).

:class:`TBPTTModule` is a ``LightningModule`` whose ``training_step`` runs the batch through the trainer of
:func:`~ignite_tbptt.create_tbptt_trainer`, built by :func:`~ignite_tbptt.tbptt_training_step`: Lightning supplies the
loop over batches and epochs, the optimizer wrapper, the logging and the checkpoints, never its own windows, cuts or
normalisation. Modules here import Lightning, and the package's public names.
"""

from .module import TBPTTModule

__all__ = ["TBPTTModule"]
