"""The backward sweep against autograd on the unrolled recurrence, and its recomputation rebuild."""

import pytest
import torch

from ignite_tbptt.layout import Layout
from ignite_tbptt.planning import Window, WindowSource, plan_close
from ignite_tbptt.runtime import (
    ModelCall,
    ParameterVersions,
    Recomputation,
    RetainedHistory,
    Segment,
    default_reset_hidden,
    rng,
)
from ignite_tbptt.runtime import hidden as hs


class Planned(WindowSource):
    """A source whose windows have the given cut, followed by a window with the given cut (or none)."""

    def __init__(self, cut, next_cut):
        self._cut, self._next_cut = cut, next_cut

    def cut(self, start, end):
        return self._cut

    def window(self, start):
        return Window(start, start + 1, self._next_cut)


def sweep(history, start, cut, next_cut):
    """The backward sweep of the window from ``start`` with ``cut``, planned as the loop plans it."""
    plan = plan_close(Planned(cut, next_cut), start, start + 1, next_cut is not None, history.starts())
    history.backward(plan)


class Linear1(torch.nn.Module):
    """``h_t = w * h_{t-1} + x_t``, ``y_pred_t = h_t``, in float64, with dropout on the input."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.9, dtype=torch.float64))
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x, hidden=None):
        h = torch.zeros((), dtype=torch.float64) if hidden is None else hidden
        outs = []
        for x_t in self.dropout(x):
            h = self.w * h + x_t
            outs.append(h)
        return torch.stack(outs), h


def setup(dropout=0.0, versions=False):
    torch.manual_seed(0)
    model = Linear1(dropout)
    params = lambda: [model.w]  # noqa: E731
    v = ParameterVersions(params) if versions else None
    call = ModelCall(
        model,
        lambda m, x, h: m(x) if h is None else m(x, h),
        lambda: torch.autocast("cpu", enabled=False),
        default_reset_hidden,
        None,
        Layout(0),
    )
    return model, call, v


def run(history, call, x, bounds, owed_from, recompute=False, keep=False):
    """Run segments ``bounds`` of ``x`` as the loop does; the loss gradients of segments past ``owed_from`` are owed."""
    hidden = None
    for a, b in bounds:
        hidden_in, inputs = (None, []) if hidden is None else hs.as_leaves(hidden, True)
        version = history.versions.current if keep else None
        recomputation = Recomputation(x[a:b], hidden_in, rng.capture(x.device), version, True)
        with torch.no_grad() if recompute else torch.enable_grad():
            y_pred, hidden = call(x[a:b], hidden_in, history.versions, keep)
        segment = Segment(a, b, [], None, recomputation=recomputation) if recompute else Segment(a, b, inputs, [hidden])
        segment.recomputation = recomputation
        if b > owed_from:  # earlier segments paid their loss in an earlier window
            segment.y_grad = [torch.arange(a, b, dtype=torch.float64) + 1.0]  # d loss / d y_pred_t = t + 1
            segment.y_pred = None if recompute else [y_pred]
        history.append(segment)


def unrolled_gradient(x, w, cut, start, end):
    """d/dw of sum_{t in [start, end)} (t + 1) * h_t, with h_cut's input a constant: autograd on the unrolled loop."""
    w = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        h = torch.zeros((), dtype=torch.float64)
        for t in range(cut):
            h = w * h + x[t]
    loss = 0.0
    for t in range(cut, end):
        h = w * h + x[t]
        if t >= start:
            loss = loss + (t + 1) * h
    (grad,) = torch.autograd.grad(loss, w)
    return grad


@pytest.mark.parametrize("recompute", [False, True])
def test_one_sweep_equals_backpropagating_every_loss_to_the_cut(recompute):
    model, call, _ = setup()
    history = RetainedHistory(call, lambda: [model.w], None, recompute)
    x = torch.randn(10, dtype=torch.float64)
    run(history, call, x, [(0, 3), (3, 6), (6, 8), (8, 10)], owed_from=6, recompute=recompute)
    sweep(history, 6, 3, None)  # window [6, 10) reaching back to step 3
    torch.testing.assert_close(model.w.grad, unrolled_gradient(x, 0.9, 3, 6, 10), rtol=1e-12, atol=0)
    assert history.segments == []


