"""Capture and restore the random state of a forward pass, so that a recomputed segment draws the same dropout."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["RNGState", "capture", "same", "restored", "own_dropout_state", "refuse_own_dropout_state"]

_OWN_DROPOUT_STATE = (
    "{where} runs forward passes again, and recurrent modules with dropout between their layers ({names}) draw it "
    "from cuDNN's own random state on CUDA, which torch's generators do not hold: a forward pass run again would "
    "draw other masks than it drew the first time, and the gradients would not be the eager trainer's. Use "
    "dropout=0 in those modules (dropout of your own between single-layer modules is drawn again alike), or {fix}."
)
_CAPTURED_DROPOUT_STATE = (
    "{where} would capture cuDNN's own dropout state of {names} (recurrent modules with dropout between their "
    "layers): a reseed (torch.manual_seed, deterministic=True every epoch) replaces it, and the graphs captured "
    "before would write into freed memory. Use dropout=0 in those modules (dropout of your own between single-layer "
    "modules is captured as any operator), or {fix}."
)

RNGState = tuple[torch.Tensor, torch.Tensor | None]


def capture(device: torch.device) -> RNGState:
    """The CPU generator's state and, for a CUDA ``device``, that device's generator state."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def same(a: RNGState, b: RNGState) -> bool:
    """Whether two states :func:`capture` took for the same device are equal: no random number was drawn between."""
    (cpu, cuda), (cpu_after, cuda_after) = a, b
    if not torch.equal(cpu, cpu_after):
        return False
    return cuda is None or (cuda_after is not None and torch.equal(cuda, cuda_after))


def own_dropout_state(model: torch.nn.Module) -> list[str]:
    """The modules of ``model`` that draw random numbers from a state of their own on CUDA, by name.

    ``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` with ``dropout > 0`` and more than one layer: cuDNN keeps their dropout
    state in a buffer of its own, which :func:`capture` and :func:`restored` do not reach.
    """
    return [
        name or type(module).__name__
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.RNNBase) and module.dropout > 0 and module.num_layers > 1
    ]


def refuse_own_dropout_state(model: torch.nn.Module, where: str, fix: str, captured: bool = False) -> None:
    """Refuse ``model`` with modules of :func:`own_dropout_state`, where forward passes run again or are captured.

    The trainer trains in training mode, whatever mode the model is in as the trainer is built. ``captured``: a CUDA
    graph would capture cuDNN's dropout state by address (at any k2), which a reseed replaces under it.

    Raises:
        ValueError: naming the modules, ``where`` forward passes run again (or are captured), and ``fix``.
    """
    names = own_dropout_state(model)
    if names:
        message = _CAPTURED_DROPOUT_STATE if captured else _OWN_DROPOUT_STATE
        raise ValueError(message.format(where=where, names=", ".join(repr(n) for n in names), fix=fix))


@contextmanager
def restored(state: RNGState, device: torch.device) -> Iterator[None]:
    """Run the block from ``state``, leaving the generators as they were before it."""
    cpu, cuda = state
    with torch.random.fork_rng(devices=[device] if cuda is not None else []):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)
        yield
