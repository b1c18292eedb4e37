"""The data, model and training of ``python -m ignite_tbptt.examples.xlstm_lm``.

:mod:`ignite_tbptt.examples.xlstm_lm` reads the options and forwards every name
here, imported when first asked for.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch
from ignite.engine import Events
from xlstm.xlstm_large.model import soft_cap, xLSTMLarge, xLSTMLargeConfig

from ignite_tbptt import BitsPerTarget, create_tbptt_evaluator, create_tbptt_trainer

from ._char_lm import batch_major, cross_entropy, held_out_corpus
from .curves import log_figures, log_training

__all__ = ["build_model", "xlstm_model_fn", "train", "validation_bpc", "show_error", "run"]


def build_model(vocab: int, embedding: int = 64, blocks: int = 2, heads: int = 2, chunk: int = 16) -> xLSTMLarge:
    """A small xLSTMLarge on the native CPU kernels in float32, returning its last states."""
    config = xLSTMLargeConfig(
        embedding_dim=embedding,
        num_heads=heads,
        num_blocks=blocks,
        vocab_size=vocab,
        return_last_states=True,
        mode="train",
        chunkwise_kernel="chunkwise--native_autograd",
        sequence_kernel="native_sequence__native",
        step_kernel="native",
        chunk_size=chunk,
        autocast_kernel_dtype="float32",
    )
    return xLSTMLarge(config)


def xlstm_model_fn(model: xLSTMLarge, x: torch.Tensor, state: Any) -> tuple[torch.Tensor, dict]:
    """The forward of xLSTMLarge with a new state: ``x`` ``(B, T)`` token ids -> logits ``(B, T, V)`` and the state.

    The state is ``{block: (c, n, m)}``. The model's own forward writes each block's new state into the old one, in
    place; each block returns it new, and so does this.
    """
    h, new_state = model.embedding(x), {}
    for i, block in enumerate(model.backbone.blocks):
        h, new_state[i] = block(h, None if state is None else state[i])
    logits = model.lm_head(model.backbone.out_norm(h))
    return soft_cap(logits, model.config.output_logit_soft_cap), new_state


def train(args: argparse.Namespace, vocab: int, train_tokens: torch.Tensor, k2: int) -> tuple[xLSTMLarge, float]:
    """A model trained with TBPTT(k1, k2) for ``args.steps`` optimizer steps; returns it and the seconds it took."""
    torch.manual_seed(args.seed)
    model = build_model(vocab, args.embedding, args.blocks, args.heads, args.k1).to(args.device)
    trainer = create_tbptt_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=args.lr),
        cross_entropy,
        args.k1,
        k2,
        time_dim=1,
        carry_hidden=True,
        model_fn=xlstm_model_fn,
        device=args.device,
    )
    log_training(trainer, args, f"tbptt-{args.k1}-{k2}")
    batches = batch_major(train_tokens, args.batch_size, args.seq_len)
    iterations = math.ceil(args.steps * args.k1 / args.seq_len)  # every batch holds seq_len / k1 windows
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=iterations), lambda engine: engine.terminate())
    start = time.perf_counter()
    trainer.run(batches, max_epochs=math.ceil(iterations / len(batches)))
    return model, time.perf_counter() - start


def validation_bpc(model: xLSTMLarge, tokens: torch.Tensor, args: argparse.Namespace) -> float:
    """Bits per character of ``tokens`` read as one carried stream in ``--batch-size`` columns."""
    evaluator = create_tbptt_evaluator(
        model,
        {"bpc": BitsPerTarget(cross_entropy)},
        time_dim=1,
        carry_hidden=True,
        model_fn=xlstm_model_fn,
        device=args.device,
    )
    return evaluator.run(batch_major(tokens, args.batch_size, args.seq_len)).metrics["bpc"]


def show_error(vocab: int, device: str | torch.device = "cpu") -> str:
    """What the trainer says when xLSTMLarge's own forward runs under it (its state written in place)."""
    model = build_model(vocab).to(device)
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        cross_entropy,
        16,
        32,
        time_dim=1,
        carry_hidden=True,
        model_fn=lambda m, x, state: m(x) if state is None else m(x, state),
        device=device,
    )
    tokens = torch.randint(0, vocab, (2, 65))  # on the CPU: the same tokens on every device; the trainer moves them
    try:
        trainer.run([(tokens[:, :-1], tokens[:, 1:])])
    except RuntimeError as error:
        return str(error)
    return "no error"


def run(args: argparse.Namespace) -> dict:
    """Train with k2 > k1 and with k2 = k1; returns the validation bits per character and seconds of each."""
    vocab, train_tokens, valid_tokens, unigram = held_out_corpus(args.max_chars)
    if args.show_error:
        message = show_error(len(vocab), args.device)
        print(message)
        return {"error": message}
    print(
        f"xLSTMLarge, {args.blocks} mLSTM blocks of {args.heads} heads, embedding {args.embedding}; "
        f"{len(train_tokens):,} training characters",
        flush=True,
    )
    result: dict[str, Any] = {"unigram_bpc": unigram}
    for name, k2 in (("k2>k1", args.k2), ("k2=k1", args.k1)):
        model, seconds = train(args, len(vocab), train_tokens, k2)
        bpc = validation_bpc(model, valid_tokens, args)
        result[name] = {"k1": args.k1, "k2": k2, "valid_bpc": bpc, "seconds": seconds}
        log_figures(args, f"tbptt-{args.k1}-{k2}", {"valid_bpc": bpc})
        print(
            f"TBPTT({args.k1}, {k2}): validation {bpc:.3f} bits/char after {args.steps} optimizer steps, "
            f"{seconds:.0f} s (unigram {result['unigram_bpc']:.2f})",
            flush=True,
        )
    return result
