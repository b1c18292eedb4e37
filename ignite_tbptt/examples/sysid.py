"""Identify a nonlinear system from one recording: windows with a burn-in, or the state carried along the record.

The system is simulated by the package (:mod:`ignite_tbptt.data.systems`): a Duffing oscillator, the structure of
the Silverbox benchmark (Wigren and Schoukens, ECC 2013), ``y'' + 0.2 y' + y + y^3 = u`` sampled every 0.3 time
units, or a Wiener-Hammerstein chain (Schoukens, Suykens and Ljung, SYSID 2009), each driven by a random-phase
multisine of RMS 1: an estimation record of 4,000 samples, a validation record of 1,000 and a test record of 2,000.
An LSTM of 16 units learns the output ``y`` from the input ``u`` and is judged as system identification judges a
model, by a free run: run over the whole test record from a zero state, its root mean square error against the
system's output.

Three ways to train it, the same model and optimizer (``--method``):

- ``windows``: windows of ``--window`` steps cut at random places of the record and shuffled
  (:class:`~ignite_tbptt.data.RecordingWindows`), each from a zero state; the model runs the first ``--burn-in``
  steps of each, but their loss is left out while the state warms up (Schiller, Heinrich, Lopez and Müller,
  "Tuning the burn-in phase in training recurrent neural networks improves their performance", ICLR 2026);
- ``carried``: the record in ``--batch-size`` contiguous columns walked in order
  (:func:`~ignite_tbptt.data.recording_columns`), TBPTT(``--window``, ``--k2``), the state carried from window to
  window;
- ``full``: the whole record as one sequence, backpropagated whole at every optimizer step.

Run::

    python -m ignite_tbptt.examples.sysid                 # windows, burn-in 25: 6-9 s on 2 CPU cores
    python -m ignite_tbptt.examples.sysid --burn-in 0     # the same without a burn-in
    python -m ignite_tbptt.examples.sysid --method carried --logdir runs/sysid  # and its TensorBoard curves

Its figures, and the command that measures their spread: docs/examples/sysid.md; every method on both systems over
three seeds: ``python -m benchmarks.sysid`` (docs/benchmarks-sysid.md).

This module reads the options, and refuses one that cannot be right before anything loads; the data, the model and
the training are in ``_sysid``, whose names it forwards (``sysid.Simulator``, ``sysid.records``...).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .curves import add_logdir_option
from .options import (
    add_device_option,
    example_parser,
    job_attribute,
    non_negative_int,
    parse,
    positive_float,
    positive_int,
    tell_if_cores_are_busy,
)

if TYPE_CHECKING:  # forwarded by __getattr__, imported with torch when first asked for
    from ._sysid import METHODS, SYSTEMS, Simulator, records, simulation_error, train

__all__ = [
    "SYSTEMS",
    "METHODS",
    "Simulator",
    "records",
    "simulation_error",
    "train",
    "parser",
    "parse_args",
    "main",
]

JOB = "ignite_tbptt.examples._sysid"


def __getattr__(name: str) -> Any:
    """The job's names (systems, model, training), imported with torch when first asked for."""
    return job_attribute(JOB, name)


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m ignite_tbptt.examples.sysid``, each with its check, help and default."""
    p = example_parser("sysid", __doc__)
    p.add_argument("--system", choices=("duffing", "wiener-hammerstein"), default="duffing", help="what to identify")
    p.add_argument("--method", choices=("windows", "carried", "full"), default="windows", help="how to train")
    p.add_argument("--window", type=positive_int, default=50, help="steps per window: N, and k1 when carried")
    p.add_argument("--k2", type=positive_int, default=None, help="steps each backward pass reaches (default: k1)")
    p.add_argument(
        "--burn-in",
        type=non_negative_int,
        default=None,
        help="steps after each fresh start without loss (default: 25 for windows, 0 otherwise)",
    )
    p.add_argument(
        "--no-burn-in-gradient",
        dest="burn_in_gradient",
        action="store_false",
        help="run the burn-in without gradient (R2D2's) rather than backpropagate through it",
    )
    p.add_argument("--steps", type=positive_int, default=2000, help="optimizer steps")
    p.add_argument("--batch-size", type=positive_int, default=16, help="sequences per optimizer step")
    p.add_argument("--hidden", type=positive_int, default=16, help="LSTM cell size")
    p.add_argument("--lr", type=positive_float, default=1e-2, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the windows' places")
    add_device_option(p, "the model and the batches")
    add_logdir_option(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example, each checked as it is read, then together."""
    p = parser()
    args = parse(p, argv)
    if args.burn_in is None:
        args.burn_in = 25 if args.method == "windows" else 0
    if args.method == "windows" and args.burn_in >= args.window:
        p.error(
            f"--burn-in {args.burn_in} leaves no step of a --window {args.window} in the loss: pass a shorter "
            "--burn-in or a longer --window."
        )
    if args.method == "full" and args.k2 is not None:
        p.error("--method full backpropagates the whole record at every step: leave --k2 out.")
    if args.method == "windows" and args.window > 4000:
        p.error(f"--window {args.window} is longer than the record's 4000 samples: pass a shorter --window.")
    if args.method == "carried" and args.window * args.batch_size > 4000:
        p.error(
            f"--window {args.window} in --batch-size {args.batch_size} columns is more than the record's 4000 "
            "samples: pass fewer or shorter."
        )
    return args


def main(argv: list[str] | None = None) -> dict:
    """Read the options, then run the example (:func:`_sysid.run`); returns its figures."""
    args = parse_args(argv)
    from ._sysid import run  # torch and the package: once the options are read

    return run(args)


if __name__ == "__main__":
    parse_args()  # --help, or a refused option, answers before anything more is done
    tell_if_cores_are_busy()
    main()
