"""A ``torch.compile``d model trains to the eager model's parameters, and the trainer's hooks stay untraced."""

import copy
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._functorch.config
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

import ignite_tbptt
from ignite_tbptt import create_tbptt_trainer
from ignite_tbptt.runtime import weight_versions as versions

from ..helpers import make_batches
from ..reference import Net, cross_entropy

pytestmark = pytest.mark.slow  # compiling takes seconds per segment length


class Elman(nn.Module):
    """A hand-written recurrence, which Dynamo compiles whole (its graph has donated buffers)."""

    def __init__(self, n_in=3, n_hidden=5, n_out=4):
        super().__init__()
        self.inp = nn.Linear(n_in, n_hidden)
        self.rec = nn.Linear(n_hidden, n_hidden, bias=False)
        self.head = nn.Linear(n_hidden, n_out)

    def forward(self, x, hidden=None):
        h = x.new_zeros(x.shape[1], self.rec.in_features) if hidden is None else hidden
        outs = []
        for x_t in x.unbind(0):
            h = torch.tanh(self.inp(x_t) + self.rec(h))
            outs.append(h)
        return self.head(torch.stack(outs)), h


BATCHES = [(x.float(), y) for x, y in make_batches([7, 12, 5])]


def train(model, k1, k2, compiled, **options):
    trained = copy.deepcopy(model)
    net = torch.compile(trained) if compiled else trained
    trainer = create_tbptt_trainer(
        net, torch.optim.SGD(trained.parameters(), lr=0.5), cross_entropy, k1, k2, carry_hidden=True, **options
    )
    trainer.run(BATCHES, max_epochs=2)
    return trained


@pytest.mark.parametrize(
    "k1,k2,options",
    [(3, 3, {}), (3, 7, {}), (3, 7, {"gradient_accumulation_steps": 2}), (5, 2, {}), (3, 7, {"recompute": 2})],
    ids=["k1=k2", "k2>k1", "k2>k1-acc2", "k2<k1", "k2>k1-recompute"],
)
def test_a_compiled_model_trains_to_the_eager_parameters(k1, k2, options):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Elman()
    eager = train(model, k1, k2, compiled=False, **options)
    compiled = train(model, k1, k2, compiled=True, **options)
    assert max((p - q).abs().max().item() for p, q in zip(model.parameters(), eager.parameters())) > 1e-2
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    assert torch._functorch.config.donated_buffer  # the process keeps torch's setting


def test_the_trainers_hooks_are_never_traced_by_dynamo():
    # nn.GRU runs eagerly inside the compiled forward, where the weight hooks fire for k2 > k1.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net("gru")
    eager = train(model, 3, 7, compiled=False)
    compiled = train(model, 3, 7, compiled=True)
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    hooks = (versions.ParameterVersions._pack, versions._unpack, versions._SavedParameter.unpack, versions._key)
    assert all(_debug_get_cache_entry_list(hook.__code__) == [] for hook in hooks)  # never compiled
    package = Path(ignite_tbptt.__file__).parent
    traced = [code.co_name for code in torch._dynamo.utils.guard_failures if package in Path(code.co_filename).parents]
    assert traced == []  # nor recompiled
