"""The data, model and training of ``python -m ignite_tbptt.examples.sysid``.

:mod:`ignite_tbptt.examples.sysid` reads the options and forwards every name here, imported when first asked for;
``benchmarks.sysid`` runs the same training over methods, systems and seeds.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ignite_tbptt import TBPTTEvents, create_tbptt_trainer, masked_loss
from ignite_tbptt.data import RecordingWindows, duffing, multisine, recording_columns, wiener_hammerstein

from .curves import log_figures, log_training

__all__ = ["SYSTEMS", "METHODS", "Simulator", "records", "simulation_error", "train", "run"]

# Each system's simulation of an input u (T,) and the band of its multisine, in cycles per sample.
SYSTEMS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[float, float]]] = {
    "duffing": (lambda u: duffing(u, 0.3, omega=1.0, zeta=0.1, alpha=1.0), (0.0, 0.05)),
    "wiener-hammerstein": (lambda u: wiener_hammerstein(u, saturation=0.5), (0.0, 0.15)),
}
METHODS = ("windows", "carried", "full")
LENGTHS = (4000, 1000, 2000)  # samples of the estimation, validation and test records


class Simulator(nn.Module):
    """An LSTM over the input ``u`` ``(T, B, 1)`` and a linear read-out: the predicted output ``(T, B, 1)``, state."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.rnn, self.out = nn.LSTM(1, hidden), nn.Linear(hidden, 1)

    def forward(self, u: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        h, state = self.rnn(u, state)
        return self.out(h), state


def records(system: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The estimation, validation and test records ``(u, y)`` of ``system``, each ``(T, 1)`` float32.

    Each record is one period of its own random-phase multisine of RMS 1 (phases from seeds 0, 1 and 2), simulated
    from rest, of :data:`LENGTHS` samples.
    """
    simulate, band = SYSTEMS[system]
    out = []
    for seed, length in enumerate(LENGTHS):
        u = multisine(length, band, rms=1.0, seed=seed)
        out.append((u.float().unsqueeze(1), simulate(u).float().unsqueeze(1)))
    return out


def simulation_error(model: nn.Module, record: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The RMS error of a free run of ``model`` over the whole ``record`` from a zero state (Silverbox's measure)."""
    u, y = record
    device = next(model.parameters()).device
    with torch.no_grad():
        y_pred, _ = model(u.unsqueeze(1).to(device))
    return (y_pred.squeeze(1).cpu() - y).pow(2).mean().sqrt().item()


def train(
    model: nn.Module,
    record: tuple[torch.Tensor, torch.Tensor],
    method: str,
    *,
    steps: int,
    window: int = 50,
    k2: int | None = None,
    burn_in: int = 0,
    burn_in_gradient: bool = True,
    batch_size: int = 16,
    lr: float = 1e-2,
    seed: int = 0,
    device: str = "cpu",
    attach: Callable[[Any], None] | None = None,
) -> float:
    """Train ``model`` on the estimation ``record`` for ``steps`` optimizer steps; returns the seconds it took.

    Methods (Adam at ``lr``, mean squared error, one optimizer step a batch):

    - ``"windows"``: windows of ``window`` steps at random places of the record, shuffled, each from a zero state
      (:class:`~ignite_tbptt.data.RecordingWindows`, ``carry_hidden=False``), ``batch_size`` of them a batch, each
      backpropagated ``k2`` steps (default: whole);
    - ``"carried"``: the record as ``batch_size`` contiguous columns walked in order
      (:func:`~ignite_tbptt.data.recording_columns`), TBPTT(``window``, ``k2``) with the state carried, a batch of
      ``window`` steps;
    - ``"full"``: the whole record as one sequence, backpropagated whole at every step (``window``, ``k2`` and
      ``batch_size`` unused).

    ``burn_in`` and ``burn_in_gradient`` go to the trainer (its first steps after each fresh start carry no loss);
    ``seed`` draws the windows' places and shuffles them; ``attach(trainer)`` may add handlers before the run.
    """
    u, y = record
    loss_fn: Any = masked_loss(nn.functional.mse_loss) if burn_in else nn.functional.mse_loss
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    options: dict[str, Any] = {"burn_in": burn_in, "burn_in_gradient": burn_in_gradient, "device": device}
    if method == "windows":
        windows = RecordingWindows([(u, y)], window, count=steps * batch_size, seed=seed)
        generator = torch.Generator().manual_seed(seed)
        batches: Any = DataLoader(
            windows, batch_size=batch_size, shuffle=True, generator=generator, collate_fn=RecordingWindows.collate
        )
        trainer, epochs = create_tbptt_trainer(model, optimizer, loss_fn, window, k2, **options), 1
    elif method in ("carried", "full"):
        columns, length = (batch_size, window) if method == "carried" else (1, u.shape[0])
        batches = recording_columns(u, y, columns, length)
        trainer = create_tbptt_trainer(model, optimizer, loss_fn, length, k2, carry_hidden=True, **options)
        epochs = -(-steps // len(batches))
    else:
        raise ValueError(f"method={method!r}: pass one of {', '.join(METHODS)}.")
    # The carried methods walk the record whole epochs at a time: stop at the step asked for, inside one.
    trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_COMPLETED(once=steps), lambda engine: engine.terminate())
    if attach is not None:
        attach(trainer)
    start = time.perf_counter()
    trainer.run(batches, max_epochs=epochs, epoch_length=None)
    return time.perf_counter() - start


def describe(args: argparse.Namespace) -> str:
    """The method of ``args`` in words: ``windows of 50 steps with a burn-in of 25``..."""
    burn_in = f", a burn-in of {args.burn_in}" + ("" if args.burn_in_gradient else " without gradient")
    burn_in = burn_in if args.burn_in else ""
    k2 = args.k2 or args.window
    return {
        "windows": f"windows of {args.window} steps at random places{burn_in}"
        + (f", TBPTT({args.window}, {k2})" if args.k2 else ""),
        "carried": f"{args.batch_size} columns, TBPTT({args.window}, {k2}) with the state carried{burn_in}",
        "full": f"the whole record backpropagated at every step{burn_in}",
    }[args.method]


def run(args: argparse.Namespace) -> dict[str, float]:
    """Identify ``args.system`` by ``args.method``: the test and validation RMSE, the output's RMS and the seconds."""
    estimation, validation, test = records(args.system)
    torch.manual_seed(args.seed)
    model = Simulator(args.hidden).to(args.device)
    name = f"{args.system}-{args.method}-m{args.burn_in}"
    seconds = train(
        model,
        estimation,
        args.method,
        steps=args.steps,
        window=args.window,
        k2=args.k2,
        burn_in=args.burn_in,
        burn_in_gradient=args.burn_in_gradient,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        device=args.device,
        attach=lambda trainer: log_training(trainer, args, name),
    )
    result = {
        "test_rmse": simulation_error(model, test),
        "validation_rmse": simulation_error(model, validation),
        "output_rms": test[1].pow(2).mean().sqrt().item(),
        "seconds": seconds,
    }
    log_figures(args, name, {"simulation_rmse": result["test_rmse"]})
    print(
        f"{args.system}, {describe(args)}, {args.steps} optimizer steps in {seconds:.1f} s: free-run test RMSE "
        f"{result['test_rmse']:.4f} (validation {result['validation_rmse']:.4f}; the output's RMS, the error of "
        f"answering 0: {result['output_rms']:.4f})",
        flush=True,
    )
    return result
