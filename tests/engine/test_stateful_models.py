"""Models that keep their state other than as a fresh returned tree (SPEC.md, "State that is not a fresh returned
tree"): in module attributes, in dataclasses, learned at the stream's start; and models that write into their state.

Each exactness test trains against the brute-force reference of ``tests/reference.py`` (float64, k2 > k1, sequence
starts, accumulation), which knows nothing of how the trainer carries the state.
"""

import copy
import dataclasses
import re

import pytest
import torch
from ignite.engine import Events
from torch import nn

from ignite_tbptt import create_tbptt_evaluator, create_tbptt_trainer
from ignite_tbptt.runtime import StateWrittenInPlace

from ..helpers import assert_resume_is_bit_identical, assert_same_parameters, assert_trained, make_batches, sgd
from ..reference import Net, cross_entropy, reference_train
from .test_sequence_starts import with_starts

PAIRS = [(3, 7), (4, 4), (5, 2)]


def train_both(
    trainer_model,
    reference_model,
    k1,
    k2,
    batches,
    accumulation=2,
    reference_options=None,
    lr=0.5,
    atol=1e-9,
    **options,
):
    """Train ``trainer_model`` with the trainer and ``reference_model`` by brute force; returns the trainer.

    Both use SGD with learning rate ``lr``; their parameters must agree to ``atol``.
    """
    initial = copy.deepcopy(reference_model)
    trainer = create_tbptt_trainer(
        trainer_model,
        sgd(trainer_model, lr),
        cross_entropy,
        k1,
        k2,
        carry_hidden=True,
        gradient_accumulation_steps=accumulation,
        **options,
    )
    trainer.run(batches, max_epochs=2)
    reference_train(
        reference_model,
        sgd(reference_model, lr),
        cross_entropy,
        batches,
        k1,
        k2,
        carry_hidden=True,
        accumulation=accumulation,
        epochs=2,
        **(reference_options or {}),
    )
    assert_trained(reference_model, initial)
    assert_same_parameters(trainer_model, reference_model, atol)
    return trainer


# -- state held in module attributes ---------------------------------------------------------------------------
class AttributeNet(Net):
    """:class:`Net` keeping its LSTM state in ``self.state``, as stateful layers do; ``forward(x)`` returns y only."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state = None

    def forward(self, x):
        y, self.state = super().forward(x, self.state)
        return y


@pytest.mark.parametrize("k1,k2", PAIRS, ids=[f"k1={a}-k2={b}" for a, b in PAIRS])
def test_state_held_in_module_attributes_trains_as_the_returned_state_does(k1, k2):
    torch.manual_seed(0)
    model = AttributeNet().double()
    reference = Net().double()
    reference.load_state_dict(model.state_dict())
    batches = with_starts(make_batches([7, 12, 5]), density=0.15, at=(9,))
    train_both(model, reference, k1, k2, batches, module_state=["state"])
    assert isinstance(model.state[0], torch.Tensor) and model.state[0].grad_fn is None  # no graph left on the model


def test_module_state_is_saved_and_resumed_with_the_stream(tmp_path):
    batches = with_starts([(x.float(), y) for x, y in make_batches([7, 12, 5, 9, 11])], density=0.1)

    def build():
        torch.manual_seed(0)
        model = AttributeNet(n_hidden=8)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        trainer = create_tbptt_trainer(
            model, optimizer, cross_entropy, 3, 7, carry_hidden=True, deterministic=True, module_state=["state"]
        )
        return model, optimizer, trainer

    assert_resume_is_bit_identical(tmp_path, build, batches, stop_at=7, epochs=2)


@pytest.mark.parametrize("trained_first", [False, True])
def test_the_evaluator_carries_module_state_as_the_trainer_does(trained_first):
    torch.manual_seed(0)
    model = AttributeNet().double()
    if trained_first:  # the attribute then holds training's last state, which an evaluation must not start from
        create_tbptt_trainer(model, sgd(model), cross_entropy, 3, 6, carry_hidden=True, module_state=["state"]).run(
            make_batches([9])
        )
    reference = Net().double()
    reference.load_state_dict(model.state_dict())
    batches = make_batches([6, 4])
    got = create_tbptt_evaluator(model, carry_hidden=True, module_state=["state"])
    want = create_tbptt_evaluator(reference, carry_hidden=True)
    outputs = {"got": [], "want": []}
    for name, evaluator in (("got", got), ("want", want)):
        evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda e, n=name: outputs[n].append(e.state.output[0]))
        evaluator.run(batches)
    for a, b in zip(outputs["got"], outputs["want"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class LeakyAttributeNet(Net):
    """Keeps a membrane in ``self.mem`` (as snnTorch's ``init_hidden=True``) without telling the trainer."""

    def __init__(self):
        super().__init__()
        self.mem = torch.zeros(0)

    def forward(self, x, hidden=None):
        y, hidden = super().forward(x, hidden)
        self.mem = y.mean(0) if self.mem.numel() == 0 else 0.9 * self.mem + y.mean(0)
        return y + self.mem, hidden


def test_a_graph_left_in_an_attribute_is_reported_after_the_first_window():
    torch.manual_seed(0)
    model = LeakyAttributeNet().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 5, 10, carry_hidden=True)
    with pytest.raises(
        RuntimeError, match=r"after the first window the model still holds tensors with a graph in mem"
    ) as e:
        trainer.run(make_batches([12]))
    assert "module_state=['mem']" in str(e.value)


