"""Who is speaking? A spiking network over spoken vowels, its membranes kept by snnTorch's neurons, trained with TBPTT.

The data and the task are those of :mod:`ignite_tbptt.examples.vowels` (the UCI Japanese Vowels set as ``sktime``
ships it, CC BY 4.0; name the speaker at every frame). The model is a spiking network of leaky integrate-and-fire
neurons from snnTorch (Eshraghian et al. 2023, "Training spiking neural networks using lessons from deep learning",
Proceedings of the IEEE 111(9)): the 12 coefficients of a frame drive 64 neurons as input current, their spikes
drive 9 non-spiking leaky read-out neurons, one per speaker, whose membrane potentials are the logits. The neurons
are built with ``init_hidden=True``, so they keep their membranes in their own attributes (``lif1.mem``,
``lif2.mem``) and the forward pass takes no state: the trainer is told where the state lives
(``module_state=["lif1.mem", "lif2.mem"]``) and carries it along each utterance, resets it where the next one
starts, and cuts its gradient at each window's cut, as for a returned state. Gradients pass the spikes through
snnTorch's surrogate (arctangent). It prints the test bits per frame and the share of utterances whose speaker is
named right at their last frame, against the same network trained without memory (its membranes reset at every
frame) and chance; the README compares them with the GRU of ``examples.vowels``.

Run::

    python -m ignite_tbptt.examples.spiking_vowels          # about 30 s on 2 CPU cores
"""

from __future__ import annotations

import argparse

import snntorch as snn
import torch
from torch import nn

from .options import add_device_option
from .vowels import SPEAKERS, compare, load_vowels, train_on

__all__ = ["SpikingSpeakerNet", "STATE", "main"]

#: Where the network keeps its state: the membranes of its two layers of neurons.
STATE = ["lif1.mem", "lif2.mem"]


class SpikingSpeakerNet(nn.Module):
    """Leaky integrate-and-fire neurons, then leaky read-out neurons: ``(T, B, 12) -> (T, B, 9)`` membranes.

    Args:
        features: coefficients per frame.
        hidden: spiking neurons.
        beta: the membranes' initial decay per frame (learnt).
    """

    def __init__(self, features: int = 12, hidden: int = 64, beta: float = 0.9) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.lif1 = snn.Leaky(beta=beta, learn_beta=True, init_hidden=True)
        self.fc2 = nn.Linear(hidden, SPEAKERS)
        # The read-out integrates and never spikes: its membrane is the speaker's logit.
        self.lif2 = snn.Leaky(beta=beta, learn_beta=True, init_hidden=True, output=True, reset_mechanism="none")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The read-out membranes at every frame; the neurons' membranes stay in ``lif1.mem`` and ``lif2.mem``."""
        logits = []
        for x_t in x:
            _, membrane = self.lif2(self.fc2(self.lif1(self.fc1(x_t))))
            logits.append(membrane)
        return torch.stack(logits)

    def reset(self) -> None:
        """Forget the membranes: the next frame starts a recording."""
        # snnTorch fills an empty membrane on the device of the one it replaces: keep it on the network's.
        device = self.fc1.weight.device
        for neuron in (self.lif1, self.lif2):
            neuron.mem = torch.zeros(0, device=device)


def fit(args: argparse.Namespace, utterances: list, memory: bool) -> SpikingSpeakerNet:
    """A network trained on ``utterances``, its membranes carried along each one, or reset at every frame."""
    torch.manual_seed(args.seed)
    return train_on(SpikingSpeakerNet(hidden=args.hidden), args, utterances, memory, module_state=STATE)


def last_frame_accuracy(model: SpikingSpeakerNet, utterances: list, memory: bool) -> float:
    """The share of utterances whose speaker the network names right at their last frame, each run alone."""
    right, device = 0, next(model.parameters()).device
    with torch.no_grad():
        for x, y in utterances:
            model.reset()
            frames = x if memory else x[-1:]
            right += int(model(frames.unsqueeze(1).to(device))[-1, 0].argmax().item() == y[-1].item())
    return right / len(utterances)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the example."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k1", type=int, default=4, help="frames between backward passes (default 4)")
    p.add_argument("--k2", type=int, default=8, help="frames each backward pass reaches back (default 8)")
    p.add_argument("--batch-size", type=int, default=16, help="parallel columns (default 16)")
    p.add_argument("--seq-len", type=int, default=40, help="frames per batch (default 40)")
    p.add_argument("--hidden", type=int, default=64, help="spiking neurons (default 64)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=5e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    add_device_option(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Train with and without memory; returns the test bits per frame and accuracies, and chance's."""
    args = parse_args(argv)
    train_set, test_set = load_vowels()
    print(
        f"{len(train_set)} training and {len(test_set)} test utterances; {args.hidden} leaky integrate-and-fire "
        f"neurons, membranes in {', '.join(STATE)}; TBPTT(k1={args.k1}, k2={args.k2})",
        flush=True,
    )
    return compare(args, train_set, test_set, fit, last_frame_accuracy, module_state=STATE)


if __name__ == "__main__":
    main()
