"""A Recurrent Memory Transformer on the main corpus: memory tokens are the hidden state, TBPTT through them.

The Recurrent Memory Transformer (Bulatov, Kuratov & Burtsev 2022, "Recurrent Memory Transformer", NeurIPS)
reads a long text segment by segment with a small transformer; ``M`` memory tokens are written at the end of each
segment and read at the start of the next, so they are a recurrent state of shape ``(B, M, d)``. Training it is
TBPTT with one segment per window (k1 = the segment length) and a backward pass that reaches several segments back
through the memory (k2 > k1, the paper's "BPTT unroll"). The memory at a stream's start is learned
(``initial_state``): every window whose backward pass reaches the start backpropagates into it.

The model is a ``torch.nn.TransformerEncoder`` (2 layers, width 64, 4 heads; causal over the segment's characters,
the read memory visible to all and the write memory reading all). It trains three ways for the same number of
optimizer steps on the main job's text (Python's own sources, one stream in ``--batch-size`` columns), and prints
the validation bits per character of each:

- memory with gradient through it, TBPTT(k1 = segment, k2 = 3 segments);
- memory without gradient through it, TBPTT(k1 = k2 = segment): the memory is carried, but learnt only within a
  segment;
- no memory: every segment starts from the learned initial memory.

Run::

    python -m ignite_tbptt.examples.memory_transformer                    # about 11 minutes on 2 busy CPU cores
    python -m ignite_tbptt.examples.memory_transformer --logdir runs/rmt  # and the three runs' TensorBoard curves

Its figures, and the command that measures their spread: docs/examples/memory_transformer.md.

This module reads the options, and refuses one that cannot be right before anything loads; the data, the model and
the training are in ``_memory_transformer``, whose names it forwards (``memory_transformer.MemoryTransformer``...).
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
    from ._memory_transformer import LearnedMemory, MemoryTransformer

__all__ = ["LearnedMemory", "MemoryTransformer", "parser", "parse_args", "main"]

JOB = "ignite_tbptt.examples._memory_transformer"


def __getattr__(name: str) -> Any:
    """The job's names (model, data, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.memory_transformer``, each with its check, help and default."""
    p = example_parser("memory_transformer", __doc__)
    p.add_argument("--segment", type=positive_int, default=32, help="characters per segment, k1")
    p.add_argument("--memory", type=positive_int, default=8, help="memory tokens")
    p.add_argument("--width", type=positive_int, default=64, help="model width, a multiple of the 4 heads")
    p.add_argument("--steps", type=positive_int, default=5000, help="optimizer steps of each variant")
    p.add_argument("--batch-size", type=positive_int, default=16, help="parallel columns")
    p.add_argument("--seq-len", type=positive_int, default=128, help="characters per batch")
    p.add_argument("--lr", type=positive_float, default=2e-3, help="Adam learning rate")
    p.add_argument("--max-chars", type=positive_int, default=400_000, help="characters of the corpus used")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    add_device_option(p)
    add_logdir_option(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read, then together."""
    p = parser()
    args = parse(p, argv)
    if args.width % 4:
        p.error(f"--width {args.width} must be a multiple of the 4 attention heads: pass {args.width // 4 * 4 or 4}.")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Read the options, then run the example (:func:`_memory_transformer.run`); returns its figures."""
    args = parse_args(argv)
    from ._memory_transformer import run  # torch and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    parse_args()  # --help, or a refused option, answers before anything more is done
    tell_if_cores_are_busy()
    main()
