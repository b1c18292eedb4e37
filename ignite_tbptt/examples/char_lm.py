"""Character-level LSTM language model trained with TBPTT(k1, k2) on real text.

The default corpus is source code every Python installation carries: a fixed, sorted list of modules of the
standard library (about 1.2 MB), each module a document. The last ``--valid-fraction`` of the characters is
held out for validation. The documents are packed into ``--batch-size`` columns with
:func:`~ignite_tbptt.data.pack_sequences`, longest first, so that the columns end close together: training
carries the hidden state along a column across batches (``carry_hidden=True``) and resets it where a document
starts, so that no module's state or gradient runs into the next one. The default TBPTT(50, 50), Adam 3e-3,
did best in ``python -m benchmarks.tradeoff`` on this corpus at about this time budget
(docs/benchmarks-tradeoff.md: ahead of TBPTT(100, 100) within the seeds' spread, clearly ahead of
TBPTT(25, 50)); a ``--k2`` above ``--k1`` makes every step's loss reach back at least ``k2 - k1`` steps.
``--layout stream`` instead joins the documents into one text cut into ``--batch-size`` contiguous columns
(the classic language-model layout, :func:`~ignite_tbptt.data.stream_batches`);
the default ``--layout auto`` takes it where the documents would fill fewer columns than ``--batch-size``, or
keep less than 90% of the characters (one large ``--text`` file, or a few of very different lengths).

Run::

    python -m ignite_tbptt.examples.char_lm                 # about a minute on 2 CPU cores
    python -m ignite_tbptt.examples.char_lm --text a.txt b.txt --k1 100 --k2 100 --epochs 5
    python -m ignite_tbptt.examples.char_lm --trainer lightning   # the same job on Lightning's Trainer
    tensorboard --logdir runs/                              # each run writes to runs/char_lm-DATE-TIME/

It logs each window's training loss (nats per character), gradient norm, learning rate and throughput
(x-axis: windows), each epoch's validation bits per character, the hyper-parameters and the schedule picture
to TensorBoard, and prints the validation bits per character after each epoch, next to the unigram model's
(the entropy of the training text's character frequencies, about 4.4 bits for code). Checkpoints go to
``LOGDIR/checkpoints`` every ``--checkpoint-every`` iterations; ``--resume FILE`` continues a run from one,
mid-epoch included, with the result of an uninterrupted run. ``--reach N`` records the gradient reach of
every N-th window (TensorBoard: ``train/reach_at_cut`` and a picture); ``--adaptive DELTA`` lets k2 follow
the measured decay of the hidden-state gradient (TensorBoard: ``train/k2``); ``--artbp L`` truncates without
bias (:class:`~ignite_tbptt.ARTBP`, windows of ``L`` steps on average). The job prints where its logs and
checkpoints go before it trains; in a terminal it shows ignite's progress bar (batches per second, the last batch's
bits per character), and where standard error is not one (a log file) a line of progress every 30 seconds instead.

This module reads the options, and refuses one that cannot be right before anything loads; the data, the model and
the training are in ``_char_lm``, whose names it forwards (``char_lm.CharLSTM``, ``char_lm.load_data``...).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .options import (
    add_cuda_graphs_option,
    add_device_option,
    add_threads_option,
    example_parser,
    existing_file,
    fraction,
    job_attribute,
    non_negative_float,
    non_negative_int,
    parse,
    positive_float,
    positive_int,
    tell_if_cores_are_busy,
)

if TYPE_CHECKING:  # forwarded by __getattr__, imported with torch when first asked for
    from ._char_lm import (
        STDLIB_MODULES,
        CharLSTM,
        StopOnInterrupt,
        Vocabulary,
        batch_major,
        held_out_corpus,
        held_out_text,
        stdlib_corpus,
        stdlib_documents,
    )

__all__ = [
    "STDLIB_MODULES",
    "stdlib_documents",
    "stdlib_corpus",
    "held_out_corpus",
    "held_out_text",
    "batch_major",
    "Vocabulary",
    "CharLSTM",
    "StopOnInterrupt",
    "parser",
    "parse_args",
    "main",
]

JOB = "ignite_tbptt.examples._char_lm"


def __getattr__(name: str) -> Any:
    """The job's names (model, data, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def data_options(p: argparse.ArgumentParser) -> None:
    """The text, its layout and the held-out share."""
    p.add_argument(
        "--text",
        type=existing_file,
        nargs="+",
        help="UTF-8 text files, each a document (default: the sources of 35 standard-library modules)",
    )
    p.add_argument(
        "--max-chars", type=positive_int, help="use only the first N characters of the documents (default: all)"
    )
    p.add_argument(
        "--layout",
        choices=("auto", "documents", "stream"),
        default="auto",
        help="documents: packed into columns, hidden state reset at each document's start;\n"
        "stream: the documents joined into one text cut into --batch-size columns;\n"
        "auto (default): documents, unless they fill fewer than --batch-size columns or keep less than 90%% of "
        "the characters (one large file, say), then stream",
    )
    p.add_argument("--valid-fraction", type=fraction, default=0.05, help="tail of the text held out for validation")