def test_a_module_state_path_that_names_nothing_is_refused_when_the_trainer_is_built():
    model = AttributeNet()
    with pytest.raises(ValueError, match="has no attribute 'membrane'"):
        create_tbptt_trainer(model, sgd(model), cross_entropy, 3, module_state=["membrane"])
    with pytest.raises(ValueError, match="no submodule 'lif'"):
        create_tbptt_trainer(model, sgd(model), cross_entropy, 3, module_state=["lif.mem"])
    with pytest.raises(TypeError, match="list of attribute paths"):
        create_tbptt_trainer(model, sgd(model), cross_entropy, 3, module_state="state")


# -- the returned state, also kept in an attribute --------------------------------------------------------------
class SpikingNet(nn.Module):
    """snnTorch's tutorial network: two ``snn.Leaky(init_hidden=False)`` layers whose membranes are passed in and
    returned as the state. snnTorch also keeps each neuron's last membrane in ``lif.mem``: the tensor it returns."""

    def __init__(self):
        super().__init__()
        snn = pytest.importorskip("snntorch")
        self.fc1, self.lif1 = nn.Linear(3, 6), snn.Leaky(beta=0.9, init_hidden=False)
        self.fc2, self.lif2 = nn.Linear(6, 4), snn.Leaky(beta=0.9, init_hidden=False)

    def forward(self, x, state=None):  # x: (T, B, 3); y_pred: lif2's membranes, (T, B, 4)
        m1, m2 = (self.lif1.reset_mem(), self.lif2.reset_mem()) if state is None else state
        membranes = []
        for x_t in x:
            s1, m1 = self.lif1(self.fc1(x_t), m1)
            _, m2 = self.lif2(self.fc2(s1.to(x.dtype)), m2)  # snnTorch's spikes are float32 whatever the input
            membranes.append(m2)
        return torch.stack(membranes), (m1, m2)


class HalfDeclaredSpikingNet(SpikingNet):
    """Returns lif2's membrane only; lif1, given none, reads its own from ``lif1.mem``: state the tree lacks."""

    def forward(self, x, state=None):
        if state is None:
            self.lif1.reset_mem()
        m2 = self.lif2.reset_mem() if state is None else state
        membranes = []
        for x_t in x:
            s1, _ = self.lif1(self.fc1(x_t))
            _, m2 = self.lif2(self.fc2(s1.to(x.dtype)), m2)
            membranes.append(m2)
        return torch.stack(membranes), m2


