"""The data, model and training of ``python -m ignite_tbptt.examples.mamba_lm``.

:mod:`ignite_tbptt.examples.mamba_lm` reads the options and forwards every name
here, imported when first asked for.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch
from ignite.engine import Events

from ignite_tbptt import (
    BitsPerTarget,
    GradientClipping,
    count_targets,
    create_tbptt_evaluator,
    create_tbptt_trainer,
)
from ignite_tbptt.data import pack_sequences, prepare_batch
from ignite_tbptt.models import check_mamba2_schedule, mamba2_model_fn, mamba2_reset_hidden

from ._char_lm import LN2, Vocabulary, cross_entropy, split_documents, stdlib_documents
from .curves import log_figures, log_training
from .options import torch_threads

__all__ = ["build_model", "batch_major", "load_data", "train", "evaluate", "run"]


def build_model(vocab_size: int, args: argparse.Namespace) -> torch.nn.Module:
    """A small ``Mamba2ForCausalLM`` with the scan's blocks ``--k1`` long (one block per model call)."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    config = Mamba2Config(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        num_heads=args.heads,
        head_dim=2 * args.hidden // args.heads,  # expand 2: the heads span the inner width
        expand=2,
        state_size=args.state,
        n_groups=1,
        num_hidden_layers=args.layers,
        chunk_size=args.k1,
        conv_kernel=4,
        tie_word_embeddings=True,
    )
    return Mamba2ForCausalLM(config)


def batch_major(k1: int | None = None) -> Any:
    """A ``prepare_batch`` turning ``(T, B)`` packed batches into Mamba2's ``(B, T)`` (``time_dim=1``).

    With ``k1``, a sequence also starts at every ``k1``-th step of every column: the state is reset at every window's
    start, so that each window is an independent chunk (batches a multiple of ``k1`` steps long).
    """

    def prepare(batch: Any, device: Any = None, non_blocking: bool = False) -> tuple[torch.Tensor, ...]:
        x, y, starts = prepare_batch(batch, device, non_blocking)
        x, y, starts = x.t().contiguous(), y.t().contiguous(), starts.t().clone()  # a copy: the batch stays as it is
        if k1 is not None:
            starts[:, ::k1] = True
        return x, y, starts

    return prepare


def load_data(args: argparse.Namespace) -> tuple[Vocabulary, Any, Any, float, int]:
    """The vocabulary, training and validation batches, the unigram bits per character and the characters predicted.

    The held-out tail (``--valid-fraction``) is cut into ``--valid-columns`` pieces, each read from a zero state.
    """
    documents = stdlib_documents()
    if args.max_chars:
        documents = split_documents(documents, 1 - args.max_chars / sum(len(d) for d in documents))[0]
    train_docs, valid_docs = split_documents(documents, args.valid_fraction)
    vocab = Vocabulary("".join(train_docs))
    train_docs = sorted(train_docs, key=len, reverse=True)  # longest first: the columns end close together
    columns = min(args.batch_size, len(train_docs))
    train = pack_sequences([vocab.encode(d) for d in train_docs], columns, args.seq_len, drop_last=True, align=args.k1)
    valid_text = "\n".join(valid_docs)
    size = math.ceil(len(valid_text) / args.valid_columns)
    pieces = [valid_text[i : i + size] for i in range(0, len(valid_text), size)]
    valid = pack_sequences([vocab.encode(p) for p in pieces], len(pieces), args.seq_len, align=args.k1)
    predicted = "".join(p[1:] for p in pieces)  # every character but each piece's first
    return vocab, train, valid, vocab.unigram_bpc(predicted), len(predicted)


def run_name(args: argparse.Namespace) -> str:
    """The run's log directory under ``--logdir``: ``carried``, or ``reset-every-window``."""
    return "reset-every-window" if args.reset_every_window else "carried"


