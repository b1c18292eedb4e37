"""The study's four tasks: real data that this package or a registry package ships, and a model for each.

- ``python``: the main job as it is (``ignite_tbptt.examples.char_lm``'s defaults): a character-level LSTM
  of 256 units on Python's standard-library sources, documents packed into 12 columns, the hidden state reset
  where each starts; validation bits per character.
- ``folk``: the same model on a different language: tunes of the Essen folk-song collection in ABC notation,
  as ``music21`` ships them (``music21/corpus/essenFolksong/*.abc``, read as text; music21 is not imported).
  Only the lines a tune is played from are kept (``X:`` number, ``M:`` metre, ``L:`` unit length, ``K:`` key
  and the notes); titles, sources and comments, in German, are dropped. The tunes are joined into one text
  cut into 12 columns (the classic language-model layout), so the state runs on from tune to tune.
- ``vowels``: ``ignite_tbptt.examples.vowels``: the speaker at every frame of the UCI Japanese Vowels (sktime's
  copy), a GRU of 32, recordings packed into 16 columns; 20% of the training utterances are held out.
- ``digits``: the long dependency. scikit-learn's 1,797 handwritten digits (8 x 8 pixels, UCI) are read pixel
  by pixel, each after a random gap of 0 to 31 blank pixels (so that digits do not line up with windows, as
  in a real stream); the class is the target at a digit's last pixel only. Its answer depends on strokes up
  to 63 steps before the target, the top of a 7 or a 9 say, so a backward pass shorter than that cannot
  learn from them directly. An LSTM of 64; validation bits per digit.
"""

from __future__ import annotations

import importlib.util
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ignite_tbptt.data import pack_recordings, stream_batches
from ignite_tbptt.examples import char_lm, vowels

IGNORE = -100


@dataclass
class Problem:
    """What one run trains on: batches, a model maker, the loss and a reference level of the metric."""

    train: Iterable
    valid: Iterable
    model: Callable[[], nn.Module]
    loss_fn: Callable
    reference: float  # bits per target of a model without memory of the sequence (unigram or chance)
    reference_name: str


@dataclass(frozen=True)
class Task:
    """A task of the study: its data and model (``load``), window lengths, time budget and learning rates."""

    name: str
    title: str
    unit: str
    ks: tuple[int, int, int, int, int]
    budget: float  # training seconds per run
    lrs: tuple[float, ...]
    load: Callable[[bool], Problem]


