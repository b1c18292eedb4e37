"""Mamba2 on the main corpus: Hugging Face's Mamba2ForCausalLM trained with TBPTT, its state carried between windows.

A small ``Mamba2ForCausalLM`` of ``transformers`` (two layers, hidden size 64, four heads of 32, SSM state 16; built
from a ``Mamba2Config``, no pretrained weights) reads the main job's corpus, the standard library's modules as
documents (:func:`~ignite_tbptt.examples.char_lm.stdlib_documents`), packed into ``--batch-size`` columns with
:func:`~ignite_tbptt.data.pack_sequences` (every document starting on a window boundary, ``align=k1``). The trainer
carries each layer's convolution and SSM state from window to window through
:func:`~ignite_tbptt.models.mamba2_model_fn` (Dao & Gu 2024, "Transformers are SSMs", ICML, section 6: the chunked
scan passes the state from chunk to chunk), and resets it where a document starts. ``--reset-every-window`` trains
the same model on independent chunks instead: the state is reset at every window's start, as when a state-space
model is trained on fixed-length chunks of the text, for comparison. Both print the validation bits per character
with the state carried through each held-out piece and with it reset every ``k1`` characters. After the default
3,000 optimizer steps, over seeds 0-2: 2.255-2.288 bits per character carried against 2.348-2.400 on independent
chunks, a gain of 0.06-0.15 bits with every seed (docs/howto/mamba2.md).

Run::

    python -m ignite_tbptt.examples.mamba_lm                       # about a minute on 2 CPU cores
    python -m ignite_tbptt.examples.mamba_lm --reset-every-window  # the same model on independent chunks
    python -m ignite_tbptt.examples.mamba_lm --quick               # a few seconds: the CI test's size
    python -m ignite_tbptt.examples.mamba_lm --logdir runs/mamba   # and its TensorBoard curves

Its figures, and the command that measures their spread: docs/examples/mamba_lm.md.

This module reads the options, and refuses one that cannot be right before anything loads; the data, the model and
the training are in ``_mamba_lm``, whose names it forwards (``mamba_lm.build_model``, ``mamba_lm.load_data``...).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .curves import add_logdir_option
from .options import (
    add_device_option,
    add_threads_option,
    example_parser,
    fraction,
    job_attribute,
    non_negative_float,
    parse,
    positive_float,
    positive_int,
    tell_if_cores_are_busy,
)

if TYPE_CHECKING:  # forwarded by __getattr__, imported with torch when first asked for
    from ._mamba_lm import batch_major, build_model, evaluate, load_data, train

__all__ = ["build_model", "batch_major", "load_data", "train", "evaluate", "parser", "parse_args", "main"]

JOB = "ignite_tbptt.examples._mamba_lm"


def __getattr__(name: str) -> Any:
    """The job's names (model, data, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.mamba_lm``, each with its check, help and default."""
    p = example_parser("mamba_lm", __doc__)
    p.add_argument(
        "--reset-every-window",
        action="store_true",
        help="train on independent chunks: the state reset at every window's start instead of carried",
    )
    p.add_argument("--k1", type=positive_int, default=32, help="steps between backward passes, the scan's block")
    p.add_argument("--k2", type=positive_int, help="steps each backward pass reaches back (default: k1)")
    p.add_argument("--steps", type=positive_int, default=3000, help="optimizer steps (windows) of training")
    p.add_argument("--batch-size", type=positive_int, default=12, help="parallel columns")
    p.add_argument("--seq-len", type=positive_int, default=128, help="steps per batch, a multiple of k1")
    p.add_argument("--hidden", type=positive_int, default=64, help="hidden size")
    p.add_argument("--heads", type=positive_int, default=4, help="SSM heads, dividing 2 x --hidden")
    p.add_argument("--state", type=positive_int, default=16, help="SSM state size per head channel")
    p.add_argument("--layers", type=positive_int, default=2, help="Mamba2 layers")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="Adam learning rate")
    p.add_argument("--clip", type=non_negative_float, default=1.0, help="gradient norm clipping, 0 to disable")
    p.add_argument(
        "--max-chars", type=positive_int, help="use only the first N characters of the corpus (default: all)"
    )
    p.add_argument("--valid-fraction", type=fraction, default=0.05, help="tail of the corpus held out")
    p.add_argument("--valid-columns", type=positive_int, default=8, help="pieces the held-out text is read in")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    add_threads_option(p)
    p.add_argument("--quick", action="store_true", help="a few seconds' run: 60 steps, 250,000 characters")
    add_device_option(p)
    add_logdir_option(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read, then together (:func:`check`)."""
    p = parser()
    args = parse(p, argv)
    if args.quick:
        args.steps, args.max_chars, args.batch_size, args.seq_len, args.valid_fraction = 60, 250_000, 4, 64, 0.02
    args.k2 = args.k1 if args.k2 is None else args.k2
    check(p, args)
    return args


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse options that cannot go together, with the fix, before anything loads."""
    if args.seq_len % args.k1:
        p.error(f"--seq-len {args.seq_len} must be a multiple of --k1 {args.k1}: windows then never span two calls.")
    if 2 * args.hidden % args.heads:
        p.error(f"--heads {args.heads} must divide 2 x --hidden ({2 * args.hidden}), the inner width the heads span.")
    from ignite_tbptt.models import check_mamba2_schedule  # imports torch: once the options are read

    try:
        check_mamba2_schedule(args.k1, args.k2, batch_length=args.seq_len)  # every model call two steps or more
    except ValueError as error:
        p.error(f"--k1 {args.k1} --k2 {args.k2}: {error}")


def main(argv: list[str] | None = None) -> dict:
    """Read the options, then run the example (:func:`_mamba_lm.run`); returns its figures."""
    args = parse_args(argv)
    from ._mamba_lm import run  # torch and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    tell_if_cores_are_busy("pass --threads 1", parse_args().threads)  # --help, or a refused option, answers first
    main()