def model_options(p: argparse.ArgumentParser) -> None:
    """The windows, sizes and optimisation."""
    p.add_argument("--k1", type=positive_int, default=50, help="steps between backward passes")
    p.add_argument("--k2", type=positive_int, default=50, help="steps each backward pass reaches back")
    p.add_argument("--batch-size", type=positive_int, default=12, help="parallel columns")
    p.add_argument("--seq-len", type=positive_int, default=100, help="steps per batch")
    p.add_argument("--embedding", type=positive_int, default=64, help="character embedding size")
    p.add_argument("--hidden", type=positive_int, default=256, help="LSTM hidden size")
    p.add_argument("--layers", type=positive_int, default=1, help="LSTM layers")
    p.add_argument("--epochs", type=positive_int, default=2, help="passes over the training text")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="Adam learning rate")
    p.add_argument("--clip", type=non_negative_float, default=1.0, help="gradient norm clipping, 0 to disable")
    p.add_argument("--accumulation", type=positive_int, default=1, help="windows per optimizer step")
    p.add_argument(
        "--amp", choices=("none", "bf16", "fp16"), default="none", help="autocast dtype (fp16 adds a GradScaler)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of torch's random numbers (initial weights, ARTBP)")


def run_options(p: argparse.ArgumentParser) -> None:
    """Where the run logs, checkpoints and resumes, and whether it shows progress."""
    p.add_argument(
        "--logdir",
        type=Path,
        default=None,
        help="TensorBoard and checkpoint directory (default: a new runs/char_lm-DATE-TIME/ for every run)",
    )
    p.add_argument(
        "--checkpoint-every", type=non_negative_int, default=100, help="iterations between checkpoints, 0 for none"
    )
    p.add_argument("--resume", type=existing_file, help="checkpoint file to continue from (default: none)")
    p.add_argument(
        "--trainer",
        choices=("ignite", "lightning"),
        default="ignite",
        help="the trainer's framework: ignite's Engine (create_tbptt_trainer), or Lightning's Trainer\n"
        "(TBPTTModule, pip install 'ignite-tbptt[lightning]'; one process, checkpoints at each epoch's end)",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="do not show the progress bar (or, in a file, the progress lines)"
    )


def process_options(p: argparse.ArgumentParser) -> None:
    """``--nproc``, ``--fsdp`` and ``--threads``: the processes that train, whether they shard the model, threads."""
    p.add_argument(
        "--nproc",
        type=positive_int,
        default=1,
        help="processes to train on (gloo on CPU, nccl on CUDA); each takes its share of the columns",
    )
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="shard the model over the --nproc processes with FSDP2 (fully_shard per layer and at the root)",
    )
    add_threads_option(p)


