"""Who is speaking? A GRU over spoken vowels, trained with TBPTT(k1, k2) on packed recordings.

Data: the UCI Japanese Vowels set (Kudo, Toyama & Shimbo 1999, "Multidimensional curve classification using
passing-through regions", Pattern Recognition Letters 20(11-13), 1103-1111; UCI Machine Learning Repository,
licence CC BY 4.0). Nine male speakers said the vowels /ae/; each of the 640 utterances (270 for training, 370
for testing) is 7 to 29 frames of 12 linear-prediction cepstrum coefficients. The copy read here is the one
``sktime`` ships (``sktime/datasets/data/JapaneseVowels/*.ts``), read as text: sktime itself is not imported.

Task: at every frame, say which of the nine speakers is talking, from the frames so far. Each utterance is a
recording, features ``x`` of shape ``(T_i, 12)`` (real values, not token ids) and targets ``y`` of shape
``(T_i,)`` (the speaker at every frame), packed into columns by :func:`~ignite_tbptt.data.pack_recordings`,
the hidden state reset where each starts, and trained with TBPTT(k1, k2), k2 > k1, so that a frame's loss
reaches back into the frames before its window. It prints, on the test utterances, the per-frame cross-entropy
in bits (the evaluator, :class:`~ignite_tbptt.BitsPerTarget`) and the share of utterances whose speaker is
named right at their last frame, against two baselines: chance (log2 9 = 3.17 bits, 11%) and the same model
trained without memory (its hidden state reset at every frame), which shows what carrying the state adds.

Run::

    python -m ignite_tbptt.examples.vowels                       # about 25 s on 2 CPU cores
    python -m ignite_tbptt.examples.vowels --logdir runs/vowels  # and both models' TensorBoard curves

Its figures, and the command that measures their spread: docs/examples/vowels.md.

This module reads the options, and refuses one that cannot be right before anything loads; the data, the model and
the training are in ``_vowels``, whose names it forwards (``vowels.SpeakerGRU``, ``vowels.load_vowels``...).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .curves import add_logdir_option
from .options import (
    add_device_option,
    example_parser,
    job_attribute,
    parse,
    positive_float,
    positive_int,
    tell_if_cores_are_busy,
)

if TYPE_CHECKING:  # forwarded by __getattr__, imported with torch when first asked for
    from ._vowels import SPEAKERS, SpeakerGRU, compare, cross_entropy, load_vowels, read_ts, train_on

__all__ = [
    "SPEAKERS",
    "read_ts",
    "load_vowels",
    "SpeakerGRU",
    "cross_entropy",
    "train_on",
    "compare",
    "parser",
    "parse_args",
    "main",
]

JOB = "ignite_tbptt.examples._vowels"


def __getattr__(name: str) -> Any:
    """The job's names (model, data, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.vowels``, each with its check, help and default."""
    p = example_parser("vowels", __doc__)
    p.add_argument("--k1", type=positive_int, default=4, help="frames between backward passes")
    p.add_argument("--k2", type=positive_int, default=12, help="frames each backward pass reaches back")
    p.add_argument("--batch-size", type=positive_int, default=16, help="parallel columns")
    p.add_argument("--seq-len", type=positive_int, default=40, help="frames per batch")
    p.add_argument("--hidden", type=positive_int, default=32, help="GRU hidden size")
    p.add_argument("--epochs", type=positive_int, default=20, help="passes over the training utterances")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the shuffling")
    add_device_option(p)
    add_logdir_option(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read."""
    p = parser()
    return parse(p, argv)


def main(argv: list[str] | None = None) -> dict:
    """Read the options, then run the example (:func:`_vowels.run`); returns its figures."""
    args = parse_args(argv)
    from ._vowels import run  # torch and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    parse_args()  # --help, or a refused option, answers before anything more is done
    tell_if_cores_are_busy()
    main()
