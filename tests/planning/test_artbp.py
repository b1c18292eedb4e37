"""ARTBP: each draw's gradient against a brute-force graph of the whole stream, and unbiasedness over draws."""

import pytest
import torch
import torch.nn.functional as F

from ignite_tbptt import ARTBP, TBPTTEvents, create_tbptt_trainer

from ..reference import Net, zero_columns


class ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``factor`` backward: a compensated candidate point, by hand."""

    @staticmethod
    def forward(ctx, h, factor):
        ctx.factor = factor
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def brute_force(model, x, y, windows, factors, starts=None):
    """Gradient of the stream's summed loss in one graph: detached at each truncation, scaled at each factor, and
    each column's state zeroed where ``starts`` (``(T, B)``) begins a new sequence in it."""
    resets = {} if starts is None else {t: row for t, row in enumerate(starts) if t and row.any()}
    points = sorted({*(end for _, end in windows), *factors, *resets})
    hidden, total, start = None, 0.0, 0
    for point in points:
        if start in resets:
            hidden = zero_columns(hidden, resets[start])
        y_pred, hidden = model(x[start:point], hidden)
        total = total + F.cross_entropy(y_pred.flatten(0, 1), y[start:point].flatten(), reduction="sum")
        if point in factors:
            hidden = tuple(ScaleGrad.apply(h, factors[point]) for h in hidden)
        elif point not in resets or any(end == point for _, end in windows):  # a truncation: a window ends here
            hidden = tuple(h.detach() for h in hidden)
        start = point
    return torch.autograd.grad(total, list(model.parameters()))


def trained_gradient(model, source, batches, **options):
    """The sum over the run's optimizer steps of gradient x targets (lr 0: the parameters never move)."""
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        lambda y_pred, y: F.cross_entropy(y_pred.flatten(0, 1), y.flatten()),
        source,
        carry_hidden=True,
        **options,
    )
    total = [torch.zeros_like(p) for p in model.parameters()]
    windows, factors = [], {}

    @trainer.on(TBPTTEvents.OPTIMIZER_STEP_STARTED)
    def add(engine):
        for t, p in zip(total, model.parameters()):
            t += p.grad * engine.state.step_targets

    @trainer.on(TBPTTEvents.WINDOW_COMPLETED)
    def record(engine):
        start, end, cut = engine.state.window_bounds
        assert cut == start or not isinstance(source, ARTBP)  # an ARTBP window reaches back to its own start
        windows.append((start, end))
        factors.update(getattr(engine.state, "compensation", {}))

    trainer.run(batches)
    return total, windows, factors


def stream(length=60, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    device = torch.get_default_device()  # the --device a test runs on; drawn on the CPU, so alike everywhere
    x = torch.randn(length, batch, 3, generator=g, dtype=torch.float64, device="cpu").to(device)
    y = torch.randint(0, 4, (length, batch), generator=g, device="cpu").to(device)
    return x, y


@pytest.mark.parametrize(
    "source,options",
    [
        (lambda: ARTBP(grid=1, c=0.2, seed=1), {}),
        (lambda: ARTBP(grid=4, mean_length=12, seed=2), {}),
        (lambda: ARTBP(grid=3, c=lambda steps: min(1.0, steps / 20), seed=3), {"gradient_accumulation_steps": 2}),
        (lambda: ARTBP(grid=5, mean_length=15, max_length=20, seed=4), {"recompute": 3}),
    ],
    ids=["per-step", "grid-mean-length", "growing-c-accumulation", "max-length-recompute"],
)
def test_each_draw_gives_the_gradient_of_its_truncations_and_factors(source, options):
    torch.manual_seed(0)
    model = Net().double()
    x, y = stream()
    batches = [(x[i : i + 20], y[i : i + 20]) for i in range(0, 60, 20)]  # the stream in three batches
    got, windows, factors = trained_gradient(model, source(), batches, **options)
    assert windows[0][0] == 0 and windows[-1][1] == 60 and len(windows) > 2
    assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))
    assert factors and all(f > 1 for f in factors.values())
    for g, want in zip(got, brute_force(model, x, y, windows, factors)):
        torch.testing.assert_close(g, want, rtol=1e-9, atol=1e-9)


