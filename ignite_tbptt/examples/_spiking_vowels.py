"""The data, model and training of ``python -m ignite_tbptt.examples.spiking_vowels``.

:mod:`ignite_tbptt.examples.spiking_vowels` reads the options and forwards every name
here, imported when first asked for.
"""

from __future__ import annotations

import argparse

import snntorch as snn
import torch
from torch import nn

from ._vowels import SPEAKERS, compare, load_vowels, train_on

__all__ = ["SpikingSpeakerNet", "STATE", "last_frame_accuracy", "run"]

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


def run(args: argparse.Namespace) -> dict:
    """Train with and without memory; returns the test bits per frame and accuracies, and chance's."""
    train_set, test_set = load_vowels()
    print(
        f"{len(train_set)} training and {len(test_set)} test utterances; {args.hidden} leaky integrate-and-fire "
        f"neurons, membranes in {', '.join(STATE)}; TBPTT(k1={args.k1}, k2={args.k2})",
        flush=True,
    )
    return compare(args, train_set, test_set, fit, last_frame_accuracy, module_state=STATE)
