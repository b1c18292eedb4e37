"""Streams of many sequences: batches (x, y, starts) against the brute-force reference and against per-sequence runs."""

import copy
import functools

import pytest
import torch
from ignite.engine import Events
from torch import nn

from ignite_tbptt import create_tbptt_evaluator, create_tbptt_trainer, default_reset_hidden

from ..helpers import RecordingNet, assert_same_parameters, compare_with_reference, make_batches, sgd
from ..reference import Net, cross_entropy


def with_starts(batches, *, density, time_dim=0, at=(), seed=1):
    """``batches`` with random ``starts`` of the given density, plus starts in every column at stream steps ``at``."""
    g = torch.Generator().manual_seed(seed)
    out, offset = [], 0
    for x, y in batches:
        length = x.shape[time_dim]
        starts = torch.rand(length, x.shape[1 - time_dim], generator=g, device="cpu") < density  # alike everywhere
        for step in at:
            if offset <= step < offset + length:
                starts[step - offset] = True
        out.append((x, y, (starts if time_dim == 0 else starts.t().contiguous()).to(x.device)))
        offset += length
    return out


class TransposedCell(nn.Module):
    """A hand-written Elman cell whose hidden state is ``(H, B)`` and starts at 0.5: the default cannot reset it."""

    def __init__(self, n_in=3, n_hidden=5, n_out=4):
        super().__init__()
        self.inp, self.rec, self.head = nn.Linear(n_in, n_hidden), nn.Linear(n_hidden, n_hidden), nn.Linear(n_hidden, 4)

    def forward(self, x, hidden=None):
        h = torch.full((self.rec.in_features, x.shape[1]), 0.5, dtype=x.dtype) if hidden is None else hidden
        outputs = []
        for x_t in x:
            h = torch.tanh(self.inp(x_t) + self.rec(h.t())).t()
            outputs.append(self.head(h.t()))
        return torch.stack(outputs), h


def reset_transposed(hidden, starts):
    return torch.where(starts[None, :], torch.full_like(hidden, 0.5), hidden)


def compare(k1, k2, *, time_dim=0, density=0.15, at=(), **options):
    starts = functools.partial(with_starts, density=density, time_dim=time_dim, at=at)
    compare_with_reference(k1, k2, time_dim=time_dim, starts=starts, **options)


K_PAIRS = [(4, 4), (3, 7), (2, 5), (5, 2)]


@pytest.mark.parametrize("k1,k2", K_PAIRS, ids=[f"k1={a}-k2={b}" for a, b in K_PAIRS])
@pytest.mark.parametrize("carry_hidden", [False, True], ids=["fresh", "carry"])
@pytest.mark.parametrize("accumulation", [1, 2], ids=["acc1", "acc2"])
def test_starts_match_brute_force_reference(k1, k2, carry_hidden, accumulation):
    compare(k1, k2, carry_hidden=carry_hidden, accumulation=accumulation)


@pytest.mark.parametrize("density", [0.05, 0.5, 1.0], ids=["sparse", "dense", "every-step"])
def test_start_density(density):
    compare(3, 6, carry_hidden=True, density=density)


@pytest.mark.parametrize("k1,k2", [(3, 3), (3, 5), (4, 2)])
def test_starts_at_step_zero_and_at_window_boundaries(k1, k2):
    # Every column starts at the stream's first step, at each window's start, and at a batch's first step (7).
    compare(k1, k2, carry_hidden=True, density=0.0, at=(0, k1, 2 * k1, 3 * k1, 7))


@pytest.mark.parametrize("k1,k2", [(3, 3), (2, 5), (5, 2)])
def test_two_layer_gru(k1, k2):
    compare(k1, k2, carry_hidden=True, net=lambda _, batch_first: Net("gru", batch_first, layers=2), accumulation=2)


@pytest.mark.parametrize("k1,k2", [(3, 3), (2, 5), (5, 2)])
def test_time_dim_1(k1, k2):
    compare(k1, k2, carry_hidden=True, time_dim=1, density=0.2)


@pytest.mark.parametrize("k1,k2", [(3, 3), (2, 5), (5, 2)])
def test_hand_written_cell_with_its_own_reset(k1, k2):
    cell = lambda *_, **__: TransposedCell()  # noqa: E731
    compare(k1, k2, carry_hidden=True, net=cell, reset_hidden=reset_transposed, density=0.2)


@pytest.mark.parametrize("k1,k2", [(4, 4), (2, 5)])
def test_recomputation_mode(k1, k2):
    compare(k1, k2, carry_hidden=True, recompute=2, density=0.2)


def test_all_false_starts_are_no_starts():
    runs = []
    for starts in (False, True):
        torch.manual_seed(0)
        model = RecordingNet().double()
        batches = make_batches((7, 12, 5))
        if starts:
            batches = [(x, y, torch.zeros(x.shape[:2], dtype=torch.bool)) for x, y in batches]
        trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 3, 5, carry_hidden=True)
        trainer.run(batches, max_epochs=2)
        runs.append(model)
    plain, flagged = runs
    assert flagged.calls == plain.calls  # the same model calls
    for p, q in zip(plain.parameters(), flagged.parameters()):
        assert torch.equal(p, q)


