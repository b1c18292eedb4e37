"""The prequential study's streams: real data read once, in order, by a model that predicts before it learns.

- ``python``: the first 120,000 characters of the main corpus (Python's standard-library sources, as the main job
  reads them), cut into 12 columns read side by side, each a contiguous part; the next character at every step.
- ``power``: a real numeric time series. Recordings of sktime's ACSF1 (the appliance consumption signatures of
  Gisler et al. 2013, "A new dataset of appliance consumption signatures"; 1,460 readings of one appliance's
  electric power each, 10 kinds of appliance, 10 recordings of a kind in a row): the first 80 of the 200 in the
  files' order, dealt in turn to 8 columns and laid end to end there (14,600 readings a column), so that each column
  meets the kinds one after another; the next reading at every step, squared error on
  the readings as sktime ships them (each recording scaled to mean 0 and standard deviation 1). Chosen as the
  longest real series sktime carries on disk, whose structure (on/off cycles of tens to hundreds of readings, a new
  appliance every 1,460) rewards reach and adaptation both.
- ``shift``: adaptation. Each of 12 columns reads a part of the Python sources and then a part of the Essen folk
  tunes in ABC notation (:func:`benchmarks.tradeoff.tasks.folk_tunes`): the statistics change at the same step in
  every column, two thirds of the way along, from one language to another the model has not seen (120,000
  characters in all).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.tradeoff.tasks import folk_tunes
from ignite_tbptt.examples import char_lm

LENGTH = 100  # steps per batch, as the main job


@dataclass
class Stream:
    """What a prequential run reads once: its batches, a model maker, the loss, and a reference level."""

    batches: list[tuple[torch.Tensor, torch.Tensor]]
    model: Callable[[], nn.Module]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    reference: float  # the same loss of a model without memory (unigram, or the last reading)
    reference_name: str
    unit_per_loss: float = 1.0  # the reported unit per unit of loss_fn: 1 / ln 2 for bits from nats
    change: int | None = None  # the step where the statistics change, if they do at a known one


@dataclass(frozen=True)
class OnlineTask:
    """A stream of the study, its window lengths and learning rates."""

    name: str
    title: str
    unit: str
    ks: tuple[int, int, int, int, int]
    lrs: tuple[float, ...]
    load: Callable[[bool], Stream]


def column_batches(columns: torch.Tensor, length: int = LENGTH) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive batches of ``columns`` ``(T, B, *)``: inputs the steps, targets the next ones."""
    steps = columns.shape[0]
    return [
        (columns[i : min(i + length, steps - 1)], columns[i + 1 : i + 1 + length]) for i in range(0, steps - 1, length)
    ]


def in_columns(tokens: torch.Tensor, columns: int) -> torch.Tensor:
    """``tokens`` ``(N,)`` cut into ``columns`` contiguous parts, side by side: ``(N // columns, columns)``."""
    steps = tokens.numel() // columns
    return tokens[: steps * columns].view(columns, steps).t()


BITS = 1 / math.log(2)


def python_stream(quick: bool) -> Stream:
    """The main corpus's first 120,000 characters once (quick: 30,000 characters, a model of 32 units)."""
    text = char_lm.stdlib_corpus()[: 30_000 if quick else 120_000]
    vocab = char_lm.Vocabulary(text)
    hidden = 32 if quick else 128
    return Stream(
        column_batches(in_columns(vocab.encode(text), 12)),
        lambda: char_lm.CharLSTM(len(vocab), 32, hidden),
        char_lm.cross_entropy,
        vocab.unigram_bpc(text),
        "the unigram of the whole stream, known in hindsight",
        BITS,
    )


def shift_stream(quick: bool) -> Stream:
    """Python sources, then folk tunes, in every column; the change two thirds of the way along."""
    size = 30_000 if quick else 120_000
    code, tunes = char_lm.stdlib_corpus()[: size * 2 // 3], folk_tunes(size // 3)
    vocab = char_lm.Vocabulary(code + tunes)
    first, second = in_columns(vocab.encode(code), 12), in_columns(vocab.encode(tunes), 12)
    hidden = 32 if quick else 128
    return Stream(
        column_batches(torch.cat([first, second])),
        lambda: char_lm.CharLSTM(len(vocab), 32, hidden),
        char_lm.cross_entropy,
        vocab.unigram_bpc(code + tunes),
        "the unigram of the whole stream, known in hindsight",
        BITS,
        change=first.shape[0],
    )


class Forecaster(nn.Module):
    """An LSTM reading one value per step and predicting the next: ``(T, B, 1) -> (T, B, 1)``."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, hidden)
        self.readout = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, hidden: Any = None) -> tuple[torch.Tensor, Any]:
        out, hidden = self.lstm(x, hidden)
        return self.readout(out), hidden


def squared_error(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the predicted next readings."""
    return nn.functional.mse_loss(y_pred, y)


def power_stream(quick: bool) -> Stream:
    """ACSF1's recordings dealt to 8 columns, 10 each (quick: 2 each, a model of 16 units)."""
    from sktime.datasets import load_acsf1

    recordings = torch.cat(
        [
            torch.as_tensor(load_acsf1(split=s, return_type="numpy3D")[0][:, 0], dtype=torch.float32)
            for s in ("train", "test")
        ]
    )  # (200, 1460)
    per_column = 2 if quick else 10
    length = recordings.shape[1]
    dealt = recordings[: 8 * per_column].view(per_column, 8, length).transpose(0, 1)  # recording j to column j % 8
    columns = dealt.reshape(8, per_column * length).t().unsqueeze(-1)  # (T, 8, 1)
    persistence = (columns[1:] - columns[:-1]).pow(2).mean().item()  # predicting the last reading again
    hidden = 16 if quick else 32
    return Stream(column_batches(columns), lambda: Forecaster(hidden), squared_error, persistence, "the last reading")


ONLINE_TASKS = {
    task.name: task
    for task in (
        OnlineTask("python", "Python sources read once, char-level LSTM", "bits/char", (10, 25, 50, 100, 200),
                   (1e-3, 3e-3, 1e-2), python_stream),
        OnlineTask("power", "ACSF1 appliance power read once, next reading, LSTM", "squared error",
                   (5, 10, 20, 40, 80), (1e-3, 3e-3, 1e-2), power_stream),
        OnlineTask("shift", "Python sources, then folk tunes, read once, char-level LSTM", "bits/char",
                   (10, 25, 50, 100, 200), (1e-3, 3e-3, 1e-2), shift_stream),
    )
}  # fmt: skip
