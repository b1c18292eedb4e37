import math

import pytest
import torch
from ignite.metrics import Loss

from ignite_tbptt import BitsPerTarget, Perplexity, create_tbptt_evaluator

from ..helpers import make_batches
from ..reference import Net, cross_entropy


@pytest.mark.parametrize("segment_length", [None, 5])
def test_carried_stream_evaluation_equals_one_pass_over_the_joined_stream(segment_length):
    torch.manual_seed(0)
    model = Net(dropout=0.5).double()  # eval mode must switch dropout off
    batches = make_batches([7, 12, 5])
    evaluator = create_tbptt_evaluator(
        model,
        {"bits": BitsPerTarget(cross_entropy), "ppl": Perplexity(cross_entropy)},
        carry_hidden=True,
        segment_length=segment_length,
    )
    metrics = evaluator.run(batches).metrics
    x, y = (torch.cat(parts) for parts in zip(*batches))
    with torch.no_grad():
        model.eval()
        nats = cross_entropy(model(x)[0], y).item()
    assert metrics["bits"] == pytest.approx(nats / math.log(2), rel=1e-12)
    assert metrics["ppl"] == pytest.approx(math.exp(nats), rel=1e-12)
    # A second run is a fresh stream, not the continuation of the first.
    assert evaluator.run(batches).metrics["bits"] == pytest.approx(metrics["bits"], rel=1e-12)


def test_fresh_hidden_state_per_batch_and_per_target_weighting():
    torch.manual_seed(0)
    model = Net().double().eval()
    batches = make_batches([7, 12, 5], batch=2) + make_batches([4], batch=5, seed=1)
    evaluator = create_tbptt_evaluator(model, {"bits": BitsPerTarget(cross_entropy), "ignite": Loss(cross_entropy)})
    metrics = evaluator.run(batches).metrics
    with torch.no_grad():
        nats = sum(cross_entropy(model(x)[0], y).item() * y.numel() for x, y in batches)
    assert metrics["bits"] == pytest.approx(nats / sum(y.numel() for _, y in batches) / math.log(2), rel=1e-12)
    assert metrics["ignite"] != pytest.approx(metrics["bits"] * math.log(2), rel=1e-6)  # len(y)-weighted


def test_segment_length_must_be_positive():
    with pytest.raises(ValueError, match="segment_length"):
        create_tbptt_evaluator(torch.nn.RNN(1, 1), segment_length=0)


def test_padding_counts_nothing_and_an_all_padding_batch_adds_nothing():
    torch.manual_seed(0)
    model = Net().double().eval()
    batches = make_batches([6, 5, 4])
    batches[1][1][2:] = -100  # padding at the end of the second batch
    batches[2][1][:] = -100  # a batch of padding only: its mean would be NaN

    def loss_fn(y_pred, y):
        return torch.nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten(), ignore_index=-100)

    bits = BitsPerTarget(loss_fn, batch_size=lambda y: int((y != -100).sum()))
    metrics = create_tbptt_evaluator(model, {"bits": bits}).run(batches).metrics
    with torch.no_grad():
        nats = sum(loss_fn(model(x)[0], y).item() * int((y != -100).sum()) for x, y in batches[:2])
    assert metrics["bits"] == pytest.approx(nats / (6 * 3 + 2 * 3) / math.log(2), rel=1e-12)
