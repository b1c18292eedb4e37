"""Command-line options every example shares."""

from __future__ import annotations

import argparse

import torch

__all__ = ["add_device_option", "add_cuda_graphs_option"]


def add_device_option(p: argparse.ArgumentParser, runs: str = "the model, the batches and the evaluation") -> None:
    """``--device``: where ``runs`` run; default ``cuda`` where torch sees one, else ``cpu``."""
    default = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument("--device", default=default, help=f"where {runs} run (default: cuda where available, else cpu)")


def add_cuda_graphs_option(p: argparse.ArgumentParser) -> None:
    """``--cuda-graphs``: capture the windows in CUDA graphs (``cuda_graphs=True``: a CUDA device, k1 = k2)."""
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture each k1 = k2 window in a CUDA graph once per shape and replay it (a CUDA device, k2 = k1)",
    )
