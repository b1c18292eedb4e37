"""Clearing the gradients before each optimizer step's first window: as ``zero_grad()`` does, whoever does it.

Where the optimizer's ``zero_grad`` is torch's own, the trainer sets the gradients to ``None`` itself (what it does,
without its profiler range); an optimizer with a ``zero_grad`` of its own gets it called.
"""

import torch
from torch import nn

from ignite_tbptt import create_tbptt_trainer

from ..helpers import make_batches
from ..reference import Net, cross_entropy


class CountingAdam(torch.optim.Adam):
    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.calls = 0

    def zero_grad(self, set_to_none=True):
        self.calls += 1
        super().zero_grad(set_to_none)


class WithUnused(Net):
    """An unused layer: no gradient ever, so Adam must never step it (a zero gradient would move it by decay)."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(2, 2)


def train(make_optimizer, accumulation=2):
    torch.manual_seed(0)
    model = WithUnused().double()
    optimizer = make_optimizer(model.parameters())
    trainer = create_tbptt_trainer(
        model, optimizer, cross_entropy, 3, 5, carry_hidden=True, gradient_accumulation_steps=accumulation
    )
    trainer.run(make_batches([7, 12, 5]), max_epochs=2)
    return model, optimizer, trainer


def test_cleared_directly_the_parameters_are_those_of_torchs_zero_grad():
    def adamw(params):
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)

    def counting(params):
        return CountingAdam(params, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)

    direct, _, _ = train(adamw)
    called, optimizer, trainer = train(counting)
    assert optimizer.calls == trainer.state.optimizer_step > 0  # once per step: before its first window
    for p, q in zip(direct.parameters(), called.parameters()):
        assert torch.equal(p, q)
    assert direct.unused.weight.grad is None and torch.equal(direct.unused.weight, called.unused.weight)


def test_a_zero_grad_set_on_the_instance_is_called():
    calls = []

    def make(params):
        optimizer = torch.optim.SGD(params, lr=0.1)
        torch_zero_grad = optimizer.zero_grad
        optimizer.zero_grad = lambda set_to_none=True: (calls.append(1), torch_zero_grad(set_to_none))
        return optimizer

    _, _, trainer = train(make, accumulation=1)
    assert len(calls) == trainer.state.optimizer_step == trainer.state.window > 0


def test_a_profiled_run_keeps_torchs_zero_grad_range():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        train(lambda params: torch.optim.SGD(params, lr=0.1), accumulation=1)
    names = {event.key for event in profile.key_averages()}
    assert "Optimizer.zero_grad#SGD.zero_grad" in names