def train(args: argparse.Namespace, vocab_size: int, batches: Any) -> tuple[torch.nn.Module, float, float]:
    """The model trained for ``--steps`` optimizer steps; returns it, the seconds it took and the last training bpc."""
    torch.manual_seed(args.seed)
    model = build_model(vocab_size, args).to(args.device)
    check_mamba2_schedule(args.k1, args.k2, batch_length=args.seq_len)  # every model call two steps or more
    trainer = create_tbptt_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=args.lr),
        cross_entropy,
        args.k1,
        args.k2,
        time_dim=1,
        carry_hidden=True,
        device=args.device,
        prepare_batch=batch_major(args.k1 if args.reset_every_window else None),
        model_fn=mamba2_model_fn,
        reset_hidden=mamba2_reset_hidden,
        target_count_fn=count_targets,  # the alignment's padding does not count
    )
    if args.clip > 0:
        GradientClipping(model, max_norm=args.clip).attach(trainer)
    log_training(trainer, args, run_name(args))
    iterations = math.ceil(args.steps * args.k1 / args.seq_len)  # every batch holds seq_len / k1 windows
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=iterations), lambda engine: engine.terminate())

    @trainer.on(Events.ITERATION_COMPLETED(every=max(1, iterations // 5)))
    def report(engine: Any) -> None:
        print(
            f"  iteration {engine.state.iteration}/{iterations}: {engine.state.output / LN2:.3f} bits/char", flush=True
        )

    start = time.perf_counter()
    state = trainer.run(batches, max_epochs=math.ceil(iterations / len(batches)))
    return model, time.perf_counter() - start, state.output / LN2


def evaluate(model: torch.nn.Module, batches: Any, args: argparse.Namespace, reset_every: int | None = None) -> float:
    """Validation bits per character: the state carried through each piece, or reset every ``reset_every`` steps."""
    evaluator = create_tbptt_evaluator(
        model,
        {"bpc": BitsPerTarget(cross_entropy)},
        time_dim=1,
        carry_hidden=True,
        device=args.device,
        prepare_batch=batch_major(reset_every),
        model_fn=mamba2_model_fn,
        reset_hidden=mamba2_reset_hidden,
    )
    return evaluator.run(batches).metrics["bpc"]


def run(args: argparse.Namespace) -> dict:
    """Train and evaluate; returns the validation bits per character (carried and chunked), seconds and settings.

    Runs on ``args.threads`` of torch's CPU threads where given, and gives torch back its own number after.
    """
    with torch_threads(args.threads):
        return train_and_evaluate(args)


def train_and_evaluate(args: argparse.Namespace) -> dict:
    """:func:`run` on the threads it set."""
    vocab, train_batches, valid, unigram, predicted = load_data(args)
    mode = "independent chunks (state reset every window)" if args.reset_every_window else "state carried"
    print(
        f"Mamba2, {args.layers} layers, hidden {args.hidden}, {args.heads} heads, SSM state {args.state}; "
        f"TBPTT({args.k1}, {args.k2}), {mode}; {train_batches.steps * train_batches.batch_size:,} training characters "
        f"per epoch, {predicted:,} validation characters, unigram {unigram:.2f} bits/char",
        flush=True,
    )
    model, seconds, train_bpc = train(args, len(vocab), train_batches)
    carried = evaluate(model, valid, args)
    chunked = evaluate(model, valid, args, reset_every=args.k1)
    log_figures(args, run_name(args), {"valid_bpc": carried, "valid_bpc_chunks": chunked})
    print(
        f"after {args.steps} optimizer steps ({seconds:.0f} s): validation {carried:.3f} bits/char with the state "
        f"carried, {chunked:.3f} with it reset every {args.k1} characters",
        flush=True,
    )
    return {
        "mode": "reset" if args.reset_every_window else "carried",
        "valid_bpc": carried,
        "valid_bpc_chunks": chunked,
        "train_bpc": train_bpc,
        "unigram_bpc": unigram,
        "seconds": seconds,
        "k1": args.k1,
        "k2": args.k2,
    }
