"""Who is speaking? A spiking network over spoken vowels, its membranes kept by snnTorch's neurons, trained with TBPTT.

The data and the task are those of :mod:`ignite_tbptt.examples.vowels` (the UCI Japanese Vowels set as ``sktime``
ships it, CC BY 4.0; name the speaker at every frame). The model is a spiking network of leaky integrate-and-fire
neurons from snnTorch (Eshraghian et al. 2023, "Training spiking neural networks using lessons from deep learning",
Proceedings of the IEEE 111(9)): the 12 coefficients of a frame drive 64 neurons as input current, their spikes
drive 9 non-spiking leaky read-out neurons, one per speaker, whose membrane potentials are the logits. The neurons
are built with ``init_hidden=True``, so they keep their membranes in their own attributes (``lif1.mem``,
``lif2.mem``) and the forward pass takes no state: the trainer is told where the state lives
(``module_state=["lif1.mem", "lif2.mem"]``) and carries it along each utterance, resets it where the next one
starts, and cuts its gradient at each window's cut, as for a returned state. Gradients pass the spikes through
snnTorch's surrogate (arctangent). It prints the test bits per frame and the share of utterances whose speaker is
named right at their last frame, against the same network trained without memory (its membranes reset at every
frame) and chance; its page in the docs (docs/examples/spiking_vowels.md) compares them with the GRU of
``examples.vowels``.

Run::

    python -m ignite_tbptt.examples.spiking_vowels                        # about 20 s on 2 CPU cores
    python -m ignite_tbptt.examples.spiking_vowels --logdir runs/spiking  # and both models' TensorBoard curves

Its figures, and the command that measures their spread: docs/examples/spiking_vowels.md.

This module reads the options, and refuses one that cannot be right before anything loads; the data, the model and
the training are in ``_spiking_vowels``, whose names it forwards
(``spiking_vowels.SpikingSpeakerNet``, ``spiking_vowels.STATE``...).
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
    from ._spiking_vowels import STATE, SpikingSpeakerNet

__all__ = ["SpikingSpeakerNet", "STATE", "parser", "parse_args", "main"]

JOB = "ignite_tbptt.examples._spiking_vowels"


def __getattr__(name: str) -> Any:
    """The job's names (model, data, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.spiking_vowels``, each with its check, help and default."""
    p = example_parser("spiking_vowels", __doc__)
    p.add_argument("--k1", type=positive_int, default=4, help="frames between backward passes")
    p.add_argument("--k2", type=positive_int, default=8, help="frames each backward pass reaches back")
    p.add_argument("--batch-size", type=positive_int, default=16, help="parallel columns")
    p.add_argument("--seq-len", type=positive_int, default=40, help="frames per batch")
    p.add_argument("--hidden", type=positive_int, default=64, help="spiking neurons")
    p.add_argument("--epochs", type=positive_int, default=30, help="passes over the training utterances")
    p.add_argument("--lr", type=positive_float, default=5e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the shuffling")
    add_device_option(p)
    add_logdir_option(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read."""
    p = parser()
    return parse(p, argv)


def main(argv: list[str] | None = None) -> dict:
    """Read the options, then run the example (:func:`_spiking_vowels.run`); returns its figures."""
    args = parse_args(argv)
    from ._spiking_vowels import run  # torch and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    parse_args()  # --help, or a refused option, answers before anything more is done
    tell_if_cores_are_busy()
    main()
