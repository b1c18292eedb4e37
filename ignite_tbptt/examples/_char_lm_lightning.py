"""The main job on Lightning's ``Trainer``: ``python -m ignite_tbptt.examples.char_lm --trainer lightning``.

The same data (:func:`~ignite_tbptt.examples._char_lm.load_data`), model, Adam, clipping and TBPTT(k1, k2) as the
ignite run of ``_char_lm``, trained by :class:`~ignite_tbptt.lightning.TBPTTModule`: Lightning's ``Trainer`` runs the
epochs, validates after each (the stream evaluator, the state carried along the validation text), logs to
TensorBoard (``train_loss``, ``grad_norm``, ``lr-Adam``, ``val_loss``; x-axis: batches) and writes a checkpoint at each
epoch's end, which ``--resume`` continues from. The command line checked that Lightning is installed
(``pip install "ignite-tbptt[lightning]"``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from .. import ARTBP
from ..data import count_targets
from ..lightning import TBPTTModule
from ._char_lm import LN2, CharLSTM, choose_logdir, cross_entropy, epoch_line, load_data

__all__ = ["CharModule", "train_lightning"]


class CharModule(TBPTTModule):
    """The main job's ``TBPTTModule``: Adam at ``lr``, the rest :class:`~ignite_tbptt.lightning.TBPTTModule`'s."""

    def __init__(self, *args: Any, lr: float, **options: Any) -> None:
        super().__init__(*args, **options)
        self.lr = lr

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Adam at the job's learning rate, as the ignite run's."""
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class _Report(Callback):
    # Prints each epoch's validation bits per character as the ignite run does, and keeps them in the history.

    def __init__(self, history: dict) -> None:
        self.history = history

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        bpc = trainer.callback_metrics["val_loss"].item() / LN2
        last = trainer.callback_metrics.get("train_loss_step")
        print(epoch_line(self.history, trainer.current_epoch + 1, bpc, None if last is None else last.item() / LN2))


def train_lightning(args: argparse.Namespace) -> dict:
    """Train as ``_char_lm.run`` does, on Lightning's ``Trainer``; the same history."""
    choose_logdir(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    vocab, train_batches, valid, unigram = load_data(args)
    module = CharModule(
        CharLSTM(len(vocab), args.embedding, args.hidden, args.layers),
        cross_entropy,
        ARTBP(grid=args.artbp_grid, mean_length=args.artbp, seed=args.seed) if args.artbp else args.k1,
        None if args.artbp else args.k2,
        lr=args.lr,
        carry_hidden=True,
        gradient_accumulation_steps=args.accumulation,
        target_count_fn=count_targets,  # padding does not count in the mean
        gradient_clip_val=args.clip if args.clip > 0 else None,
    )
    history: dict = {"unigram_bpc": unigram, "valid_bpc": [], "train_bpc": []}
    args.logdir.mkdir(parents=True, exist_ok=True)
    print(
        f"TensorBoard logs: {args.logdir}/ (to view them: tensorboard --logdir {args.view})\n"
        f"checkpoints: {args.logdir / 'checkpoints'}/, at each epoch's end (--resume FILE continues from one)",
        flush=True,
    )
    # The batches as a list (a map-style dataset of known length: Lightning knows the epoch's last batch, where the
    # trainer applies the windows not yet applied); batch_size=None hands each on as it is.
    lightning_trainer(args, history).fit(
        module,
        DataLoader(list(train_batches), batch_size=None),
        DataLoader(list(valid), batch_size=None),
        ckpt_path=args.resume,
    )
    return {**history, "logdir": str(args.logdir), "interrupted": None}


def lightning_trainer(args: argparse.Namespace, history: dict) -> Trainer:
    """Lightning's ``Trainer`` for the job's options: device, precision, TensorBoard, epoch-end checkpoints."""
    device = torch.device(args.device)
    return Trainer(
        max_epochs=args.epochs,
        accelerator=device.type,
        devices=[device.index or 0] if device.type == "cuda" else 1,
        # fp16 is refused on the CPU as the options are read, where Lightning would train bf16-mixed instead.
        precision={"none": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[args.amp],
        logger=TensorBoardLogger(args.logdir, name="", version="", default_hp_metric=False),
        callbacks=[
            _Report(history),
            LearningRateMonitor(logging_interval="step"),  # lr-Adam
            ModelCheckpoint(dirpath=args.logdir / "checkpoints", save_last=True, save_on_train_epoch_end=True),
        ],
        num_sanity_val_steps=0,  # validation after each epoch, as the ignite run
        enable_progress_bar=not args.no_progress and sys.stderr.isatty(),
        enable_model_summary=False,
        log_every_n_steps=10,
    )
