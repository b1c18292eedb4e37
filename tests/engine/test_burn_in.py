"""Burn-in (SPEC.md, "Burn-in") against a brute-force TBPTT that applies it step by step, in float64.

The reference is ``tests/reference.py``'s, which shares no code with the package: it runs the stream one step at a
time, counts each column's steps since its fresh start in a Python loop, leaves the burn-in steps' targets out of
each step's loss and count, and, without gradient, detaches a column's state where its burn-in ends inside every
rebuilt computation.
"""

import pytest
import torch

from ignite_tbptt import create_tbptt_trainer, masked_loss
from ignite_tbptt.engine.burn_in import BurnIn

from ..helpers import regression_batches
from ..reference import Net, reference_train

masked_mse = masked_loss(torch.nn.functional.mse_loss)


def batches(count=3, length=11, columns=3, seed=0, starts=True, padding=True):
    padded = slice(8, None) if padding else None
    return regression_batches(count, length, columns, seed, start_rate=0.12 if starts else 0.0, padding=padded)


def trained(data, k1, k2, m, gradient, carry_hidden, accumulation=1, use_reference=False, recompute=None):
    torch.manual_seed(0)
    model = Net().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    if use_reference:
        reference_train(
            model,
            optimizer,
            masked_mse,
            data,
            k1,
            k2,
            carry_hidden=carry_hidden,
            accumulation=accumulation,
            epochs=2,
            burn_in=m,
            burn_in_gradient=gradient,
        )
        return model
    trainer = create_tbptt_trainer(
        model,
        optimizer,
        masked_mse,
        k1,
        k2,
        carry_hidden=carry_hidden,
        gradient_accumulation_steps=accumulation,
        burn_in=m,
        burn_in_gradient=gradient,
        recompute=recompute,
    )
    trainer.run(data, max_epochs=2)
    return model


CASES = {
    "k1 = k2": (5, 5, 3, True, 1),
    "k2 > k1, a multiple": (3, 6, 2, True, 1),
    "k2 > k1, not a multiple": (3, 7, 4, True, 2),
    "per token": (1, 8, 3, True, 1),
    "k2 < k1": (6, 2, 3, True, 1),
    "a burn-in across batches": (4, 8, 14, True, 1),
}


