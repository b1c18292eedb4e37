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

    python -m ignite_tbptt.examples.decoder --length 2000
"""

from __future__ import annotations

import argparse
import resource
import sys
from typing import Any

import torch
from torch import nn

from ignite_tbptt import create_tbptt_trainer

from .options import add_device_option

__all__ = ["Decoder", "decode", "delayed_copy", "main"]


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=2000, help="tokens generated per stream (default 2000)")
    p.add_argument("--batch-length", type=int, default=200, help="tokens per batch of the stream")
    p.add_argument("--k2", type=int, default=8, help="steps each token's loss reaches back (default 8)")
    p.add_argument("--accumulation", type=int, default=4, help="tokens per optimizer step")
    p.add_argument("--delay", type=int, default=3, help="steps between reading a digit and writing it")
    p.add_argument("--vocab", type=int, default=6)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    add_device_option(p, "the model and the batches")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train on one long generated stream; returns the last batch's accuracy, the loss and peak memory."""
    args = parse_args(argv)
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
    state = trainer.run(batches, max_epochs=1)
    result = {**state.output, "peak_memory_mib": peak_memory_mib(), "windows": state.window}
    print(
        f"{args.length} tokens generated per stream, TBPTT(k1=1, k2={args.k2}): last batch accuracy "
        f"{result['accuracy']:.3f}, loss {result['loss']:.3f}; "
        f"peak resident memory {result['peak_memory_mib']:.0f} MiB",
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
