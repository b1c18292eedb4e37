"""TBPTT on Lightning's Trainer: ``python -m benchmarks.lightning [--repeats N] [--markdown FILE]``.

Two measurements, each method run in turn in the same process, one CPU thread.

**The cost per window** (``benchmarks.overhead``'s model and data: a GRU of 8 units, batch 4, vocabulary 16, 4,000
steps in batches of 200, fused SGD, TBPTT(5, 5)): the hand-written fused loop and ``create_tbptt_trainer`` (the
overhead page's ``hand`` and ``ours``), beside the same hand loop written in a ``LightningModule`` under manual
optimization (``self.optimizers()``, ``manual_backward``, as Lightning's documentation writes TBPTT) and
``TBPTTModule``, each fitted by a ``Trainer`` without logger, checkpoints or progress bar. What matters is the
difference of each pair: what ``TBPTTModule`` adds per window over the Lightning hand loop, against what
``create_tbptt_trainer`` adds over the plain one. A run's fixed cost (building the trainer, Lightning's set-up) is
included in both members of a pair. Runs are interleaved and each method's time is its fastest run. Two
differences stay in the Lightning pair: the hand loop backpropagates through ``manual_backward``, which runs
Lightning's backward hooks (the precision plugin's and the strategy's, ``on_before_backward``,
``on_after_backward``) for each window, where ``TBPTTModule`` makes its own backward passes without them; and its
chunks are of k1 steps (``split``), which the recipe's ``tensor_split(k)`` gives only where a batch has k * k steps
(Lightning's example, 100 steps and k = 10), not here (200 steps, k1 = 5).

**Lightning's own example** (its documentation's TBPTT page, since Lightning 2.0): ``AverageDataset``, 300
sequences of 100 steps of 10 features, each target the sum of the input's two halves, one of them rolled by a
feature; an LSTM of 20 units and a linear read-out, batches of 10, Adam at 1e-3, 5 epochs. Lightning's recipe
splits each batch into ``truncated_bptt_steps = 10`` chunks with ``tensor_split``, starts the state at zeros every
batch, and steps the optimizer once per chunk on the chunk's mean loss. ``TBPTTModule`` with TBPTT(10, 10) and the
state started afresh every batch computes the same steps: the page shows that it trains the same parameters, bit
for bit, and what TBPTT(10, 20) (each window's loss backpropagated 10 steps further) gives on the same task; the
mean training loss of each epoch, the mean squared error of a fresh ``AverageDataset`` of 100 sequences (another
seed) run from a zero state over its whole length, and the seconds of ``fit``.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.functional import mse_loss
from torch.utils.data import DataLoader, TensorDataset

from benchmarks import methods, overhead
from benchmarks.report import markdown_table, rotated, write_page

K = 5  # the cost per window: TBPTT(5, 5)


def quiet_lightning() -> None:
    """Lightning's start-up lines and warnings about a small run's settings, left out of the page's output."""
    import lightning.pytorch  # noqa: F401  (its import sets its loggers' levels: set after it)

    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"lightning\..*")


def fit(module: Any, loader: Any, epochs: int = 1, callbacks: list | None = None) -> Any:
    """``module`` fitted by a ``Trainer`` on the CPU without logger, checkpoints, progress bar or summary."""
    from lightning.pytorch import Trainer

    trainer = Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(module, loader)
    return trainer


