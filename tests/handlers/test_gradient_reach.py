"""GradientReach against autograd's gradient on a fresh graph from the stream's start, with the weights held still."""

import pytest
import torch

from ignite_tbptt import GradientReach, TBPTTEvents, create_tbptt_trainer

from ..helpers import compare_with_reference, make_batches
from ..reference import Net, cross_entropy


def recorded(model, k1, k2, batches, every=1, stride=None, **options):
    trainer = create_tbptt_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.0), cross_entropy, k1, k2, carry_hidden=True, **options
    )
    GradientReach(every=every, stride=stride).attach(trainer)
    windows = []
    trainer.add_event_handler(
        TBPTTEvents.WINDOW_COMPLETED,
        lambda e: windows.append((e.state.window_bounds, e.state.gradient_reach, e.state.window_targets)),
    )
    trainer.run(batches)
    return windows


def brute_force_reach(model, batches, start, end, targets, lags):
    """Norms of d(mean loss of steps [start, end)) / d(hidden state entering step end - lag), on one graph from
    the stream's start built one step at a time."""
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    hidden, entering, loss = None, {}, 0.0
    for t in range(end):
        entering[t] = hidden
        y_pred, hidden = model(x[t : t + 1]) if hidden is None else model(x[t : t + 1], hidden)
        if t >= start:
            loss = loss + cross_entropy(y_pred, y[t : t + 1]) * y[t : t + 1].numel()
    norms = {}
    for lag in lags:
        tensors = entering[end - lag] if isinstance(entering[end - lag], tuple) else (entering[end - lag],)
        grads = torch.autograd.grad(loss / targets, tensors, retain_graph=True)
        norms[lag] = torch.sqrt(sum(g.pow(2).sum() for g in grads)).item()
    return norms


@pytest.mark.parametrize("k1,k2", [(4, 4), (3, 7), (2, 5), (6, 3)], ids=["k1=k2", "k2>k1", "k2>>k1", "k2<k1"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("stride", [None, 2])
def test_reach_equals_autograd_on_the_whole_stream(k1, k2, cell, stride):
    torch.manual_seed(0)
    model = Net(cell).double()
    batches = make_batches((7, 9, 6))
    windows = recorded(model, k1, k2, batches, stride=stride)
    assert len(windows) == -(-22 // k1)
    for (start, end, cut), reach, targets in windows:
        lags = sorted(reach)
        if cut > 0:  # the cut is always a point of the profile, except at the stream's start
            assert max(lags) == end - cut
        assert all(end - lag >= cut for lag in lags)
        if stride is not None:  # a point every `stride` steps from the window's start, after the cut
            assert {end - t for t in range(start, end, stride) if t > cut} <= set(lags)
        expected = brute_force_reach(model, batches, start, end, targets, lags)
        assert reach == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("k1,k2,stride", [(3, 7, None), (4, 4, 2), (6, 3, None)])
def test_reach_in_recomputation_mode_equals_autograd_on_the_whole_stream(k1, k2, stride):
    # The sweep rebuilds the segments' graphs; the reach comes from the rebuilt ones.
    torch.manual_seed(0)
    model = Net().double()
    batches = make_batches((7, 9, 6))
    windows = recorded(model, k1, k2, batches, stride=stride, recompute=2)
    assert any(len(reach) > 1 for _, reach, _ in windows)
    for (start, end, _), reach, targets in windows:
        assert reach == pytest.approx(brute_force_reach(model, batches, start, end, targets, sorted(reach)), rel=1e-6)


def test_windows_that_are_not_recorded_cost_nothing_and_say_none():
    torch.manual_seed(0)
    model = Net().double()
    windows = recorded(model, 3, 5, make_batches((12,)), every=2)
    assert [reach is None for _, reach, _ in windows] == [True, False, True, False]


def test_a_scaler_does_not_change_the_reach():
    torch.manual_seed(0)
    model = Net().double()
    plain = recorded(model, 3, 5, make_batches((12,)))
    scaled = recorded(model, 3, 5, make_batches((12,)), scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    for (_, a, _), (_, b, _) in zip(plain, scaled):
        assert a == pytest.approx(b, rel=1e-12)


def test_attach_needs_a_tbptt_trainer():
    from ignite.engine import Engine

    with pytest.raises(TypeError, match="TBPTT trainer"):
        GradientReach().attach(Engine(lambda e, b: None))
    with pytest.raises(ValueError, match="every"):
        GradientReach(every=0)
    with pytest.raises(ValueError, match="stride"):
        GradientReach(stride=0)


@pytest.mark.parametrize("k1,k2", [(4, 4), (3, 7), (6, 3)])
def test_recording_with_a_stride_trains_as_the_reference(k1, k2):
    # More and shorter model calls in the recorded windows: the same gradients, summed in another order.
    compare_with_reference(k1, k2, carry_hidden=True, handlers=[GradientReach(every=2, stride=2)])


@pytest.mark.parametrize("k1,k2", [(4, 4), (3, 7), (6, 3)])
def test_recording_does_not_change_training(k1, k2):
    final = []
    for record in (False, True):
        torch.manual_seed(0)
        model = Net().double()
        trainer = create_tbptt_trainer(
            model, torch.optim.SGD(model.parameters(), lr=0.5), cross_entropy, k1, k2, carry_hidden=True
        )
        if record:
            GradientReach().attach(trainer)
        trainer.run(make_batches((7, 9, 6)), max_epochs=2)
        final.append([p.detach().clone() for p in model.parameters()])
    for p, q in zip(*final):
        assert torch.equal(p, q)
