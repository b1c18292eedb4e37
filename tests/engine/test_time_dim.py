"""Any axis of a batch may be time: the trainer and the evaluator agree exactly with the same data, time first."""

import copy

import pytest
import torch
from torch import nn

from ignite_tbptt import create_tbptt_evaluator, create_tbptt_trainer

from ..helpers import assert_trained, make_batches, sgd
from ..reference import Net

# time_dim -> (the permutation of x's (T, B, C) axes, the shape y's (T, B) takes): time lands at time_dim.
LAYOUTS = {
    0: ((0, 1, 2), "tb"),
    1: ((1, 0, 2), "bt"),
    2: ((1, 2, 0), "b1t"),  # (B, C, T), conv features; y (B, 1, T) has an axis 2 too
    -1: ((1, 2, 0), "bt"),  # (B, C, T) with y (B, T): the last axis of each
    -2: ((1, 0, 2), "bt1"),  # (B, T, C) with y (B, T, 1)
    -3: ((0, 1, 2), "tb1"),  # (T, B, C) with y (T, B, 1)
}


def lay_out(x, y, starts, time_dim):
    """``x (T, B, C)``, ``y (T, B)``, ``starts (T, B)`` laid out with time at ``time_dim``."""
    order, y_shape = LAYOUTS[time_dim]
    y = {"tb": y, "bt": y.t(), "b1t": y.t()[:, None], "bt1": y.t()[..., None], "tb1": y[..., None]}[y_shape]
    starts = starts if order[0] == 0 else starts.t()
    return x.permute(order).contiguous(), y.contiguous(), starts.contiguous()


class AnyLayout(nn.Module):
    """``Net`` on ``x`` with time at ``time_dim``; predictions with time at the same axis (``(B, V, T)`` for 2)."""

    def __init__(self, net, time_dim):
        super().__init__()
        self.net, self.order = net, LAYOUTS[time_dim][0]

    def forward(self, x, hidden=None):
        y_pred, hidden = self.net(x.permute(*torch.argsort(torch.tensor(self.order)).tolist()), hidden)
        return y_pred.permute(self.order), hidden


def loss_for(time_dim):
    order = LAYOUTS[time_dim][0]
    back = torch.argsort(torch.tensor(order)).tolist()

    def loss(y_pred, y):  # back to (T, B, V) and (T, B): the same mean as time first
        y = y.reshape(y.shape[0], -1) if order[0] == 0 else y.reshape(y.shape[0], -1).t()
        return nn.functional.cross_entropy(y_pred.permute(back).reshape(-1, 4), y.reshape(-1))

    return loss


def train(time_dim, k1, k2):
    torch.manual_seed(0)
    model = AnyLayout(Net("lstm").double(), time_dim)
    g = torch.Generator().manual_seed(3)
    batches = []
    for x, y in make_batches((7, 12, 5)):
        starts = (torch.rand(x.shape[0], x.shape[1], generator=g, device="cpu") < 0.15).to(x.device)
        batches.append(lay_out(x, y, starts, time_dim))
    trainer = create_tbptt_trainer(
        model,
        sgd(model),
        loss_for(time_dim),
        k1,
        k2,
        time_dim=time_dim,
        carry_hidden=True,
        gradient_accumulation_steps=2,
    )
    trainer.run(batches, max_epochs=2)
    return model, batches


@pytest.mark.parametrize("time_dim", [1, 2, -1, -2, -3])
@pytest.mark.parametrize("k1,k2", [(3, 7), (4, 2)])
def test_any_time_dim_trains_as_time_first(time_dim, k1, k2):
    first, _ = train(0, k1, k2)
    model, batches = train(time_dim, k1, k2)
    torch.manual_seed(0)
    assert_trained(first.net, Net("lstm").double())
    for p, q in zip(model.parameters(), first.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


@pytest.mark.parametrize("time_dim", [2, -1])
def test_the_evaluator_takes_any_time_dim(time_dim):
    torch.manual_seed(0)
    net = Net("lstm").double()
    x, y = make_batches((9,))[0]
    starts = torch.zeros(9, 3, dtype=torch.bool)
    starts[4, 1] = True
    seen = {}
    for dim in (0, time_dim):
        evaluator = create_tbptt_evaluator(
            AnyLayout(copy.deepcopy(net), dim),
            time_dim=dim,
            segment_length=2,
            output_transform=lambda x, y, y_pred, dim=dim: seen.setdefault(dim, y_pred),
        )
        evaluator.run([lay_out(x, y, starts, dim)])
    # (T, B, V) against (B, V, T): the same predictions, every segment and the reset in place.
    torch.testing.assert_close(seen[time_dim].permute(2, 0, 1), seen[0], rtol=0, atol=0)


def test_time_dim_out_of_range_names_it():
    model = Net("lstm").double()
    trainer = create_tbptt_trainer(model, sgd(model), loss_for(0), 3, time_dim=3)
    x, y = make_batches((5,))[0]
    with pytest.raises(ValueError, match="time_dim=3 is out of range for x of shape"):
        trainer.run([(x, y)])


def test_a_batch_without_a_batch_axis_is_refused_where_columns_are_needed():
    class Scalar(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(()))

        def forward(self, x, hidden):
            return x * self.weight + hidden.sum(), hidden

    model = Scalar()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = create_tbptt_trainer(
        model, optimizer, nn.functional.mse_loss, k1=2, initial_state=lambda columns: torch.zeros(columns)
    )
    x = torch.randn(6)
    with pytest.raises(ValueError, match=r"an input of shape \(2,\) has a time axis only.*x.unsqueeze\(1\)"):
        trainer.run([(x, x)])
    assert torch.equal(model.weight, torch.ones(()))
