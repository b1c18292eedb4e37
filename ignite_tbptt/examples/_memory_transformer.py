"""The data, model and training of ``python -m ignite_tbptt.examples.memory_transformer``.

:mod:`ignite_tbptt.examples.memory_transformer` reads the options and forwards every name
here, imported when first asked for.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch
from ignite.engine import Events
from torch import nn

from ignite_tbptt import BitsPerTarget, create_tbptt_evaluator, create_tbptt_trainer

from ._char_lm import batch_major, cross_entropy, held_out_corpus
from .curves import log_figures, log_training

__all__ = [
    "LearnedMemory",
    "MemoryTransformer",
    "VARIANTS",
    "cross_entropy",
    "without_memory",
    "train",
    "validation_bpc",
    "run",
]


class LearnedMemory(nn.Module):
    """The memory a stream starts from: ``M`` learned tokens of width ``d``, the same for every column."""

    def __init__(self, tokens: int, width: int) -> None:
        super().__init__()
        self.tokens = nn.Parameter(torch.randn(1, tokens, width) * 0.02)

    def forward(self, batch: int) -> torch.Tensor:
        """The initial memory of ``batch`` columns, ``(B, M, d)``."""
        return self.tokens.expand(batch, -1, -1)


class MemoryTransformer(nn.Module):
    """A segment of characters between read and write memory tokens: ``(B, T)``, ``(B, M, d)`` -> logits, memory.

    Args:
        vocab: characters.
        width: model width ``d``.
        heads: attention heads.
        layers: encoder layers.
        memory: memory tokens ``M``.
        segment: the longest segment ``T`` (the positions learnt).
    """

    def __init__(
        self, vocab: int, width: int = 64, heads: int = 4, layers: int = 2, memory: int = 8, segment: int = 32
    ):
        super().__init__()
        self.memory = memory
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(1, 2 * memory + segment, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.start = LearnedMemory(memory, width)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(B, T, vocab)`` of the segment ``x`` and the memory written at its end, ``(B, M, d)``."""
        m, length = self.memory, x.shape[1]
        tokens = torch.cat([memory, self.embed(x), memory], dim=1) + self.position[:, : 2 * m + length]
        out = self.encoder(tokens, mask=self._mask(m, length, x.device))
        return self.head(out[:, m : m + length]), out[:, m + length :]

    @staticmethod
    def _mask(m: int, length: int, device: torch.device) -> torch.Tensor:
        # True = may not attend. Read memory sees itself; a character sees the read memory and the characters up to
        # it; the write memory sees everything.
        n = 2 * m + length
        blocked = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
        blocked[:m, :m] = False
        blocked[m + length :, :] = False
        return blocked


def without_memory(model: MemoryTransformer, x: torch.Tensor, memory: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The memoryless baseline's ``model_fn``: every segment reads the learned initial memory."""
    return model(x, model.start(x.shape[0]))


VARIANTS = {
    "memory, gradient through it (k2 > k1)": (3, True),
    "memory, no gradient through it (k2 = k1)": (1, True),
    "no memory": (1, False),
}


def run_name(args: argparse.Namespace, segments: int, memory: bool) -> str:
    """The variant's log directory under ``--logdir``: ``tbptt-32-96``, ``tbptt-32-32``, ``tbptt-32-32-no-memory``."""
    return f"tbptt-{args.segment}-{segments * args.segment}{'' if memory else '-no-memory'}"


def train(args: argparse.Namespace, vocab: int, tokens: torch.Tensor, segments: int, memory: bool) -> tuple:
    """A model trained for ``args.steps`` optimizer steps with k2 = ``segments`` segments; model and seconds."""
    torch.manual_seed(args.seed)
    model = MemoryTransformer(vocab, args.width, memory=args.memory, segment=args.segment).to(args.device)
    trainer = create_tbptt_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=args.lr),
        cross_entropy,
        args.segment,
        segments * args.segment,
        time_dim=1,
        carry_hidden=True,
        initial_state=model.start,
        device=args.device,
        **({} if memory else {"model_fn": without_memory}),
    )
    log_training(trainer, args, run_name(args, segments, memory))
    batches = batch_major(tokens, args.batch_size, args.seq_len)
    iterations = math.ceil(args.steps * args.segment / args.seq_len)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=iterations), lambda engine: engine.terminate())
    start = time.perf_counter()
    trainer.run(batches, max_epochs=math.ceil(iterations / len(batches)))
    return model, time.perf_counter() - start


def validation_bpc(model: MemoryTransformer, tokens: torch.Tensor, args: argparse.Namespace, memory: bool) -> float:
    """Bits per character of ``tokens`` read as one carried stream, one segment per model call."""
    evaluator = create_tbptt_evaluator(
        model,
        {"bpc": BitsPerTarget(cross_entropy)},
        time_dim=1,
        carry_hidden=True,
        segment_length=args.segment,
        initial_state=model.start,
        device=args.device,
        **({} if memory else {"model_fn": without_memory}),
    )
    return evaluator.run(batch_major(tokens, args.batch_size, args.seq_len)).metrics["bpc"]


def run(args: argparse.Namespace) -> dict:
    """Train the three variants; returns the validation bits per character and seconds of each."""
    vocab, train_tokens, valid_tokens, unigram = held_out_corpus(args.max_chars)
    print(
        f"memory transformer: {args.memory} memory tokens, segments of {args.segment} characters; "
        f"{len(train_tokens):,} training characters",
        flush=True,
    )
    result: dict[str, Any] = {"unigram_bpc": unigram}
    for name, (segments, memory) in VARIANTS.items():
        model, seconds = train(args, len(vocab), train_tokens, segments, memory)
        bpc = validation_bpc(model, valid_tokens, args, memory)
        result[name] = {"k1": args.segment, "k2": segments * args.segment, "valid_bpc": bpc, "seconds": seconds}
        log_figures(args, run_name(args, segments, memory), {"valid_bpc": bpc})
        print(f"{name}: validation {bpc:.3f} bits/char after {args.steps} optimizer steps, {seconds:.0f} s", flush=True)
    return result
