"""Helpers shared by the tests: data, optimizers, comparisons and a model that records its calls."""

import copy
import itertools

import torch

from ignite_tbptt import TBPTTEvents, WindowSource, create_tbptt_trainer

from .reference import Net, cross_entropy, reference_train


def make_batches(lengths, batch=3, n_in=3, n_out=4, time_dim=0, seed=0):
    """Batches of ``(x, y)`` in float64 with the given lengths along ``time_dim``."""
    g = torch.Generator().manual_seed(seed)
    device = torch.get_default_device()  # the --device a test runs on; drawn on the CPU, so alike everywhere
    batches = []
    for length in lengths:
        x = torch.randn(length, batch, n_in, generator=g, dtype=torch.float64, device="cpu").to(device)
        y = torch.randint(0, n_out, (length, batch), generator=g, device="cpu").to(device)
        if time_dim == 1:
            x, y = x.transpose(0, 1).contiguous(), y.t().contiguous()
        batches.append((x, y))
    return batches


def regression_batches(count, length, columns=3, seed=0, start_rate=0.0, padding=None):
    """Batches ``(x, y)`` in float64, ``(T, B, 3)`` and ``(T, B, 4)``, for a regression by ``reference.Net``.

    ``padding``: the steps (a slice) at which column 0's targets are NaN; ``start_rate``: where above 0, each batch
    also has ``starts``, each step of each column starting a sequence with that probability.
    """
    g = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(count):
        x = torch.randn(length, columns, 3, generator=g, dtype=torch.float64)
        y = torch.randn(length, columns, 4, generator=g, dtype=torch.float64)
        if padding is not None:
            y[padding, 0] = float("nan")
        batch = (x, y)
        if start_rate:
            batch += (torch.rand(length, columns, generator=g) < start_rate,)
        data.append(batch)
    return data


def sgd(model, lr=0.5):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)


def assert_same_parameters(a, b, atol=1e-9):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


def assert_trained(model, initial):
    moved = max((p - q).abs().max().item() for p, q in zip(model.parameters(), initial.parameters()))
    assert moved > 1e-2, "training did not change the parameters, so the comparison proves nothing"


class NoLength:
    """Re-iterable data without ``__len__``: the first epoch's length is unknown until it ends."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


class RecordingNet(Net):
    """A :class:`Net` that records each call: its length and whether it started from a fresh hidden state."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def forward(self, x, hidden=None):
        self.calls.append((x.shape[0], hidden is None))
        return super().forward(x, hidden)

    @property
    def fresh_calls(self):
        """Stream positions (counted over all calls) of the calls that started from a fresh hidden state."""
        starts = itertools.accumulate([0] + [n for n, _ in self.calls])
        return [position for position, (_, fresh) in zip(starts, self.calls) if fresh]


def compare_with_reference(
    k1,
    k2,
    *,
    carry_hidden,
    accumulation=1,
    cell="lstm",
    time_dim=0,
    lengths=(7, 12, 5),
    epochs=2,
    net=Net,
    data=None,
    starts=None,
    handlers=(),
    **options,
):
    """Train ``net`` with the trainer and with the brute-force reference on the same batches; same parameters.

    ``starts(batches)`` adds sequence starts to the batches; ``data(batches)`` wraps what the trainer runs on.
    A ``reset_hidden`` option goes to both. ``k1`` may be a window source (``k2`` then None), and
    ``handlers`` are attached to the trainer (``AdaptiveTruncation``): then the reference runs the windows the
    trainer recorded, returned as ``trainer.recorded_windows``.
    """
    torch.manual_seed(0)
    model = net(cell, batch_first=time_dim == 1).double()
    initial, ref = copy.deepcopy(model), copy.deepcopy(model)
    batches = make_batches(lengths, time_dim=time_dim)
    batches = batches if starts is None else starts(batches)
    trainer = create_tbptt_trainer(
        model,
        sgd(model),
        cross_entropy,
        k1,
        k2,
        time_dim=time_dim,
        carry_hidden=carry_hidden,
        gradient_accumulation_steps=accumulation,
        **options,
    )
    for handler in handlers:
        handler.attach(trainer)
    trainer.recorded_windows = []
    trainer.add_event_handler(
        TBPTTEvents.WINDOW_COMPLETED, lambda e: trainer.recorded_windows.append(e.state.window_bounds)
    )
    trainer.run(batches if data is None else data(batches), max_epochs=epochs)
    reset = {"reset_hidden": options["reset_hidden"]} if "reset_hidden" in options else {}
    if isinstance(k1, WindowSource) or handlers:
        reset["windows"] = trainer.recorded_windows
        k1, k2 = (k1.k1, k1.k2) if isinstance(k1, WindowSource) else (k1, k2)
    reference_train(
        ref,
        sgd(ref),
        cross_entropy,
        batches,
        k1,
        k2,
        carry_hidden=carry_hidden,
        accumulation=accumulation,
        epochs=epochs,
        time_dim=time_dim,
        **reset,
    )
    assert_trained(ref, initial)
    assert_same_parameters(model, ref)
    return trainer


def assert_resume_is_bit_identical(tmp_path, build, batches, stop_at=6, epochs=3, edit=None, stopped=None):
    """Stop a run at ``stop_at`` through ignite's ``Checkpoint``, resume it in a new trainer: the same parameters.

    ``build()`` returns ``(model, optimizer, trainer)``, seeded the same way each time. ``stopped(trainer)``
    runs on the interrupted trainer, ``edit(checkpoint)`` on the checkpoint before it loads. The resumed
    model's parameters are zeroed before loading, so that whatever it trains from comes from the checkpoint.

    Returns:
        The resumed trainer.
    """
    from ignite.engine import Events
    from ignite.handlers import Checkpoint, DiskSaver

    model, _, trainer = build()
    trainer.run(batches, max_epochs=epochs)
    uninterrupted = [p.detach().clone() for p in model.parameters()]

    model, optimizer, trainer = build()
    to_save = {"trainer": trainer, "model": model, "optimizer": optimizer}
    saver = Checkpoint(to_save, DiskSaver(tmp_path, require_empty=False), n_saved=None)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=stop_at), saver)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=stop_at), lambda e: e.terminate())
    trainer.run(batches, max_epochs=epochs)
    if stopped is not None:
        stopped(trainer)

    # A new process, set up as ignite's DeterministicEngine expects: built and seeded alike, then loaded.
    model, optimizer, trainer = build()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    (path,) = tmp_path.glob("checkpoint_*.pt")
    checkpoint = torch.load(path, weights_only=True)  # plain tensors and numbers: nothing in it can run code
    if edit is not None:
        edit(checkpoint)
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, checkpoint)
    trainer.run(batches, max_epochs=epochs)
    for p, q in zip(model.parameters(), uninterrupted):
        assert torch.equal(p, q)
    return trainer
