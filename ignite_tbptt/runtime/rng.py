"""Capture and replay the random state of a forward pass, so that a recomputed segment draws the same dropout."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["RNGState", "capture", "replayed"]

RNGState = tuple[torch.Tensor, torch.Tensor | None]


def capture(device: torch.device) -> RNGState:
    """The CPU generator's state and, for a CUDA ``device``, that device's generator state."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


@contextmanager
def replayed(state: RNGState, device: torch.device) -> Iterator[None]:
    """Run the block from ``state``, leaving the generators as they were before it."""
    cpu, cuda = state
    with torch.random.fork_rng(devices=[device] if cuda is not None else []):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)
        yield
