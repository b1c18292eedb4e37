"""An autoregressive decoder trained with per-token backward: memory stays flat however long it generates.

The decoder feeds its own previous prediction back as its next input (``topk(1).indices.detach()``), the
way it will run at inference, so its steps cannot be computed in one fused call: ``model_fn`` runs the
decoding loop, and the previous prediction travels inside the hidden state ``(h, c, previous_token)``.
With ``k1=1`` every generated token is its own window: its loss is backpropagated as soon as it is
produced (per-token backward), through the last ``k2`` steps, and the graph of older steps is freed. Memory
is therefore bounded by ``k2``, not by the length of the generated sequence.

The task: read a stream of digits ``x_t`` in ``0 .. V-1`` and write each one ``--delay`` steps later,
``y_t = x_{t - delay}``. The decoder sees the current digit and its own previous output, so the digit it
must write has to be carried in its hidden state for ``delay`` steps: a truncation ``k2`` shorter than the
delay cannot teach that, a longer one can.

Run::

    python -m ignite_tbptt.examples.decoder                        # about 8 s on 2 CPU cores
    python -m ignite_tbptt.examples.decoder --logdir runs/decoder  # and its TensorBoard curves

Its figures, and the command that measures their spread: docs/examples/decoder.md.

This module reads the options, and refuses one that cannot be right before anything loads; the data, the model and
the training are in ``_decoder``, whose names it forwards (``decoder.Decoder``, ``decoder.decode``...).
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
    from ._decoder import Decoder, decode, delayed_copy

__all__ = ["Decoder", "decode", "delayed_copy", "parser", "parse_args", "main"]

JOB = "ignite_tbptt.examples._decoder"


def __getattr__(name: str) -> Any:
    """The job's names (model, data, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.decoder``, each with its check, help and default."""
    p = example_parser("decoder", __doc__)
    p.add_argument("--length", type=positive_int, default=2000, help="tokens generated per stream")
    p.add_argument("--batch-length", type=positive_int, default=200, help="tokens per batch of the stream")
    p.add_argument("--k2", type=positive_int, default=8, help="steps each token's loss reaches back")
    p.add_argument("--accumulation", type=positive_int, default=4, help="tokens per optimizer step")
    p.add_argument("--delay", type=positive_int, default=3, help="steps between reading a digit and writing it")
    p.add_argument("--vocab", type=positive_int, default=6, help="digits, 2 or more")
    p.add_argument("--hidden", type=positive_int, default=64, help="LSTM cell size")
    p.add_argument("--batch-size", type=positive_int, default=16, help="parallel streams")
    p.add_argument("--lr", type=positive_float, default=1e-2, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the digits and the initial weights")
    add_device_option(p, "the model and the batches")
    add_logdir_option(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read, then together."""
    p = parser()
    args = parse(p, argv)
    if args.vocab < 2:
        p.error(f"--vocab {args.vocab}: one digit leaves nothing to learn; pass --vocab 2 or more.")
    if args.delay >= args.length:
        p.error(f"--delay {args.delay} leaves no digit to copy in --length {args.length}: pass a shorter --delay.")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Read the options, then run the example (:func:`_decoder.run`); returns its figures."""
    args = parse_args(argv)
    from ._decoder import run  # torch and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    parse_args()  # --help, or a refused option, answers before anything more is done
    tell_if_cores_are_busy()
    main()
