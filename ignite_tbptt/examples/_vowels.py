"""The data, model and training of ``python -m ignite_tbptt.examples.vowels``.

:mod:`ignite_tbptt.examples.vowels` reads the options and forwards every name
here, imported when first asked for.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Events
from torch import nn

from ignite_tbptt import BitsPerTarget, count_targets, create_tbptt_evaluator, create_tbptt_trainer
from ignite_tbptt.data import pack_recordings
from ignite_tbptt.data import prepare_batch as default_prepare_batch

from .curves import log_figures, log_training

__all__ = [
    "SPEAKERS",
    "read_ts",
    "load_vowels",
    "SpeakerGRU",
    "cross_entropy",
    "train_on",
    "last_frame_accuracy",
    "compare",
    "run",
]

SPEAKERS = 9


def read_ts(path: Path) -> list[tuple[torch.Tensor, int]]:
    """The series of a multivariate ``.ts`` file (sktime's text format): ``(T, D)`` float32 tensors and labels.

    Each data line holds the ``D`` dimensions separated by ``:``, each a comma-separated series, then the label.
    """
    series = []
    data = False
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not data:
            data = line.lower() == "@data"
            continue
        if line:
            *dimensions, label = line.split(":")
            values = [[float(v) for v in dimension.split(",")] for dimension in dimensions]
            series.append((torch.tensor(values, dtype=torch.float32).t(), int(label) - 1))
    return series


def load_vowels() -> tuple[list, list]:
    """The training and test utterances, each ``(x, y)``: frames ``(T_i, 12)`` and the speaker per frame ``(T_i,)``.

    Raises:
        SystemExit: if sktime, which carries the data, is not installed.
    """
    spec = importlib.util.find_spec("sktime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the Japanese Vowels data ships with sktime: pip install sktime (or pip install -e .[dev]).")
    folder = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "JapaneseVowels"
    splits = []
    for split in ("TRAIN", "TEST"):
        utterances = read_ts(folder / f"JapaneseVowels_{split}.ts")
        splits.append([(x, torch.full((x.shape[0],), speaker, dtype=torch.int64)) for x, speaker in utterances])
    return splits[0], splits[1]


class SpeakerGRU(nn.Module):
    """A linear input layer, a GRU and a read-out over the speakers: ``(T, B, 12) -> (T, B, 9)``."""

    def __init__(self, features: int = 12, hidden: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.rnn = nn.GRU(hidden, hidden)
        self.readout = nn.Linear(hidden, SPEAKERS)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Speaker logits for every frame, and the hidden state after the last."""
        out, hidden = self.rnn(torch.tanh(self.inp(x)), hidden)
        return self.readout(out), hidden


def cross_entropy(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per frame) of logits ``(T, B, 9)`` against speakers ``(T, B)``, padding ignored."""
    return nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten(), ignore_index=-100)


def without_memory(batch: Any, device: Any, non_blocking: bool) -> tuple:
    """``prepare_batch`` of the memoryless baseline: every frame a start, so the state is reset at each one."""
    x, y, starts = default_prepare_batch(batch, device, non_blocking)
    return x, y, torch.ones_like(starts)


def fit(args: argparse.Namespace, utterances: list, memory: bool) -> SpeakerGRU:
    """A model trained on ``utterances``, its state carried along each one, or reset at every frame."""
    torch.manual_seed(args.seed)
    return train_on(SpeakerGRU(hidden=args.hidden), args, utterances, memory)


def train_on(model: nn.Module, args: argparse.Namespace, utterances: list, memory: bool, **options: Any) -> nn.Module:
    """Train ``model`` on ``utterances`` with TBPTT(``args.k1``, ``args.k2``) on ``args.device``.

    The model is moved to the device before its optimizer and trainer are built, so that both, and the initial value
    of any ``module_state`` in ``options``, live there; ``options`` go to the trainer.
    """
    device = torch.device(args.device)
    model.to(device)
    # Utterances start on window boundaries (align=k1): no start splits the fused model call of a window.
    batches = pack_recordings(utterances, args.batch_size, args.seq_len, shuffle=True, seed=args.seed, align=args.k1)
    trainer = create_tbptt_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=args.lr),
        cross_entropy,
        args.k1,
        args.k2,
        carry_hidden=True,
        target_count_fn=count_targets,  # padding frames do not count in the mean
        prepare_batch=default_prepare_batch if memory else without_memory,
        device=device,
        **options,
    )
    trainer.add_event_handler(Events.EPOCH_STARTED, lambda engine: batches.set_epoch(engine.state.epoch))
    log_training(trainer, args, "memory" if memory else "no_memory")
    trainer.run(batches, max_epochs=args.epochs)
    return model


def last_frame_accuracy(model: SpeakerGRU, utterances: list, memory: bool) -> float:
    """The share of utterances whose speaker the model names right at their last frame, each run alone."""
    right, device = 0, next(model.parameters()).device
    with torch.no_grad():
        for x, y in utterances:
            frames = x if memory else x[-1:]  # without memory, the last frame alone
            right += int(model(frames.unsqueeze(1).to(device))[0][-1, 0].argmax().item() == y[-1].item())
    return right / len(utterances)


def run(args: argparse.Namespace) -> dict:
    """Train with and without memory; returns the test bits per frame and accuracies, and chance's."""
    train_set, test_set = load_vowels()
    print(
        f"{len(train_set)} training and {len(test_set)} test utterances of 7-29 frames of 12 coefficients, "
        f"{SPEAKERS} speakers; TBPTT(k1={args.k1}, k2={args.k2})",
        flush=True,
    )
    return compare(args, train_set, test_set, fit, last_frame_accuracy)


def compare(
    args: argparse.Namespace, train_set: list, test_set: list, fit: Any, accuracy: Any, **evaluator_options: Any
) -> dict:
    """Train with ``fit(args, utterances, memory)`` with and without memory; test bits per frame and accuracies.

    ``accuracy(model, utterances, memory)`` is the share named right at the last frame; ``evaluator_options`` go to
    :func:`~ignite_tbptt.create_tbptt_evaluator` (``module_state``, say).
    """
    result: dict[str, Any] = {"chance_bits": math.log2(SPEAKERS), "chance_accuracy": 1 / SPEAKERS}
    for name, memory in (("memory", True), ("no_memory", False)):
        model = fit(args, train_set, memory)
        evaluator = create_tbptt_evaluator(
            model,
            {"bits": BitsPerTarget(cross_entropy)},  # counts the real frames only
            carry_hidden=True,
            prepare_batch=default_prepare_batch if memory else without_memory,
            device=args.device,
            **evaluator_options,
        )
        bits = evaluator.run(pack_recordings(test_set, args.batch_size, args.seq_len)).metrics["bits"]
        right = accuracy(model, test_set, memory)
        result[f"{name}_bits"], result[f"{name}_accuracy"] = bits, right
        log_figures(args, name, {"bits_per_frame": bits, "last_frame_accuracy": right})
        print(
            f"{name.replace('_', ' ')}: test {bits:.3f} bits per frame, speaker right at the last frame of "
            f"{right:.1%} of the utterances (chance: {math.log2(SPEAKERS):.2f} bits, {1 / SPEAKERS:.0%})",
            flush=True,
        )
    return result