def hand_module(model: nn.Module, optimizer: Any, k1: int, loss_fn: Callable, time_dim: int = 0) -> Any:
    """The hand-written fused loop in a ``LightningModule``: chunks of ``k1``, one optimizer step each.

    Lightning's documented TBPTT under manual optimization: the state started at zeros every batch (``None``),
    ``manual_backward`` of each chunk's mean loss, a step through ``self.optimizers()``, the state detached, and the
    batch's mean loss logged as ``train_loss`` (``TBPTTModule`` logs it too).
    """
    from lightning.pytorch import LightningModule

    class Hand(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.automatic_optimization = model, False
            self.losses: list[torch.Tensor] = []

        def configure_optimizers(self) -> Any:
            return optimizer

        def training_step(self, batch: Any, batch_idx: int) -> None:
            wrapper, (x, y), hidden, losses = self.optimizers(), batch, None, []
            for xc, yc in zip(x.split(k1, dim=time_dim), y.split(k1, dim=time_dim)):
                y_pred, hidden = self.model(xc, hidden)
                loss = loss_fn(y_pred, yc)
                wrapper.zero_grad()
                self.manual_backward(loss)
                wrapper.step()
                hidden = methods._detach(hidden)
                losses.append(loss.detach())
            self.log("train_loss", torch.stack(losses).mean(), prog_bar=True)
            self.losses += losses

    return Hand()


def tbptt_module(model: nn.Module, optimizer: Any, k1: int, k2: int, loss_fn: Callable, **options: Any) -> Any:
    """A ``TBPTTModule`` of ``model`` stepping ``optimizer``."""
    from ignite_tbptt.lightning import TBPTTModule

    class Ours(TBPTTModule):
        def configure_optimizers(self) -> Any:
            return optimizer

    return Ours(model, loss_fn, k1, k2, **options)


# -- the cost per window -----------------------------------------------------------------------------------------
def lightning_hand(model: nn.Module, optimizer: Any, batches: list, k1: int, k2: int, device: Any) -> None:
    fit(hand_module(model, optimizer, k1, methods.loss_fn), DataLoader(batches, batch_size=None))


def lightning_ours(model: nn.Module, optimizer: Any, batches: list, k1: int, k2: int, device: Any) -> None:
    fit(tbptt_module(model, optimizer, k1, k2, methods.loss_fn), DataLoader(batches, batch_size=None))


CONTENDERS = {
    "hand": methods.hand,
    "ours (create_tbptt_trainer)": methods.ours,
    "hand, in a LightningModule": lightning_hand,
    "TBPTTModule": lightning_ours,
}


def cost_per_window(repeats: int, steps: int) -> dict[str, float]:
    """Microseconds per window of each contender, its fastest of ``repeats`` interleaved runs."""
    batches = overhead.make_batches(steps)
    windows = sum(-(-x.shape[0] // K) for x, _ in batches)
    for method in CONTENDERS.values():  # warm-up
        overhead.train(method, batches[:1], K, K)
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for repeat in range(repeats):
        for name in rotated(list(CONTENDERS), repeat):
            times[name].append(overhead.train(CONTENDERS[name], batches, K, K))
    print("timed the cost per window", file=sys.stderr, flush=True)
    return {name: min(values) / windows * 1e6 for name, values in times.items()}


def cost_table(us: dict[str, float]) -> str:
    names = list(CONTENDERS)
    over = {
        names[1]: us[names[1]] - us[names[0]],
        names[3]: us[names[3]] - us[names[2]],
    }
    rows = [[name, f"{us[name]:.0f}", f"{over[name]:+.0f}" if name in over else ""] for name in names]
    ratio = over[names[3]] / over[names[1]]
    text = markdown_table(["method", "µs per window", "µs per window over the hand loop beside it"], rows)
    return text + f"\n\nTBPTTModule's cost over the Lightning hand loop is {ratio:.2f} times the ignite trainer's.\n"


# -- Lightning's example ---------------------------------------------------------------------------------------------
def average_dataset(sequences: int, length: int = 100, seed: int = 0) -> TensorDataset:
    """Lightning's ``AverageDataset``: ``(sequences, length, 10)`` inputs, targets the halves' sum, one rolled."""
    x = torch.randn(sequences, length, 10, generator=torch.Generator().manual_seed(seed))
    top, bottom = x.chunk(2, -1)
    return TensorDataset(x, top + bottom.roll(shifts=1, dims=-1))


class AverageModel(nn.Module):
    """The example's model: an LSTM of 20 units over 10 features, batch first, and a linear read-out to 5."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(10, 20, batch_first=True)
        self.linear_out = nn.Linear(20, 5)

    def forward(self, x: torch.Tensor, hidden: Any = None) -> tuple[torch.Tensor, Any]:
        seq, hidden = self.rnn(x, hidden)
        return self.linear_out(seq), hidden


def train_example(method: str, epochs: int = 5, seed: int = 0) -> dict[str, Any]:
    """Train the example's model with the recipe or a TBPTTModule; its losses, test error, seconds, parameters."""
    from lightning.pytorch import Callback

    torch.manual_seed(seed)
    model = AverageModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if method == "recipe":
        module = hand_module(model, optimizer, 10, mse_loss, time_dim=1)
    else:
        k2 = {"TBPTTModule, TBPTT(10, 10)": 10, "TBPTTModule, TBPTT(10, 20)": 20}[method]
        module = tbptt_module(model, optimizer, 10, k2, mse_loss, time_dim=1)
    epoch_losses: list[float] = []

    class EpochLoss(Callback):  # each epoch's mean training loss, the same way for both
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if method == "recipe":
                epoch_losses.append(torch.stack(pl_module.losses).mean().item())
                pl_module.losses.clear()
            else:
                epoch_losses.append(trainer.callback_metrics["train_loss_epoch"].item())

    loader = DataLoader(average_dataset(300), batch_size=10)
    start = time.perf_counter()
    fit(module, loader, epochs, callbacks=[EpochLoss()])
    seconds = time.perf_counter() - start
    x, y = average_dataset(100, seed=1).tensors
    with torch.no_grad():
        test = mse_loss(model(x)[0], y).item()
    return {
        "losses": epoch_losses,
        "test": test,
        "seconds": seconds,
        "params": [p.detach() for p in model.parameters()],
    }


EXAMPLE = ["recipe", "TBPTTModule, TBPTT(10, 10)", "TBPTTModule, TBPTT(10, 20)"]


def example_table(results: dict[str, dict[str, Any]]) -> str:
    epochs = len(results[EXAMPLE[0]]["losses"])
    header = ["method", *(f"epoch {e + 1} loss" for e in range(epochs)), "test MSE", "seconds"]
    rows = [
        [
            "Lightning's recipe" if name == "recipe" else name,
            *(f"{loss:.4f}" for loss in r["losses"]),
            f"{r['test']:.4f}",
            f"{r['seconds']:.1f}",
        ]
        for name, r in results.items()
    ]
    same = all(
        torch.equal(p, q) for p, q in zip(results[EXAMPLE[0]]["params"], results[EXAMPLE[1]]["params"], strict=True)
    )
    verdict = "equal, bit for bit" if same else "NOT equal"
    return markdown_table(header, rows) + (
        f"\n\nThe parameters trained by Lightning's recipe and by TBPTTModule with TBPTT(10, 10): {verdict}.\n"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="interleaved runs of each method (the cost per window)")
    p.add_argument("--steps", type=int, default=4000, help="steps per run (the cost per window)")
    p.add_argument("--epochs", type=int, default=5, help="epochs of Lightning's example")
    p.add_argument("--markdown", type=Path, help="also write the page to this file")
    args = p.parse_args(argv)
    quiet_lightning()
    torch.set_num_threads(1)
    us = cost_per_window(args.repeats, args.steps)
    results = {name: train_example(name, args.epochs) for name in EXAMPLE}
    text = "## The cost per window\n\n" + cost_table(us) + "\n## Lightning's example\n\n" + example_table(results)
    print(text)
    if args.markdown:
        setup = f"{platform.machine()}, 1 thread, torch {torch.__version__}, {args.repeats} repeats, fastest run"
        intro = __doc__.split("\n\n", 1)[1]
        write_page(args.markdown, "TBPTT on Lightning's Trainer", "benchmarks.lightning", argv, setup, intro, text)
    return {"us": us, "example": results}


if __name__ == "__main__":
    main()
