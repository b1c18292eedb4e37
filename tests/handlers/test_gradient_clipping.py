import copy

import pytest
import torch

from ignite_tbptt import GradientClipping, TBPTTEvents, create_tbptt_trainer

from ..helpers import assert_same_parameters, make_batches
from ..reference import Net, cross_entropy


def hand_written(model, batches, k1, accumulation, clip, epochs):
    """A plain loop: chunks of k1, per-token sums, normalise, clip, step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    norms = []

    def step(count):
        for p in model.parameters():
            p.grad /= count
        norms.append(clip(model.parameters()))
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(epochs):
        windows = count = 0
        for x, y in batches:
            hidden = None
            for xc, yc in zip(x.split(k1), y.split(k1)):
                y_pred, hidden = model(xc) if hidden is None else model(xc, tuple(h.detach() for h in hidden))
                (cross_entropy(y_pred, yc) * yc.numel()).backward()
                windows, count = windows + 1, count + yc.numel()
                if windows == accumulation:
                    step(count)
                    windows = count = 0
        if windows:
            step(count)
    return norms


@pytest.mark.parametrize("mode", ["norm", "inf-norm", "value"])
def test_clipping_equals_clip_grad_by_hand_before_the_step(mode):
    batches = make_batches([9, 12, 8])
    torch.manual_seed(0)
    model = Net().double()
    by_hand = copy.deepcopy(model)
    if mode == "value":
        handler = GradientClipping(model, max_value=0.01)

        def clip(params):
            params = list(params)
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
            torch.nn.utils.clip_grad_value_(params, 0.01)
            return norm
    else:
        norm_type = 2.0 if mode == "norm" else float("inf")
        handler = GradientClipping(model, max_norm=0.05, norm_type=norm_type)

        def clip(params):
            return torch.nn.utils.clip_grad_norm_(params, 0.05, norm_type=norm_type)

    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5), cross_entropy, 4)
    trainer.state.max_epochs = None
    assert handler.attach(trainer) is handler
    recorded = []
    trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_COMPLETED, lambda e: recorded.append(e.state.grad_norm))
    trainer.run(batches, max_epochs=2)

    norms = hand_written(by_hand, batches, 4, 1, clip, epochs=2)
    assert_same_parameters(model, by_hand, atol=1e-12)
    torch.testing.assert_close(torch.stack(recorded), torch.stack(norms), rtol=1e-12, atol=0)
    assert max(norms) > 0.05  # clipping really happened


def test_clipping_leaves_an_overflowing_step_to_the_scaler():
    torch.manual_seed(0)
    model = Net().double()
    before = copy.deepcopy(model)
    ((x, y),) = make_batches([6])
    x[2, 0, 0] = float("inf")
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), cross_entropy, 6, scaler=True)
    GradientClipping(model, max_norm=1.0).attach(trainer)
    seen = []
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_STARTED(after=0),
        lambda e: seen.append([p.grad.isfinite().all().item() for p in model.parameters()]),
    )
    trainer.run([(x, y)])
    assert not torch.isfinite(trainer.state.grad_norm)
    assert not all(seen[0])  # the non-finite gradients were not clipped into finite ones
    assert_same_parameters(model, before, atol=0)


@pytest.mark.parametrize("kwargs", [{}, {"max_norm": 1.0, "max_value": 1.0}, {"max_norm": 0.0}, {"max_value": -1}])
def test_clipping_needs_exactly_one_positive_limit(kwargs):
    with pytest.raises(ValueError, match="max_norm|positive"):
        GradientClipping(torch.nn.Linear(1, 1), **kwargs)