class KeepsItsState(Net):
    """:class:`Net` that also keeps ``self.last = kept(hidden)`` (``self.last_h = h`` for ``kept = h[0]``)."""

    def __init__(self, kept):
        super().__init__()
        self.kept, self.last = kept, None

    def forward(self, x, hidden=None):
        y, hidden = super().forward(x, hidden)
        self.last = self.kept(hidden)
        return y, hidden


@pytest.mark.parametrize(
    "k1,k2,recompute", [(5, 5, None), (3, 7, None), (3, 7, 2)], ids=["k1=5-k2=5", "k1=3-k2=7", "k1=3-k2=7-recompute"]
)
def test_snntorch_neurons_returning_their_membranes_train_exactly_though_they_keep_them_too(k1, k2, recompute):
    torch.manual_seed(0)
    model = SpikingNet().double()
    reference = copy.deepcopy(model)
    batches = with_starts(make_batches([7, 12, 5]), density=0.15)
    # snnTorch's surrogate spikes are float32 ((u > 0).float()), so each gradient through a spike is rounded to float32:
    # the trainer (a window's losses backpropagated together) and the reference (each step's loss alone) agree to
    # 2e-9, where a cut one step off moves the parameters by 0.05. With recomputation the attributes end holding the
    # membranes of the last segment rebuilt in the sweep.
    train_both(model, reference, k1, k2, batches, lr=0.1, atol=1e-7, recompute=recompute)
    assert model.lif1.mem.grad_fn is not None and model.lif2.mem.grad_fn is not None  # the caches were there


@pytest.mark.parametrize("kept", ["h", "(h, c)"])
@pytest.mark.parametrize("k1,k2", [(4, 4), (3, 7)], ids=["k1=4-k2=4", "k1=3-k2=7"])
def test_a_model_keeping_the_state_it_returns_in_an_attribute_trains_exactly(k1, k2, kept):
    torch.manual_seed(0)
    model = KeepsItsState((lambda hidden: hidden[0]) if kept == "h" else (lambda hidden: tuple(hidden))).double()
    reference = Net().double()
    reference.load_state_dict(model.state_dict())
    train_both(model, reference, k1, k2, with_starts(make_batches([7, 12, 5]), density=0.15))
    assert (model.last if kept == "h" else model.last[1]).grad_fn is not None


@pytest.mark.parametrize(
    "build,path",
    [
        (lambda: KeepsItsState(lambda hidden: hidden[0] * 2), "last"),
        (lambda: KeepsItsState(lambda hidden: hidden[0].clone()), "last"),  # equal values, another tensor
        (lambda: KeepsItsState(lambda hidden: [hidden[0], hidden[1] * 2]), "last[1]"),  # a list, one leaf no cache
        (HalfDeclaredSpikingNet, "lif1.mem"),
    ],
    ids=["a function of the state", "a copy of the state", "a list holding a function of it", "snntorch membrane"],
)
@pytest.mark.parametrize("k1,k2", [(5, 5), (5, 10)])
def test_an_attribute_holding_what_the_returned_state_does_not_is_still_refused(build, path, k1, k2):
    torch.manual_seed(0)
    model = build().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, k1, k2, carry_hidden=True)
    before = copy.deepcopy(model)
    with pytest.raises(
        RuntimeError,
        match=rf"after the first window the model still holds tensors with a graph in {re.escape(path)}",
    ) as e:
        trainer.run(make_batches([12]))
    assert f"module_state={[path]!r}" in str(e.value)
    assert_same_parameters(model, before, atol=0)  # refused before the first step


class ReadsItsCacheBack(SpikingNet):
    """Returns both membranes, but after the first call runs its neurons without them: each reads ``self.mem``."""

    def forward(self, x, state=None):
        m1, m2 = (self.lif1.reset_mem(), self.lif2.reset_mem()) if state is None else (None, None)
        membranes = []
        for x_t in x:
            s1, m1 = self.lif1(self.fc1(x_t), m1) if m1 is not None else self.lif1(self.fc1(x_t))
            _, m2 = self.lif2(self.fc2(s1.to(x.dtype)), m2) if m2 is not None else self.lif2(self.fc2(s1.to(x.dtype)))
            membranes.append(m2)
        return torch.stack(membranes), (m1, m2)


