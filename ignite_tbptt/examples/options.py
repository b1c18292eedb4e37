"""Command-line options every example shares."""

from __future__ import annotations

import argparse

import torch

__all__ = ["add_device_option"]


def add_device_option(p: argparse.ArgumentParser, runs: str = "the model, the batches and the evaluation") -> None:
    """``--device``: where ``runs`` run; default ``cuda`` where torch sees one, else ``cpu``."""
    default = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument("--device", default=default, help=f"where {runs} run (default: cuda where available, else cpu)")
