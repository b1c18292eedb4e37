"""Command-line options every example shares."""

from __future__ import annotations

import argparse

import torch

__all__ = ["add_device_option", "add_cuda_graphs_option"]


def add_device_option(p: argparse.ArgumentParser, runs: str = "the model, the batches and the evaluation") -> None:
    """``--device``: where ``runs`` run; default ``cuda`` where torch sees one, else ``cpu``.

    A device that is not one, or a CUDA device torch does not see, is refused as the options are read, with the
    devices there are, rather than by CUDA once the model moves.
    """
    default = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument(
        "--device", default=default, type=_device, help=f"where {runs} run (default: cuda where available, else cpu)"
    )


def _device(text: str) -> str:
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: pass cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise argparse.ArgumentTypeError(f"torch {torch.__version__} sees no CUDA device: pass --device cpu")
        if device.index is not None and device.index >= count:
            last = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            raise argparse.ArgumentTypeError(f"torch sees {count} CUDA device(s): pass {last}, or cuda")
    return text


def add_cuda_graphs_option(p: argparse.ArgumentParser) -> None:
    """``--cuda-graphs``: capture the windows in CUDA graphs (``cuda_graphs=True``: a CUDA device, k1 = k2)."""
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture each k1 = k2 window in a CUDA graph once per shape and replay it (a CUDA device, k2 = k1)",
    )