def test_segments_end_only_where_a_column_starts():
    torch.manual_seed(0)
    model = RecordingNet().double()
    ((x, y),) = make_batches((12,))
    starts = torch.zeros(12, 3, dtype=torch.bool)
    starts[5, 1] = starts[9, 0] = True
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 4, carry_hidden=False)
    trainer.run([(x, y, starts)])
    # Windows [0, 4), [4, 8), [8, 12), split at the starts 5 and 9.
    assert [n for n, _ in model.calls] == [4, 1, 3, 1, 3]


def test_model_sees_the_starting_columns_reset():
    torch.manual_seed(0)
    model = Net("gru").double()
    ((x, y),) = make_batches((6,), batch=2)
    starts = torch.zeros(6, 2, dtype=torch.bool)
    starts[3, 0] = True
    seen = []

    def model_fn(m, x_seg, hidden):
        seen.append(None if hidden is None else hidden.detach().clone())
        return m(x_seg, hidden)

    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 6, carry_hidden=False, model_fn=model_fn)
    trainer.run([(x, y, starts)])
    assert len(seen) == 2 and seen[0] is None  # the window [0, 6) runs as [0, 3) and [3, 6)
    assert torch.equal(seen[1][:, 0], torch.zeros(1, 5)) and seen[1][:, 1].abs().min() > 0


def test_default_reset_zeroes_columns_and_their_gradient():
    h = torch.randn(2, 3, 4, requires_grad=True)
    c = torch.randn(3, 4, requires_grad=True)
    starts = torch.tensor([True, False, True])
    h_new, c_new = default_reset_hidden((h, c), starts)
    assert torch.equal(h_new[:, starts], torch.zeros(2, 2, 4)) and torch.equal(h_new[:, 1], h[:, 1])
    assert torch.equal(c_new[starts], torch.zeros(2, 4)) and torch.equal(c_new[1], c[1])
    (h_new.sum() + c_new.sum()).backward()
    assert torch.equal(h.grad[:, starts], torch.zeros(2, 2, 4)) and torch.equal(h.grad[:, 1], torch.ones(2, 4))
    assert torch.equal(c.grad, (~starts).float()[:, None].expand(3, 4))
    nan = torch.full((1, 3, 2), float("nan"))
    assert torch.equal(default_reset_hidden(nan, starts)[:, starts], torch.zeros(1, 2, 2))


def test_evaluator_equals_each_sequence_evaluated_alone():
    torch.manual_seed(0)
    model = Net("lstm").double()
    sequences = [torch.randn(n, 3, dtype=torch.float64) for n in (5, 9, 3, 7, 4, 6)]
    # Two columns: column 0 holds sequences 0, 2, 4 and column 1 sequences 1, 3, 5, laid end to end.
    columns = [torch.cat(sequences[0::2]), torch.cat(sequences[1::2])]
    length = max(len(c) for c in columns)
    x = torch.zeros(length, 2, 3, dtype=torch.float64)
    starts = torch.zeros(length, 2, dtype=torch.bool)
    for b, column in enumerate(columns):
        x[: len(column), b] = column
        starts[torch.cumsum(torch.tensor([0] + [len(s) for s in sequences[b::2]][:-1]), 0), b] = True
    evaluator = create_tbptt_evaluator(model, carry_hidden=True, segment_length=4)
    batches = [(x[:8], x[:8], starts[:8]), (x[8:], x[8:], starts[8:])]
    packed = []
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda e: packed.append(e.state.output[0]))
    evaluator.run(batches)
    packed = torch.cat(packed)
    with torch.no_grad():
        for b in range(2):
            alone = torch.cat([model(s[:, None])[0][:, 0] for s in sequences[b::2]])
            torch.testing.assert_close(packed[: len(alone), b], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "starts,error,match",
    [
        (torch.zeros(7, 3), TypeError, "bool tensor"),
        (torch.zeros(3, 7, dtype=torch.bool), ValueError, r"shape \(T, B\)"),
        (torch.zeros(7, dtype=torch.bool), ValueError, r"shape \(T, B\)"),
    ],
    ids=["float", "transposed", "1-d"],
)
def test_bad_starts_raise_before_anything_changes(starts, error, match):
    torch.manual_seed(0)
    model = Net().double()
    initial = copy.deepcopy(model)
    ((x, y),) = make_batches((7,))
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 3, carry_hidden=True)
    with pytest.raises(error, match=match):
        trainer.run([(x, y, starts)])
    assert trainer.state.window == 0
    assert_same_parameters(model, initial, atol=0)


@pytest.mark.parametrize("carry_hidden", [False, True])
def test_hidden_state_the_default_cannot_reset(carry_hidden):
    torch.manual_seed(0)
    model = TransposedCell().double()
    initial = copy.deepcopy(model)
    batches = with_starts(make_batches((7, 5)), density=0.0, at=(3, 9))
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 2, carry_hidden=carry_hidden)
    with pytest.raises(ValueError, match="Pass reset_hidden"):
        trainer.run(batches)
    assert_same_parameters(model, initial, atol=0)
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_starts_on_another_device_than_x_are_refused_before_anything_runs():
    from ignite_tbptt.data.batch import check_starts
    from ignite_tbptt.layout import Layout

    x = torch.zeros(4, 2, 3)
    with pytest.raises(ValueError, match=f"starts is on meta and x on {x.device}"):
        check_starts(torch.zeros(4, 2, dtype=torch.bool, device="meta"), x, Layout(0))