@pytest.mark.parametrize("k1,k2", [(5, 5), (3, 7)], ids=["k1=5-k2=5", "k1=3-k2=7"])
def test_a_model_that_reads_its_cached_state_back_instead_of_the_state_given_is_refused(k1, k2):
    # Its graph would grow across windows: at k2 > k1 it would train on silently, the cuts and resets never applied.
    torch.manual_seed(0)
    model = ReadsItsCacheBack().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, k1, k2, carry_hidden=True)
    with pytest.raises(RuntimeError, match=r"the hidden state the model returned \(state\[0\]\) has a graph reaching"):
        trainer.run(make_batches([12]))
    assert trainer.state.optimizer_step <= 1  # refused at the second call, before its backward pass


# -- states that are objects ------------------------------------------------------------------------------------
@dataclasses.dataclass
class LSTMState:
    h: torch.Tensor
    c: torch.Tensor


class DataclassNet(Net):
    """:class:`Net` whose state travels as a dataclass."""

    def forward(self, x, state=None):
        y, (h, c) = super().forward(x, None if state is None else (state.h, state.c))
        return y, LSTMState(h, c)


@pytest.mark.parametrize("k1,k2", [(5, 5), (5, 10)])
def test_a_dataclass_state_trains_as_a_tuple(k1, k2):
    torch.manual_seed(0)
    model = DataclassNet().double()
    reference = Net().double()
    reference.load_state_dict(model.state_dict())
    batches = with_starts(make_batches([7, 12, 5]), density=0.15)
    train_both(model, reference, k1, k2, batches)


class Opaque:
    def __init__(self, h):
        self.h = h


class OpaqueStateNet(Net):
    def forward(self, x, state=None):
        y, hidden = super().forward(x, None if state is None else state[1].h)
        return y, (0, Opaque(hidden))


def test_a_state_holding_an_object_the_trainer_cannot_see_into_is_named_at_the_first_call():
    torch.manual_seed(0)
    model = OpaqueStateNet("gru").double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 5, 10, carry_hidden=True)
    before = copy.deepcopy(model)
    with pytest.raises(TypeError, match=r"holds a .*Opaque at state\[1\], which the trainer cannot see into"):
        trainer.run(make_batches([12]))
    assert_same_parameters(model, before, atol=0)  # refused before any step


# -- a learned initial state ------------------------------------------------------------------------------------
class LearnedStart(nn.Module):
    """A learned GRU state for every column: ``(layers, batch, hidden)`` from one ``(layers, 1, hidden)`` parameter."""

    def __init__(self, hidden):
        super().__init__()
        self.h0 = nn.Parameter(torch.randn(1, 1, hidden) * 0.5)

    def forward(self, batch):
        return self.h0.expand(-1, batch, -1).contiguous()  # cuDNN takes a contiguous hx only


class LearnedStartNet(Net):
    """A GRU :class:`Net` whose stream starts from ``self.start``; ``forward(x)`` uses it itself (for the reference)."""

    def __init__(self):
        super().__init__("gru")
        self.start = LearnedStart(5)

    def forward(self, x, hidden=None):
        return super().forward(x, self.start(x.shape[1]) if hidden is None else hidden)


def reference_start(params, batch):
    """The reference's reset target: the learned state from the parameters of the step where a sequence starts."""
    return params["start.h0"].expand(-1, batch, -1)