@pytest.mark.parametrize("gradient", [True, False], ids=["with gradient", "without gradient"])
@pytest.mark.parametrize("carry_hidden", [True, False], ids=["carried", "a stream a batch"])
@pytest.mark.parametrize("case", list(CASES))
def test_burn_in_trains_what_brute_force_tbptt_with_burn_in_trains(case, carry_hidden, gradient):
    k1, k2, m, _, accumulation = CASES[case]
    data = batches()
    ours = trained(data, k1, k2, m, gradient, carry_hidden, accumulation)
    expected = trained(data, k1, k2, m, gradient, carry_hidden, accumulation, use_reference=True)
    for p, q in zip(ours.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gradient", [True, False], ids=["with gradient", "without gradient"])
@pytest.mark.parametrize("case", ["k2 > k1, not a multiple", "per token", "a burn-in across batches"])
def test_recomputation_trains_the_burn_in_as_retained_segments_do(case, gradient):
    # Segments of at most 2 steps recomputed in the sweep: the recomputed graph stops where the retained one does.
    k1, k2, m, _, accumulation = CASES[case]
    data = batches()
    retained = trained(data, k1, k2, m, gradient, True, accumulation)
    recomputed = trained(data, k1, k2, m, gradient, True, accumulation, recompute=2)
    for p, q in zip(recomputed.parameters(), retained.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


def test_the_two_variants_differ_where_a_later_loss_reaches_into_the_burn_in():
    # TBPTT(3, 7): each window reaches 4 steps before its start, into the burn-in of 4 after every fresh start.
    data = batches(starts=False, padding=False)
    with_gradient, without = (trained(data, 3, 7, 4, gradient, carry_hidden=False) for gradient in (True, False))
    assert not all(torch.equal(p, q) for p, q in zip(with_gradient.parameters(), without.parameters()))


class CallLog(Net):
    """Net, noting each call's steps and whether it builds a graph."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, x, hidden=None):
        self.calls.append((x.shape[0], torch.is_grad_enabled()))
        return super().forward(x, hidden)


@pytest.mark.parametrize(
    ("gradient", "calls"),
    [
        (False, [(4, False), (2, True), (5, True)]),  # the gradient stops at step 4: what comes before needs no graph
        (True, [(6, True), (5, True)]),  # a later loss reaches the burn-in: one call, with its graph
    ],
    ids=["without gradient", "with gradient"],
)
def test_a_burn_in_without_gradient_runs_without_a_graph_where_every_column_is_inside_it(gradient, calls):
    # Windows of 6 from a fresh state, a burn-in of 4: every column's burn-in spans the steps [0, 4) of each batch.
    torch.manual_seed(0)
    model = CallLog().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = create_tbptt_trainer(model, optimizer, masked_mse, 6, burn_in=4, burn_in_gradient=gradient)
    trainer.run(batches(count=2, starts=False, padding=False), max_epochs=1)
    # The stream's first call builds its graph: the check that the model reads the state it is given needs one.
    first = [(4, True), (2, True), (5, True)] if not gradient else calls
    assert model.calls == first + calls


class MixingNet(Net):
    """Net whose every step also reads the batch mean of the previous hidden state: its columns interact."""

    def __init__(self):
        super().__init__()
        self.mix = torch.nn.Linear(5, 3)

    def forward(self, x, hidden=None):
        outs = []
        for t in range(x.shape[0]):
            h = hidden[0][-1] if hidden is not None else torch.zeros(x.shape[1], 5, dtype=x.dtype)
            o, hidden = self.rnn(torch.tanh(self.inp(x[t : t + 1])) + self.mix(h.mean(0, keepdim=True)), hidden)
            outs.append(o)
        return self.head(torch.cat(outs)), hidden


def test_a_burn_in_without_gradient_ending_apart_in_columns_that_interact_trains_what_brute_force_trains():
    # Columns 1 and 2 start sequences at steps 2 and 7: their burn-ins end after column 0's, whose later losses reach
    # them through the batch mean. No segment may run without a graph where some column's gradient goes on.
    data = []
    for x, y, _ in batches(starts=True, padding=False):
        starts = torch.zeros(11, 3, dtype=torch.bool)
        starts[2, 1] = starts[7, 2] = True
        data.append((x, y, starts))

    def trained(use_reference):
        torch.manual_seed(0)
        model = MixingNet().double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        options = {"burn_in": 4, "burn_in_gradient": False}
        if use_reference:
            reference_train(model, optimizer, masked_mse, data, 11, 11, carry_hidden=False, **options)
        else:
            create_tbptt_trainer(model, optimizer, masked_mse, 11, 11, **options).run(data, max_epochs=1)
        return model

    for p, q in zip(trained(False).parameters(), trained(True).parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


def test_a_count_of_burn_in_targets_is_named_where_the_burn_in_runs_without_a_graph():
    model = Net().double()
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        masked_mse,
        6,
        burn_in=4,
        burn_in_gradient=False,
        target_count_fn=lambda y_pred, y: y.shape[0] * y.shape[1],  # counts the padding too
    )
    with pytest.raises(ValueError, match=r"target_count_fn counted 12 targets in a segment whose targets are all"):
        trainer.run(batches(count=2, starts=False, padding=False), max_epochs=1)


def test_the_burn_in_count_is_carried_across_batches_and_reset_where_a_sequence_starts():
    burn_in = BurnIn(3, gradient=False)
    first, stops = burn_in.batch(2, 2, {}, "cpu")  # a stream's first two steps
    assert first.tolist() == [[True, True], [True, True]] and stops == {}
    second, stops = burn_in.batch(3, 2, {1: torch.tensor([False, True])}, "cpu")
    assert second.tolist() == [[True, True], [False, True], [False, True]]
    assert list(stops) == [1] and stops[1].tolist() == [True, False]  # column 0's burn-in ends at step 1
    assert burn_in.since.tolist() == [5, 2]


def test_bad_burn_in_options_are_refused_with_the_fix():
    model = Net().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"burn_in must be 0 \(no burn-in\) or more steps, got -1"):
        create_tbptt_trainer(model, optimizer, masked_mse, 5, burn_in=-1)
    with pytest.raises(TypeError, match=r"burn_in must be an int"):
        create_tbptt_trainer(model, optimizer, masked_mse, 5, burn_in=2.5)
    with pytest.raises(ValueError, match=r"burn_in_gradient=False .* leave cuda_graphs out"):
        create_tbptt_trainer(model, optimizer, masked_mse, 5, burn_in=3, burn_in_gradient=False, cuda_graphs="recorded")


def test_window_programs_train_the_burn_in_as_eager_windows_do():
    # The burn-in is in the targets a program is given: k1 = k2, one window a step, windows replayed.
    data = batches(length=12)

    def run(**options):
        torch.manual_seed(0)
        model = Net().double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5, fused=True)
        trainer = create_tbptt_trainer(model, optimizer, masked_mse, 4, carry_hidden=True, burn_in=3, **options)
        return model, trainer.run(data, max_epochs=2)

    eager, _ = run()
    programs, state = run(cuda_graphs="recorded")  # replayed on the CPU under a capture's rules
    assert state.programs.kinds["window"]["replays"] > 0
    # With sequence starts in the batches, programs and eager windows agree to rounding (as without a burn-in).
    for p, q in zip(eager.parameters(), programs.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-14)