def truncation_options(p: argparse.ArgumentParser) -> None:
    """The options that record the gradient reach and choose the windows otherwise than --k1/--k2."""
    p.add_argument(
        "--reach",
        type=non_negative_int,
        default=0,
        help="record the gradient reach of every N-th window (TensorBoard: train/reach_at_cut and the\n"
        "gradient_reach picture), 0 for none",
    )
    p.add_argument(
        "--reach-stride",
        type=positive_int,
        help="with --reach: also a point of the profile every S steps of a recorded window (default: none)",
    )
    p.add_argument(
        "--adaptive",
        type=fraction,
        metavar="DELTA",
        help="let k2 follow the measured gradient decay (AdaptiveTruncation), keeping the estimated truncation\n"
        "bias under DELTA, in (0, 1); k2 starts at --k2 (at least k1 + 1) and stays in (k1, --k2-max]\n"
        "(TensorBoard: train/k2; default: fixed k2)",
    )
    p.add_argument("--k2-max", type=positive_int, default=200, help="with --adaptive: the longest k2")
    p.add_argument(
        "--artbp",
        type=positive_int,
        metavar="L",
        help="unbiased truncation (ARTBP) instead of --k1/--k2: windows of L steps on average, ending at random\n"
        "candidate points every --artbp-grid steps (default: fixed windows)",
    )
    p.add_argument("--artbp-grid", type=positive_int, default=5, help="with --artbp: steps between candidate points")


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.char_lm``, each with its check, help and default."""
    p = example_parser("char_lm", __doc__)
    data_options(p)
    model_options(p)
    add_device_option(p)
    add_cuda_graphs_option(p)
    run_options(p)
    process_options(p)
    truncation_options(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read, then together (:func:`check`)."""
    p = parser()
    args = parse(p, argv)
    check(p, args)
    return args


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse options that cannot go together, with the fix, before anything loads."""
    if args.artbp and args.adaptive:
        p.error("--artbp and --adaptive choose the windows in two ways: pass one of them.")
    if args.artbp and args.artbp < args.artbp_grid:
        p.error(
            f"--artbp {args.artbp} is shorter than --artbp-grid {args.artbp_grid}: pass --artbp {args.artbp_grid} "
            "or more, or a smaller --artbp-grid."
        )
    if args.adaptive and args.k2_max <= args.k1:
        p.error(
            f"--adaptive keeps k2 in (k1, --k2-max], empty with --k2-max {args.k2_max} and --k1 {args.k1}: pass "
            f"--k2-max {args.k1 + 1} or more."
        )
    if args.cuda_graphs and (args.k2 < args.k1 or args.artbp or args.adaptive):
        p.error(
            f"--cuda-graphs captures fixed windows with k2 >= k1: pass --k2 {args.k1} or more, without --artbp and "
            "--adaptive."
        )
    if args.trainer == "lightning" and importlib.util.find_spec("lightning") is None:
        p.error(
            "--trainer lightning trains on PyTorch Lightning, which is not installed: pip install "
            '"ignite-tbptt[lightning]", or leave --trainer lightning out.'
        )
    if args.trainer == "lightning":
        ignite_only = [
            option
            for option, used in (
                (f"--nproc {args.nproc}", args.nproc > 1),
                ("--fsdp", args.fsdp),
                ("--cuda-graphs", args.cuda_graphs),
                (f"--adaptive {args.adaptive}", args.adaptive),
                (f"--reach {args.reach}", args.reach),
                (f"--reach-stride {args.reach_stride}", args.reach_stride),
            )
            if used
        ]
        if ignite_only:
            p.error(
                f"{ignite_only[0]} is the ignite trainer's here (an ignite handler or launcher): leave it out with "
                "--trainer lightning, or leave --trainer lightning out."
            )
    if args.fsdp and args.nproc < 2:
        p.error("--fsdp shards the model over processes: pass --nproc 2 or more.")
    if args.logdir is not None and args.logdir.exists() and not args.logdir.is_dir():
        p.error(f"--logdir {args.logdir} is a file: pass a directory, or leave --logdir out for a new runs/char_lm-*.")
    check_device(p, args)


def check_device(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse processes the GPUs torch sees cannot hold, and CUDA graphs off a CUDA device."""
    import torch  # the options are read: --device has imported it already, or its default has

    gpus, device = torch.cuda.device_count(), torch.device(args.device)
    if args.amp == "fp16" and device.type == "cpu":
        p.error(
            "--amp fp16 on the CPU: its LSTM kernels (oneDNN) have none for float16; pass --amp bf16, or --device cuda."
        )
    if args.cuda_graphs and device.type != "cuda":
        p.error(
            f"--cuda-graphs captures windows on a CUDA device, and the run is on {device.type}: pass "
            f"--device cuda{'' if gpus else ' on a machine with a GPU'}, or leave --cuda-graphs out."
        )
    if args.nproc > max(gpus, 1) and device.type == "cuda":
        fix = f"pass --nproc {gpus} or fewer, or --device cpu" if gpus else "pass --device cpu"
        p.error(f"--nproc {args.nproc} on CUDA puts each process on a GPU of its own, and torch sees {gpus}: {fix}.")
    if args.nproc > 1 and device.type == "cuda" and device.index is not None:
        p.error(
            f"--device {args.device} with --nproc {args.nproc} would put every process on one device; each process "
            "takes the GPU of its local rank: pass --device cuda."
        )


def main(argv: list[str] | None = None) -> dict:
    """Train the model; returns the validation bits per character of each epoch and the unigram baseline."""
    args = parse_args(argv)
    if args.trainer == "lightning":
        from ._char_lm_lightning import train_lightning

        return train_lightning(args)
    from ._char_lm import run  # torch and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    options = parse_args()  # --help, or a refused option, answers before anything more is done
    per_process = None if options.nproc == 1 else max(1, (os.cpu_count() or 1) // options.nproc)
    tell_if_cores_are_busy("pass --threads 1", options.threads or per_process)
    try:
        history = main()
    except KeyboardInterrupt:  # before training started, or a second Ctrl-C
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(130 if history.get("interrupted") else 0)
