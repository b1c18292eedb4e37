"""TensorBoard curves of the examples: ``--logdir DIR``, one log directory under it per model an example trains.

The main job (:mod:`~ignite_tbptt.examples.char_lm`) logs every run, to a new ``runs/char_lm-DATE-TIME/`` unless
``--logdir`` names one. The other examples log where ``--logdir DIR`` is given: each model they train writes to
``DIR/NAME`` (``memory`` and ``no_memory``, ``tbptt-16-64``...) its training curves through
:func:`~ignite_tbptt.attach_tensorboard` (per-window loss, gradient norm, learning rate, throughput, memory, the
hyper-parameters and the schedule picture), and its held-out figures as scalars under ``test/`` once trained.
``tensorboard --logdir DIR`` then shows the models side by side.

Nothing here imports torch at module level: an example's command-line module adds the option without loading it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["log_directory", "add_logdir_option", "log_training", "log_figures"]


def log_directory(text: str) -> Path:
    """The path of a directory to log to: one that exists, or one that can be made (not a file)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; pass a directory")
    return path


def add_logdir_option(p: argparse.ArgumentParser) -> None:
    """``--logdir DIR``: write the TensorBoard curves of every model the example trains under ``DIR``."""
    p.add_argument(
        "--logdir",
        type=log_directory,
        default=None,
        help="write each trained model's TensorBoard curves to a directory under this one "
        "(to view them: tensorboard --logdir DIR; default: none)",
    )


def log_training(trainer: Any, args: argparse.Namespace, name: str) -> None:
    """Log ``trainer``'s run to ``args.logdir / name`` with ``attach_tensorboard``, closed as the run completes.

    Args:
        trainer: an engine from :func:`~ignite_tbptt.create_tbptt_trainer`, before it runs.
        args: the example's options; nothing is logged where ``args.logdir`` is None or absent.
        name: the model's directory under ``args.logdir``.
    """
    logdir = getattr(args, "logdir", None)
    if logdir is None:
        return
    from ignite.engine import Events

    from ignite_tbptt import attach_tensorboard

    tb = attach_tensorboard(trainer, Path(logdir) / name)
    trainer.add_event_handler(Events.COMPLETED, lambda _: tb.close())  # also after engine.terminate()


def log_figures(args: argparse.Namespace, name: str, figures: Mapping[str, float]) -> None:
    """Write a trained model's held-out ``figures`` to ``args.logdir / name`` as scalars ``test/KEY``, one each.

    Args:
        args: the example's options; nothing is written where ``args.logdir`` is None or absent.
        name: the model's directory under ``args.logdir``, as given to :func:`log_training`.
        figures: the figures by name, e.g. ``{"bits_per_frame": 0.41, "accuracy": 0.95}``.
    """
    logdir = getattr(args, "logdir", None)
    if logdir is None:
        return
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(Path(logdir) / name)) as writer:
        for key, value in figures.items():
            writer.add_scalar(f"test/{key}", value, 0)
