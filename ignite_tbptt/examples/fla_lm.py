"""flash-linear-attention on the main corpus: fla's GatedDeltaNet, GLA or DeltaNet trained with TBPTT, state carried.

A small fla language model (``--arch``: ``GatedDeltaNetForCausalLM``, ``GLAForCausalLM`` or ``DeltaNetForCausalLM``;
two layers, hidden size 64, four heads; built from its config, no pretrained weights) reads the main job's corpus,
the standard library's modules as documents, packed into ``--batch-size`` columns with every document starting on
a window boundary, as :mod:`~ignite_tbptt.examples.mamba_lm` does for Hugging Face's Mamba2. The trainer carries each
layer's recurrent state and short-convolution states from window to window through
:func:`~ignite_tbptt.models.fla_model_fn`, and resets them where a document starts: fla's chunked kernels take the
state a chunk starts from and return the gradient with respect to it (Yang et al. 2024, "Gated Delta Networks",
section 3; "Gated Linear Attention Transformers", section 4), so the gradient of TBPTT(k1, k2) flows through the
carried state. ``--reset-every-window`` trains on independent chunks instead, for comparison; both print the
validation bits per character with the state carried and with it reset every ``k1`` characters, and the training's
characters per second. ``--compare`` trains the fla model with its state carried and on independent chunks, the
main job's LSTM and Hugging Face's Mamba2 for the same ``--seconds`` on the same batches and prints one table.

fla's kernels are Triton kernels, which run on a CUDA device only; on the CPU, Hugging Face's Mamba2 trains through
its PyTorch scan (``python -m ignite_tbptt.examples.mamba_lm``).

Run::

    python -m ignite_tbptt.examples.fla_lm --arch gla                       # a CUDA device
    python -m ignite_tbptt.examples.fla_lm --arch gla --reset-every-window  # the same model on independent chunks
    python -m ignite_tbptt.examples.fla_lm --compare --seconds 60           # fla both ways, LSTM, Mamba2: 60 s each
    python -m ignite_tbptt.examples.fla_lm --compare --logdir runs/fla      # and each model's TensorBoard curves

This module reads the options, and refuses one that cannot be right before anything loads; the data, the models and
the training are in ``_fla_lm``, whose names it forwards (``fla_lm.build_model``, ``fla_lm.contenders``...).
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import TYPE_CHECKING, Any

from .curves import add_logdir_option
from .options import (
    add_cuda_graphs_option,
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
    from ._fla_lm import ARCHITECTURES, Contender, build_model, contenders, evaluate, train

__all__ = [
    "ARCHITECTURES",
    "Contender",
    "build_model",
    "contenders",
    "train",
    "evaluate",
    "ARCHS",
    "parser",
    "parse_args",
    "complete",
    "main",
]

JOB = "ignite_tbptt.examples._fla_lm"

#: The choices of ``--arch`` (the job's ``ARCHITECTURES``), here so that ``--help`` needs no import.
ARCHS = ("gated_deltanet", "gla", "delta_net")


def __getattr__(name: str) -> Any:
    """The job's names (models, data, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.fla_lm``, each with its check, help and default."""
    p = example_parser("fla_lm", __doc__)
    p.add_argument("--arch", choices=ARCHS, default="gated_deltanet", help="fla's model")
    p.add_argument(
        "--reset-every-window",
        action="store_true",
        help="train on independent chunks: the state reset at every window's start instead of carried",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="train the fla model (state carried, and on chunks), the LSTM and Mamba2 for --seconds each; one table",
    )
    p.add_argument("--k1", type=positive_int, default=64, help="steps between backward passes, fla's chunk size")
    p.add_argument("--k2", type=positive_int, help="steps each backward pass reaches back (default: k1)")
    p.add_argument("--steps", type=positive_int, default=3000, help="optimizer steps (windows) of training, at most")
    p.add_argument(
        "--seconds", type=positive_float, help="seconds of training, at most (default: none; 60 with --compare)"
    )
    p.add_argument("--batch-size", type=positive_int, default=12, help="parallel columns")
    p.add_argument("--seq-len", type=positive_int, default=128, help="steps per batch, a multiple of k1")
    p.add_argument("--hidden", type=positive_int, default=64, help="hidden size")
    p.add_argument("--heads", type=positive_int, default=4, help="heads, dividing --hidden")
    p.add_argument("--layers", type=positive_int, default=2, help="layers")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="Adam learning rate")
    p.add_argument("--clip", type=non_negative_float, default=1.0, help="gradient norm clipping, 0 to disable")
    p.add_argument(
        "--max-chars", type=positive_int, help="use only the first N characters of the corpus (default: all)"
    )
    p.add_argument("--valid-fraction", type=fraction, default=0.05, help="tail of the corpus held out")
    p.add_argument("--valid-columns", type=positive_int, default=8, help="pieces the held-out text is read in")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    add_threads_option(p)
    p.add_argument("--quick", action="store_true", help="a few seconds' run: 120 steps, 250,000 characters")
    add_device_option(p)
    add_logdir_option(p)
    add_cuda_graphs_option(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read, then together (:func:`check`)."""
    p = parser()
    args = complete(parse(p, argv))
    check(p, args)
    return args


def complete(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that follow from other options: ``--quick``'s sizes, k2 = k1, 60 s for ``--compare``."""
    if args.quick:
        args.steps, args.max_chars, args.batch_size, args.valid_fraction = 120, 250_000, 4, 0.02
    args.k2 = args.k1 if args.k2 is None else args.k2
    if args.compare and args.seconds is None:
        args.seconds = 60.0
    return args


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse options that cannot go together, or a device fla cannot run on, with the fix, before anything loads."""
    if args.seq_len % args.k1:
        p.error(f"--seq-len {args.seq_len} must be a multiple of --k1 {args.k1}: windows then never span two calls.")
    # The heads split the keys: GLA's are half the width (fla's expand_k = 0.5), the others' all of it.
    keys = args.hidden / 2 if args.arch == "gla" else args.hidden
    if keys % args.heads:
        what = f"half of --hidden ({keys:g}), GLA's key width" if args.arch == "gla" else f"--hidden {args.hidden}"
        multiple = 2 * args.heads if args.arch == "gla" else args.heads
        p.error(f"--heads {args.heads} must divide {what}: pass a --hidden that is a multiple of {multiple}.")
    if args.compare and args.reset_every_window:
        p.error("--compare trains the fla model both ways already: pass --reset-every-window without --compare.")
    if args.cuda_graphs and args.k2 != args.k1:
        p.error(f"--cuda-graphs captures k1 = k2 windows: pass --k2 {args.k1}, or leave --cuda-graphs out.")
    if importlib.util.find_spec("fla") is None:
        p.error("flash-linear-attention is not installed: pip install fla-core flash-linear-attention (or .[dev]).")
    import torch  # once the options are read

    if torch.device(args.device).type != "cuda":
        p.error(
            f"--device {args.device}: fla's kernels are Triton kernels, which run on a CUDA device only: pass "
            "--device cuda; on the CPU, python -m ignite_tbptt.examples.mamba_lm trains Hugging Face's Mamba2."
        )
    from ignite_tbptt.models import check_mamba2_schedule

    if args.compare:
        try:
            check_mamba2_schedule(args.k1, args.k2, batch_length=args.seq_len)  # the Mamba2 of the comparison
        except ValueError as error:
            p.error(f"--compare --k1 {args.k1} --k2 {args.k2}: Hugging Face's Mamba2: {error}")


def main(argv: list[str] | None = None) -> dict:
    """Read the options, then run the example (:func:`_fla_lm.run`); returns its figures."""
    args = parse_args(argv)
    from ._fla_lm import run  # torch, fla and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    tell_if_cores_are_busy("pass --threads 1", parse_args().threads)  # --help, or a refused option, answers first
    main()