@pytest.mark.parametrize("k1,k2", PAIRS, ids=[f"k1={a}-k2={b}" for a, b in PAIRS])
def test_a_learned_initial_state_gets_the_gradient_of_every_window_that_reaches_a_start(k1, k2):
    torch.manual_seed(0)
    model = LearnedStartNet().double()
    reference = copy.deepcopy(model)
    start = model.start.h0.detach().clone()
    batches = with_starts(make_batches([7, 12, 5]), density=0.1, at=(4, 13))
    train_both(
        model,
        reference,
        k1,
        k2,
        batches,
        initial_state=model.start,
        reference_options={"initial_state": reference_start},
    )
    assert (model.start.h0 - start).abs().max() > 1e-3  # it learned


def test_a_learned_initial_state_is_saved_and_resumed_with_the_model(tmp_path):
    batches = with_starts([(x.float(), y) for x, y in make_batches([7, 12, 5, 9, 11])], density=0.1)

    def build():
        torch.manual_seed(0)
        model = LearnedStartNet()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        trainer = create_tbptt_trainer(
            model, optimizer, cross_entropy, 3, 7, carry_hidden=True, deterministic=True, initial_state=model.start
        )
        return model, optimizer, trainer

    assert_resume_is_bit_identical(tmp_path, build, batches, stop_at=7, epochs=2)


def test_initial_state_and_a_reset_of_ones_own_are_not_given_together():
    model = LearnedStartNet()
    with pytest.raises(ValueError, match="initial_state or reset_hidden, not both"):
        create_tbptt_trainer(
            model, sgd(model), cross_entropy, 3, initial_state=model.start, reset_hidden=lambda h, s: h
        )
    with pytest.raises(TypeError, match="initial_state must be callable"):
        create_tbptt_trainer(model, sgd(model), cross_entropy, 3, initial_state=torch.zeros(1))


# -- models that write into their state --------------------------------------------------------------------------
class WritesIntoState(nn.Module):
    """An Elman RNN that copies its new state into the one it was given, as xLSTMLarge and HF caches do."""

    def __init__(self, write):
        super().__init__()
        self.write, self.cell, self.head = write, nn.RNNCell(3, 5), nn.Linear(5, 4)

    def forward(self, x, state=None):
        given = state
        h = torch.zeros(x.shape[1], 5, dtype=x.dtype) if state is None else state[1]
        outputs = []
        for x_t in x:
            h = self.cell(x_t, h)
            outputs.append(self.head(h))
        if given is None:
            return torch.stack(outputs), (torch.zeros(1, dtype=torch.long), h)
        if self.write == "copy":
            given[1].copy_(h)
        else:  # a slice assignment
            given[1][:, :3] = h[:, :3]
        return torch.stack(outputs), given


@pytest.mark.parametrize("write", ["copy", "slice"])
@pytest.mark.parametrize("k1,k2", [(4, 4), (4, 8)])
def test_a_model_writing_into_its_state_is_named_before_autograd_complains(write, k1, k2):
    torch.manual_seed(0)
    model = WritesIntoState(write).double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, k1, k2, carry_hidden=True)
    with pytest.raises(StateWrittenInPlace) as refused:
        trainer.run(make_batches([12]))
    message = str(refused.value)
    assert "wrote in place into state[1] of the hidden state it was given (shape (3, 5))" in message
    assert "in the segment [4, 8) of the window [4, 8)" in message
    assert "return new tensors" in message


def functional(m, x, state):
    """A ``model_fn`` that calls the model's parts and returns a fresh state: the fix the error points to."""
    h = torch.zeros(x.shape[1], 5, dtype=x.dtype) if state is None else state
    outputs = []
    for x_t in x:
        h = m.cell(x_t, h)
        outputs.append(m.head(h))
    return torch.stack(outputs), h


class ReturnsFreshState(WritesIntoState):
    def forward(self, x, state=None):
        return functional(self, x, state)


def test_a_functional_model_fn_around_the_same_model_trains_exactly():
    torch.manual_seed(0)
    model = WritesIntoState("copy").double()
    reference = ReturnsFreshState("copy").double()
    reference.load_state_dict(model.state_dict())
    batches = with_starts(make_batches([7, 12, 5]), density=0.15)
    train_both(model, reference, 4, 8, batches, model_fn=functional)