def test_sequence_starts_cut_the_gradient_of_their_column_and_nothing_is_compensated_across_them():
    torch.manual_seed(0)
    model = Net().double()
    x, y = stream()
    starts = torch.rand(60, 3, generator=torch.Generator().manual_seed(5), device="cpu").to(x.device) < 0.08
    starts[0] = True
    batches = [(x[i : i + 20], y[i : i + 20], starts[i : i + 20]) for i in range(0, 60, 20)]
    got, windows, factors = trained_gradient(model, ARTBP(grid=3, mean_length=9, seed=6), batches)
    assert any(row.any() for row in starts[1:])
    for g, want in zip(got, brute_force(model, x, y, windows, factors, starts)):
        torch.testing.assert_close(g, want, rtol=1e-9, atol=1e-9)


def full_bptt(model, x, y):
    y_pred, _ = model(x)
    total = F.cross_entropy(y_pred.flatten(0, 1), y.flatten(), reduction="sum")
    return torch.cat([g.flatten() for g in torch.autograd.grad(total, list(model.parameters()))])


@pytest.mark.slow
def test_the_mean_over_draws_is_the_full_bptt_gradient_and_fixed_windows_are_not():
    torch.manual_seed(0)
    model = Net(cell="rnn", n_hidden=4).double()
    with torch.no_grad():
        model.rnn.weight_hh_l0.mul_(3.0)  # long memory, so that truncation at 4 steps throws gradient away
    x, y = stream(length=24, batch=2)
    full = full_bptt(model, x, y)
    draws = []
    for seed in range(300):
        total, _, _ = trained_gradient(model, ARTBP(grid=2, mean_length=4, seed=seed), [(x, y)])
        draws.append(torch.cat([t.flatten() for t in total]))
    draws = torch.stack(draws)
    mean, error = draws.mean(0), draws.std(0) / len(draws) ** 0.5
    # Within 4 standard errors in every coordinate (about 1 in 16,000 per coordinate by chance).
    assert ((mean - full).abs() <= 4 * error + 1e-9).all()
    fixed, _, _ = trained_gradient(model, 4, [(x, y)])
    fixed = torch.cat([t.flatten() for t in fixed])
    assert ((fixed - full).abs() > 4 * error).any()  # truncated BPTT at the same mean length is biased


def test_resuming_mid_stream_draws_what_the_uninterrupted_run_drew(tmp_path):
    from ..helpers import assert_resume_is_bit_identical

    x, y = stream(length=44)
    batches = [(x[i : i + 11].float(), y[i : i + 11]) for i in range(0, 44, 11)]

    def build():
        torch.manual_seed(0)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        source = ARTBP(grid=2, mean_length=6, seed=7)
        loss_fn = lambda y_pred, y: F.cross_entropy(y_pred.flatten(0, 1), y.flatten())  # noqa: E731
        trainer = create_tbptt_trainer(model, optimizer, loss_fn, source, carry_hidden=True, deterministic=True)
        return model, optimizer, trainer

    assert_resume_is_bit_identical(tmp_path, build, batches, stop_at=6, epochs=3)


def test_gradient_reach_records_each_windows_profile_through_the_factors():
    from ignite_tbptt import GradientReach

    torch.manual_seed(0)
    model = Net().double()
    x, y = stream()
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        lambda y_pred, y: F.cross_entropy(y_pred.flatten(0, 1), y.flatten()),
        ARTBP(grid=3, mean_length=12, seed=8),
        carry_hidden=True,
    )
    GradientReach(every=1).attach(trainer)
    profiles = []
    trainer.add_event_handler(
        TBPTTEvents.WINDOW_COMPLETED,
        lambda e: profiles.append((e.state.window_bounds, dict(e.state.compensation), e.state.gradient_reach)),
    )
    trainer.run([(x, y)])
    for (start, end, _), factors, reach in profiles:
        # A point at every compensated candidate point and at the window's start (none at the stream's, which
        # has no hidden state to reach), lags counted from the window's end.
        assert sorted(reach) == sorted(end - p for p in [start, *factors] if p > 0)
    assert len(profiles) > 3 and any(factors for _, factors, _ in profiles)
