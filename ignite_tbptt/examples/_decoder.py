"""The data, model and training of ``python -m ignite_tbptt.examples.decoder``.

:mod:`ignite_tbptt.examples.decoder` reads the options and forwards every name
here, imported when first asked for.
"""

from __future__ import annotations

import argparse
import resource
import sys
from typing import Any

import torch
from torch import nn

from ignite_tbptt import create_tbptt_trainer

from .curves import log_figures, log_training

__all__ = ["Decoder", "decode", "delayed_copy", "peak_memory_mib", "run"]


class Decoder(nn.Module):
    """Embeddings of the input digit and of the previous output, an LSTM cell and a read-out; one step at a time.

    Args:
        vocab: number of symbols ``V``.
        hidden: hidden size ``H``.
    """

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.vocab, self.hidden = vocab, hidden
        self.digit = nn.Embedding(vocab, hidden)
        self.previous = nn.Embedding(vocab + 1, hidden)  # the extra symbol starts a sequence
        self.cell = nn.LSTMCell(hidden, hidden)
        self.readout = nn.Linear(hidden, vocab)


def decode(model: Decoder, x: torch.Tensor, hidden: Any) -> tuple[torch.Tensor, Any]:
    """``model_fn`` for :func:`~ignite_tbptt.create_tbptt_trainer`: generate ``T`` steps from the model's own output.

    Args:
        model: the decoder.
        x: ``(T, B)`` input digits.
        hidden: ``(h, c, previous_token)`` with ``h``, ``c`` of shape ``(B, H)`` and ``previous_token`` ``(B,)``,
            or None to start from the start symbol.

    Returns:
        Logits ``(T, B, V)`` and the new ``(h, c, previous_token)``.
    """
    steps, batch = x.shape[:2]
    if hidden is None:
        h = c = torch.zeros(batch, model.hidden, device=x.device)
        previous = torch.full((batch,), model.vocab, dtype=torch.long, device=x.device)
    else:
        h, c, previous = hidden
    logits = []
    for t in range(steps):
        h, c = model.cell(model.digit(x[t]) + model.previous(previous), (h, c))
        out = model.readout(h)
        logits.append(out)
        previous = out.topk(1, dim=-1).indices.squeeze(-1).detach()
    return torch.stack(logits), (h, c, previous)


def delayed_copy(vocab: int, length: int, batch: int, delay: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random digits ``x`` and targets ``y`` (``x`` ``delay`` steps later, 0 before), both ``(length, batch)``."""
    x = torch.randint(0, vocab, (length, batch))
    y = torch.zeros_like(x)
    y[delay:] = x[:-delay]
    return x, y


def peak_memory_mib() -> float:
    """Peak resident memory of this process in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train on one long generated stream; returns the last batch's accuracy, the loss and peak memory."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    # Drawn on the CPU, whatever the device, so that a seed gives the same stream everywhere; the trainer moves them.
    x, y = delayed_copy(args.vocab, args.length, args.batch_size, args.delay)
    steps = range(0, args.length, args.batch_length)
    batches = [(x[i : i + args.batch_length], y[i : i + args.batch_length]) for i in steps]
    model = Decoder(args.vocab, args.hidden).to(device)

    def loss_fn(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten())

    def accuracy(x: torch.Tensor, y: torch.Tensor, y_pred: torch.Tensor, loss: torch.Tensor) -> dict[str, float]:
        return {"loss": loss.item(), "accuracy": (y_pred.argmax(-1) == y).float().mean().item()}

    trainer = create_tbptt_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=args.lr),
        loss_fn,
        k1=1,  # per-token backward: every generated token is a window
        k2=args.k2,
        carry_hidden=True,
        gradient_accumulation_steps=args.accumulation,
        model_fn=decode,
        output_transform=accuracy,
        device=device,
    )
    log_training(trainer, args, f"tbptt-1-{args.k2}")
    state = trainer.run(batches, max_epochs=1)
    result = {**state.output, "peak_memory_mib": peak_memory_mib(), "windows": state.window}
    log_figures(args, f"tbptt-1-{args.k2}", {"last_batch_accuracy": result["accuracy"]})
    print(
        f"{args.length} tokens generated per stream, TBPTT(k1=1, k2={args.k2}): last batch accuracy "
        f"{result['accuracy']:.3f}, loss {result['loss']:.3f}; "
        f"peak resident memory {result['peak_memory_mib']:.0f} MiB",
        flush=True,
    )
    return result
