"""Adaptive k2 on a task with a known dependency length: ``python -m benchmarks.delayed_copy``.

The stream is random symbols ``x_t``; the target is the symbol ``d`` steps back, ``y_t = x_{t-d}``. Learning
it needs gradient that reaches ``d`` steps back from a loss; TBPTT(k1, k2) gives a window's last step a
reach of k2 and its first a reach of k2 - k1 + 1. The script trains the same LSTM with a fixed k2 shorter than
``d``, a fixed k2 comfortably longer, and :class:`~ignite_tbptt.AdaptiveTruncation` starting at the short k2,
and prints the accuracy on the last epoch and the k2 the adaptive run settled on.
"""

from __future__ import annotations

import argparse
import json

import torch
from ignite.engine import Events
from torch import nn

from ignite_tbptt import AdaptiveTruncation, TBPTTEvents, create_tbptt_evaluator, create_tbptt_trainer


class Copier(nn.Module):
    def __init__(self, symbols: int, hidden: int) -> None:
        super().__init__()
        self.embedding, self.lstm = nn.Embedding(symbols, 16), nn.LSTM(16, hidden)
        self.readout = nn.Linear(hidden, symbols)

    def forward(self, x, hidden=None):
        out, hidden = self.lstm(self.embedding(x), hidden)
        return self.readout(out), hidden


def loss_fn(y_pred, y):
    return nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten(), ignore_index=-100)


def data(delay: int, symbols: int, steps: int, batch: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    columns = torch.randint(0, symbols, (batch, steps), generator=g)
    targets = torch.full_like(columns, -100)
    targets[:, delay:] = columns[:, :-delay]  # y_t = x_{t - delay}
    return [(columns[:, i : i + length].t(), targets[:, i : i + length].t()) for i in range(0, steps, length)]


def train(k2, args, adaptive=None, seed=0):
    """Train on one stream for ``args.epochs`` epochs; accuracy on a new stream, and the k2 of each window."""
    torch.manual_seed(seed)
    model = Copier(args.symbols, args.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    trainer = create_tbptt_trainer(
        model, optimizer, loss_fn, args.k1, k2, carry_hidden=True, target_count_fn=lambda y_pred, y: (y != -100).sum()
    )
    if adaptive is not None:
        adaptive.attach(trainer)
    k2s = []
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda e: k2s.append(getattr(e.state, "k2", k2)))
    trainer.run(data(args.delay, args.symbols, args.steps, args.batch, 100, seed), max_epochs=args.epochs)
    counts = []
    evaluator = create_tbptt_evaluator(model, carry_hidden=True)

    @evaluator.on(Events.ITERATION_COMPLETED)
    def count(engine):
        y_pred, y = engine.state.output
        known = y != -100
        counts.append((int((y_pred.argmax(-1)[known] == y[known]).sum()), int(known.sum())))

    evaluator.run(data(args.delay, args.symbols, 1000, args.batch, 100, seed + 1))
    right, total = (sum(c) for c in zip(*counts))
    return {"accuracy": right / total, "k2_first": k2s[0], "k2_last": k2s[-1], "k2_max_seen": max(k2s)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delay", type=int, default=6)
    p.add_argument("--k1", type=int, default=4)
    p.add_argument("--short", type=int, default=5, help="the fixed k2 shorter than the delay")
    p.add_argument("--long", type=int, default=12, help="the fixed k2 longer than the delay")
    p.add_argument("--k2-max", type=int, default=30)
    p.add_argument("--delta", type=float, default=0.01)
    p.add_argument("--symbols", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-2)
    args = p.parse_args(argv)
    adaptive = AdaptiveTruncation(args.delta, k2_min=args.short, k2_max=args.k2_max, every=5)
    results = {
        f"fixed k2={args.short}": train(args.short, args),
        f"fixed k2={args.long}": train(args.long, args),
        "adaptive": train(args.short, args, adaptive),
    }
    print(json.dumps({"args": vars(args), "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
