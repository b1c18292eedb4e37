"""xLSTM on the main corpus: the official ``xlstm`` package's xLSTMLarge, trained with TBPTT(k1, k2) through a model_fn.

xLSTMLarge (Beck et al. 2024, "xLSTM: Extended Long Short-Term Memory", NeurIPS; the ``xlstm`` package of NX-AI,
Apache 2.0) carries a state of ``(c, n, m)`` per mLSTM block from one chunk to the next. Its own forward copies the
new state into the one it was given (``state[i][j].copy_(new)``), which the trainer refuses: it keeps the state it
hands to a model call. :func:`xlstm_model_fn` calls the model's parts and returns a new state instead, and TBPTT is
then exact for it. The model is small (embedding 64, two mLSTM blocks of two heads, the native CPU kernels in
float32: ``chunkwise--native_autograd``), the text the main job's (Python's own sources, one stream in ``--batch-size``
columns) and the input ``(B, T)``, ``time_dim=1``. It trains TBPTT(k1, k2) with k2 > k1 and TBPTT(k1, k1) for the
same number of optimizer steps and prints the validation bits per character of each.

Run::

    python -m ignite_tbptt.examples.xlstm_lm                      # 2-6 minutes on 2 CPU cores, both runs
    python -m ignite_tbptt.examples.xlstm_lm --logdir runs/xlstm  # and both runs' TensorBoard curves
    python -m ignite_tbptt.examples.xlstm_lm --show-error         # what xLSTMLarge's own forward meets

Its figures, and the command that measures their spread: docs/examples/xlstm_lm.md.

This module reads the options, and refuses one that cannot be right before anything loads; the data, the model and
the training are in ``_xlstm_lm``, whose names it forwards (``xlstm_lm.build_model``, ``xlstm_lm.xlstm_model_fn``).
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
    from ._xlstm_lm import build_model, xlstm_model_fn

__all__ = ["build_model", "xlstm_model_fn", "parser", "parse_args", "main"]

JOB = "ignite_tbptt.examples._xlstm_lm"


def __getattr__(name: str) -> Any:
    """The job's names (model, data, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.xlstm_lm``, each with its check, help and default."""
    p = example_parser("xlstm_lm", __doc__)
    p.add_argument("--k1", type=positive_int, default=16, help="steps between backward passes, the chunk size")
    p.add_argument("--k2", type=positive_int, default=64, help="steps the k2 > k1 run reaches back")
    p.add_argument("--steps", type=positive_int, default=3000, help="optimizer steps of each run")
    p.add_argument("--batch-size", type=positive_int, default=16, help="parallel columns")
    p.add_argument("--seq-len", type=positive_int, default=64, help="steps per batch, a multiple of --k1")
    p.add_argument("--embedding", type=positive_int, default=64, help="embedding size, a multiple of 2 x --heads")
    p.add_argument("--blocks", type=positive_int, default=2, help="mLSTM blocks")
    p.add_argument("--heads", type=positive_int, default=2, help="heads per block")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="Adam learning rate")
    p.add_argument("--max-chars", type=positive_int, default=400_000, help="characters of the corpus used")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    p.add_argument("--show-error", action="store_true", help="print what xLSTMLarge's own forward meets, and stop")
    add_device_option(p)
    add_logdir_option(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read, then together."""
    p = parser()
    args = parse(p, argv)
    if args.seq_len % args.k1:
        p.error(f"--seq-len {args.seq_len} must be a multiple of --k1 {args.k1}, the chunk size of every model call.")
    if args.embedding % (2 * args.heads):
        p.error(
            f"--embedding {args.embedding} must be a multiple of 2 x --heads {args.heads}: each head's queries "
            "and keys take half its share."
        )
    return args


def main(argv: list[str] | None = None) -> dict:
    """Read the options, then run the example (:func:`_xlstm_lm.run`); returns its figures."""
    args = parse_args(argv)
    from ._xlstm_lm import run  # torch and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    parse_args()  # --help, or a refused option, answers before anything more is done
    tell_if_cores_are_busy()
    main()