def test_segments_the_next_window_reaches_survive_and_are_swept_again():
    model, call, _ = setup()
    history = RetainedHistory(call, lambda: [model.w], None, False)
    x = torch.randn(8, dtype=torch.float64)
    run(history, call, x, [(0, 2), (2, 4)], owed_from=0)
    sweep(history, 0, 0, 2)  # window [0, 4); the next one reaches back to step 2
    assert [s.start for s in history.segments] == [2]
    first = model.w.grad.clone()
    torch.testing.assert_close(first, unrolled_gradient(x, 0.9, 0, 0, 4), rtol=1e-12, atol=0)

    # Window [4, 6) reaches back to 2: its sweep passes through the retained segment [2, 4) again.
    model.w.grad = None
    hidden = history.segments[-1].outputs[0]
    hidden_in, inputs = hs.as_leaves(hidden, True)
    y_pred, out = call(x[4:6], hidden_in)
    history.append(Segment(4, 6, inputs, [out], [y_pred], [torch.tensor([5.0, 6.0], dtype=torch.float64)]))
    sweep(history, 4, 2, None)
    torch.testing.assert_close(model.w.grad, unrolled_gradient(x, 0.9, 2, 4, 6), rtol=1e-12, atol=0)


def test_a_rebuilt_segment_runs_with_its_own_weights_and_random_state():
    model, call, versions = setup(dropout=0.5, versions=True)
    history = RetainedHistory(call, lambda: [model.w], versions, rebuilds=True)
    x = torch.randn(6, dtype=torch.float64)
    torch.manual_seed(1)
    run(history, call, x, [(0, 3), (3, 6)], owed_from=0, recompute=True, keep=True)
    masks_seed = 1
    versions.freeze()  # an optimizer step: the weights change in place
    with torch.no_grad():
        model.w.mul_(2.0)
    sweep(history, 0, 0, None)

    # The same computation by hand: dropout masks drawn in the same order, w as it was (0.9).
    torch.manual_seed(masks_seed)
    dropped = torch.cat([torch.nn.functional.dropout(x[0:3], 0.5), torch.nn.functional.dropout(x[3:6], 0.5)])
    torch.testing.assert_close(model.w.grad, unrolled_gradient(dropped, 0.9, 0, 0, 6), rtol=1e-12, atol=0)
    assert model.w.item() == pytest.approx(1.8)  # the weights are back as the optimizer left them
    assert all(s.outputs is None for s in history.segments)


def test_history_state_dict_rebuilds_the_graphs_it_saved():
    model, call, versions = setup(versions=True)
    history = RetainedHistory(call, lambda: [model.w], versions, rebuilds=False)
    x = torch.randn(6, dtype=torch.float64)
    run(history, call, x, [(0, 3), (3, 6)], owed_from=0, keep=True)
    state = history.state_dict()
    versions.freeze()
    with torch.no_grad():
        model.w.add_(1.0)  # an optimizer step after the checkpoint was written

    _, call2, versions2 = setup(versions=True)
    model2 = call2.model
    with torch.no_grad():
        model2.w.copy_(model.w)  # the checkpoint's model holds the stepped weights
    rebuilt = RetainedHistory(call2, lambda: [model2.w], versions2, rebuilds=False)
    rebuilt.load_state_dict({**state, "weights": [[torch.tensor(0.9, dtype=torch.float64)]], "current_weights": None})
    sweep(rebuilt, 0, 0, None)
    torch.testing.assert_close(model2.w.grad, unrolled_gradient(x, 0.9, 0, 0, 6), rtol=1e-12, atol=0)
    assert model2.w.item() == pytest.approx(1.9)