def cross_entropy(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits ``(T, B, C)`` against classes ``(T, B)``, -100 ignored."""
    return nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten(), ignore_index=IGNORE)


def python_code(quick: bool) -> Problem:
    """The main job's data and model (quick: its first 60,000 characters and 32 units)."""
    args = char_lm.parse_args(["--max-chars", "60000", "--hidden", "32"] if quick else [])
    vocab, train, valid, unigram = char_lm.load_data(args)
    return Problem(
        train,
        valid,
        lambda: char_lm.CharLSTM(len(vocab), args.embedding, args.hidden, args.layers),
        char_lm.cross_entropy,
        unigram,
        "unigram",
    )


def folk_tunes(max_chars: int = 1_200_000) -> str:
    """The Essen folk songs' tunes in ABC, the lines they are played from only, up to ``max_chars`` characters.

    Raises:
        SystemExit: if music21, which carries the tunes, is not installed.
    """
    spec = importlib.util.find_spec("music21")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the folk tunes ship with music21: pip install music21 (or pip install -e .[dev]).")
    folder = Path(next(iter(spec.submodule_search_locations))) / "corpus" / "essenFolksong"
    lines: list[str] = []
    size = 0
    for path in sorted(folder.glob("*.abc")):
        for line in path.read_text(encoding="latin-1").splitlines():
            line = line.rstrip()
            header = len(line) > 1 and line[1] == ":" and line[0].isalpha()
            if not line or line.startswith("%") or (header and line[0] not in "XMLK"):
                continue
            if line.startswith("X:") and lines:
                lines.append("")  # a blank line between tunes, as in the files
            lines.append(line)
            size += len(line) + 1
            if size >= max_chars:
                return "\n".join(lines)
    return "\n".join(lines)


def folk(quick: bool) -> Problem:
    """The folk tunes as one stream in 12 columns, the last 5% held out; the main job's model."""
    vocab, train, valid, unigram = char_lm.held_out_text(folk_tunes(60_000 if quick else 1_200_000), 0.05)
    hidden = 32 if quick else 256
    return Problem(
        stream_batches(train, 12, 100),
        stream_batches(valid, 8, 100),
        lambda: char_lm.CharLSTM(len(vocab), 64, hidden),
        char_lm.cross_entropy,
        unigram,
        "unigram",
    )


def held_out(items: list, fraction: float, seed: int = 0) -> tuple[list, list]:
    """``items`` shuffled with ``seed``, then split: the last ``fraction`` held out."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    cut = len(items) - round(len(items) * fraction)
    return [items[i] for i in order[:cut]], [items[i] for i in order[cut:]]


def speakers(quick: bool) -> Problem:
    """The vowels example's data and GRU; 20% of the training utterances held out for validation."""
    train, valid = held_out(vowels.load_vowels()[0], 0.2)
    if quick:
        train = train[:48]
    return Problem(
        pack_recordings(train, 16, 40, shuffle=True, seed=0),
        pack_recordings(valid, 16, 40),
        lambda: vowels.SpeakerGRU(hidden=32),
        vowels.cross_entropy,
        math.log2(vowels.SPEAKERS),
        "chance",
    )


class DigitReader(nn.Module):
    """An LSTM reading one pixel per step: ``(T, B, 1) -> (T, B, 10)`` logits of the digit's class."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, hidden)
        self.readout = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor, hidden: Any = None) -> tuple[torch.Tensor, Any]:
        out, hidden = self.lstm(x, hidden)
        return self.readout(out), hidden


def digit_recordings(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each digit as a recording: a gap of 0-31 blank pixels, then its 64 pixels (0-1), its class at the last."""
    from sklearn.datasets import load_digits  # scikit-learn ships the digits (it comes with sktime)

    digits = load_digits()
    rng = random.Random(seed)
    recordings = []
    for image, label in zip(digits.images, digits.target):
        gap = rng.randrange(32)
        x = torch.cat([torch.zeros(gap), torch.as_tensor(image, dtype=torch.float32).flatten() / 16]).unsqueeze(1)
        y = torch.full((x.shape[0],), IGNORE, dtype=torch.int64)
        y[-1] = int(label)
        recordings.append((x, y))
    return recordings


def digits(quick: bool) -> Problem:
    """The digits, 20% held out, packed into 16 columns of batches of 100 pixels."""
    train, valid = held_out(digit_recordings(), 0.2)
    if quick:
        train = train[:160]
    return Problem(
        pack_recordings(train, 16, 100, shuffle=True, seed=0),
        pack_recordings(valid, 16, 100),
        lambda: DigitReader(16 if quick else 64),
        cross_entropy,
        math.log2(10),
        "chance",
    )


TEXT_KS = (10, 25, 50, 100, 200)
TASKS = {
    task.name: task
    for task in (
        Task("python", "Python sources, char-level LSTM (the main job)", "bits/char", TEXT_KS, 50.0,
             (1e-3, 3e-3, 1e-2), python_code),
        Task("folk", "Essen folk songs in ABC, char-level LSTM", "bits/char", TEXT_KS, 20.0, (1e-3, 3e-3, 1e-2), folk),
        Task("vowels", "Japanese Vowels, speaker per frame, GRU", "bits/frame", (2, 4, 8, 16, 32), 5.0,
             (3e-3, 1e-2, 3e-2), speakers),
        Task("digits", "Digits pixel by pixel, class at the last pixel, LSTM", "bits/digit", (8, 16, 32, 64, 128),
             20.0, (3e-3, 1e-2, 3e-2), digits),
    )
}  # fmt: skip
