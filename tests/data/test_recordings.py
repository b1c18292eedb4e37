"""pack_recordings, masked_loss, count_targets and LossPerTarget: recordings of any trailing shape, padding marked
in the targets, and exact means over the real targets in the trainer and the evaluator."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ignite_tbptt import (
    BitsPerTarget,
    LossPerTarget,
    TBPTTEvents,
    count_targets,
    create_tbptt_evaluator,
    create_tbptt_trainer,
    masked_loss,
)
from ignite_tbptt.data import pack_recordings

from ..reference import Net


def recordings(lengths, features=2, targets=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    device = torch.get_default_device()  # the --device a test runs on; drawn on the CPU, so alike everywhere
    return [
        (
            torch.randn(n, features, generator=g, dtype=torch.float64, device="cpu").to(device),
            torch.rand(n, targets, generator=g, dtype=torch.float64, device="cpu").to(device),
        )
        for n in lengths
    ]


def unpack(batches):
    """Each column's recordings, read back from ``starts``, ``x`` and the real targets of ``y``."""
    x, y, starts = (torch.cat(parts) for parts in zip(*batches))
    found = []
    for b in range(x.shape[1]):
        for t in range(x.shape[0]):
            if starts[t, b]:
                found.append(([], []))
            if not torch.isnan(y[t, b]).any():
                found[-1][0].append(x[t, b])
                found[-1][1].append(y[t, b])
            else:
                assert torch.isnan(y[t, b]).all() and (x[t, b] == 0).all()  # a whole step of padding
    return [(torch.stack(xs), torch.stack(ys)) for xs, ys in found]


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=8),
    batch_size=st.integers(1, 4),
    length=st.integers(1, 9),
    align=st.integers(1, 4),
)
def test_every_step_of_every_recording_once_in_order(lengths, batch_size, length, align):
    pieces = recordings(lengths)
    batches = list(pack_recordings(pieces, batch_size, length, align=align))
    assert sum(x.shape[0] for x, _, _ in batches) == pack_recordings(pieces, batch_size, length, align=align).steps
    for x, y, starts in batches:
        assert x.shape[1:] == (batch_size, 2) and y.shape[1:] == (batch_size, 3) and starts.shape == x.shape[:2]
    found = sorted(unpack(batches), key=lambda r: r[0][0, 0].item())
    expected = sorted(pieces, key=lambda r: r[0][0, 0].item())
    assert len(found) == len(expected)
    for (x, y), (x_ref, y_ref) in zip(found, expected):
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_target_padding_never_reads_as_a_real_target():
    x = torch.zeros(3, 1)
    (_, y, _), *_ = pack_recordings([(x, torch.tensor([1, 2, 3], dtype=torch.uint8)), (x[:1], x[:1, 0].byte())], 2, 3)
    assert y.dtype == torch.int64 and y[:, 1].tolist() == [0, -100, -100]  # uint8 cannot hold -100
    multi_hot = torch.tensor([[True, False], [False, True]])
    (_, y, _), *_ = pack_recordings([(x[:2], multi_hot), (x[:1], multi_hot[:1])], 2, 2)
    assert y.dtype == torch.float32 and torch.isnan(y[1, 1]).all() and y[:, 0].tolist() == [[1, 0], [0, 1]]
    (_, y, _), *_ = pack_recordings([(x[:2], multi_hot), (x[:1], multi_hot[:1])], 2, 2, y_pad=-1.0)
    assert y[1, 1].tolist() == [-1.0, -1.0]


@pytest.mark.parametrize(
    "pieces,options,error,match",
    [
        ([torch.zeros(3)], {}, TypeError, "recording 0 is a Tensor"),
        ([(torch.zeros(3, 2), torch.zeros(4, 1))], {}, ValueError, "recording 0 has x of shape"),
        ([(torch.zeros(3, 2), torch.zeros(3)), (torch.zeros(2, 5), torch.zeros(2))], {}, ValueError, "recording 1"),
        ([(torch.zeros(3, 2), torch.zeros(3))], {"y_pad": 0}, ValueError, "y_pad must not be a real class"),
        (iter([(torch.zeros(3, 2), torch.zeros(3))]), {"shuffle": True}, TypeError, "shuffle=True"),
    ],
    ids=["not-a-pair", "steps-differ", "shapes-differ", "real-class-padding", "shuffle-iterator"],
)
def test_bad_recordings_are_named(pieces, options, error, match):
    with pytest.raises(error, match=match):
        list(pack_recordings(pieces, 2, 3, **options))


def test_masked_loss_needs_one_loss_per_target():
    with pytest.raises(ValueError, match="one loss per target"):
        masked_loss(lambda y_pred, y, reduction: F.mse_loss(y_pred, y, reduction="mean"))(torch.zeros(2), torch.ones(2))


def brute_force_mean(model, pieces):
    """Mean squared error over every target element, each recording run alone from a zero state (full BPTT)."""
    total = sum(F.mse_loss(model(x.unsqueeze(1))[0].squeeze(1), y, reduction="sum") for x, y in pieces)
    return total / sum(y.numel() for _, y in pieces)


def test_trainer_and_evaluator_take_the_exact_mean_over_real_targets():
    # One batch holds every recording and one window covers it: the step's gradient is that of the mean over
    # the real targets, padding left out and each recording starting from a zero state.
    torch.manual_seed(0)
    model = Net(n_in=2, n_out=3).double()
    pieces = recordings([7, 3, 5, 4, 2])
    batches = pack_recordings(pieces, 2, 100)
    (x, y, _), *rest = batches
    assert not rest and torch.isnan(y).any()
    loss_fn = masked_loss(F.mse_loss)
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        loss_fn,
        x.shape[0],
        carry_hidden=True,
        target_count_fn=lambda y_pred, y: count_targets(y),
    )
    grads = []
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_STARTED, lambda e: grads.append([p.grad.clone() for p in model.parameters()])
    )
    state = trainer.run(batches)
    reference = brute_force_mean(model, pieces)
    expected = torch.autograd.grad(reference, list(model.parameters()))
    assert state.step_targets == 21 * 3 and state.output == pytest.approx(reference.item(), rel=1e-12)
    for got, want in zip(grads[0], expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

    metrics = {"nats": LossPerTarget(loss_fn), "bits": BitsPerTarget(loss_fn)}
    evaluator = create_tbptt_evaluator(model, metrics, carry_hidden=True)
    result = evaluator.run(pack_recordings(pieces, 3, 4)).metrics  # other columns and batches: the same mean
    assert result["nats"] == pytest.approx(reference.item(), rel=1e-12)
    assert result["bits"] == pytest.approx(reference.item() / math.log(2), rel=1e-12)


def test_no_recording_to_pack_is_an_error():
    with pytest.raises(ValueError, match="pack_recordings got no recording of at least one step"):
        list(pack_recordings([], batch_size=2, length=4))
