"""TBPTTModule: Lightning's Trainer trains what create_tbptt_trainer trains, bit for bit, on the same data.

Each test trains the same float64 model twice, with ignite's trainer and with a TBPTTModule on Lightning's Trainer,
and compares the parameters with ``torch.equal``: the same stream loop runs in both. One test compares with the
brute-force TBPTT of ``tests/reference.py``, which shares no code with the package.
"""

import pytest
import torch

pytest.importorskip("lightning")

from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.nn.functional import mse_loss  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from ignite_tbptt import RandomWindows, TBPTTEvents, count_targets, create_tbptt_trainer  # noqa: E402
from ignite_tbptt.lightning import TBPTTModule  # noqa: E402

from ..helpers import regression_batches  # noqa: E402
from ..reference import Net, reference_train  # noqa: E402


class SGDModule(TBPTTModule):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def batches(count=4, length=20, columns=3, seed=0, starts=False, padding=False):
    padded = slice(3, 9) if padding else None
    return regression_batches(count, length, columns, seed, start_rate=0.08 if starts else 0.0, padding=padded)


def masked_mse(y_pred, y):
    keep = ~torch.isnan(y)
    return mse_loss(y_pred[keep], y[keep])


def lightning_trainer(epochs=2, **kwargs):
    options = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "devices": 1}
    return Trainer(max_epochs=epochs, accelerator="cpu", enable_model_summary=False, **{**options, **kwargs})


def trained_by_ignite(data, k1, k2, epochs=2, loss=mse_loss, handlers=(), **options):
    torch.manual_seed(1)
    model = Net().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = create_tbptt_trainer(model, optimizer, loss, k1, k2, **options)
    for attach in handlers:
        attach(trainer, model, optimizer)
    trainer.run(data, max_epochs=epochs)
    return model, trainer


def trained_by_lightning(data, k1, k2, epochs=2, loss=mse_loss, module=SGDModule, **options):
    torch.manual_seed(1)
    model = Net().double()
    lit = module(model, loss, k1, k2, **options)
    trainer = lightning_trainer(epochs)
    trainer.fit(lit, train_dataloaders=DataLoader(data, batch_size=None))
    return model, trainer


def assert_equal_parameters(a, b):
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


CASES = {
    "k1 = k2": (5, 5, {}),
    "k2 > k1, a multiple": (5, 10, {}),
    "k2 > k1, not a multiple": (5, 7, {}),
    "per token": (1, 8, {}),
    "k2 < k1": (6, 2, {}),
    "accumulation": (5, 10, {"gradient_accumulation_steps": 3}),
    "a stream a batch": (4, 8, {"carry_hidden": False}),
    "random windows": (lambda: RandomWindows(5, 5, seed=3), None, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lightning_trains_what_ignites_trainer_trains(case):
    k1, k2, options = CASES[case]
    options = {"carry_hidden": True, **options}
    data = batches()
    eager, ignite = trained_by_ignite(data, k1() if callable(k1) else k1, k2, **options)
    lit, lightning = trained_by_lightning(data, k1() if callable(k1) else k1, k2, **options)
    assert_equal_parameters(eager, lit)
    # global_step counts optimizer steps, as ignite's optimizer_step does.
    assert lightning.global_step == ignite.state.optimizer_step > 0


class HooksWithoutSuper(SGDModule):
    # Lightning's hooks written as Lightning users write them, without super(): the trainer's part is in a callback.
    def on_fit_start(self):
        pass

    def on_train_start(self):
        pass

    def on_train_epoch_start(self):
        pass

    def on_train_epoch_end(self):
        pass

    def on_save_checkpoint(self, checkpoint):
        checkpoint["mine"] = 1

    def on_load_checkpoint(self, checkpoint):
        pass


def test_hooks_a_subclass_writes_without_super_change_nothing():
    # Three windows a step: the epoch's last windows are applied at its end, which on_train_epoch_end would skip.
    data, options = batches(), {"carry_hidden": True, "gradient_accumulation_steps": 3}
    eager, _ = trained_by_ignite(data, 5, 10, **options)
    lit, _ = trained_by_lightning(data, 5, 10, module=HooksWithoutSuper, **options)
    assert_equal_parameters(eager, lit)


def test_validation_inside_an_epoch_keeps_the_windows_accumulated_for_the_next_step():
    # Lightning clears the gradients before each validation; three windows a step straddle the batches it runs after.
    data, options = batches(), {"carry_hidden": True, "gradient_accumulation_steps": 3}
    eager, _ = trained_by_ignite(data, 5, 10, **options)
    from lightning.pytorch import Callback

    validated = []

    class Count(Callback):
        def on_validation_end(self, trainer, pl_module):
            validated.append(trainer.fit_loop.epoch_loop.batch_progress.current.completed)

    torch.manual_seed(1)
    lit = SGDModule(Net().double(), mse_loss, 5, 10, **options)
    trainer = lightning_trainer(2, val_check_interval=0.5, num_sanity_val_steps=0, callbacks=[Count()])
    trainer.fit(lit, DataLoader(data, batch_size=None), DataLoader(batches(count=1, seed=9), batch_size=None))
    assert validated == [2, 4, 2, 4]  # after the second and the last of each epoch's four batches
    assert_equal_parameters(eager, lit)


@pytest.mark.parametrize("gradient", [True, False], ids=["burn-in with gradient", "without"])
def test_a_burn_in_trains_as_under_ignite(gradient):
    data = batches(starts=True, padding=True)
    options = {"carry_hidden": True, "burn_in": 6, "burn_in_gradient": gradient}
    eager, _ = trained_by_ignite(data, 4, 9, loss=masked_mse, **options)
    lit, _ = trained_by_lightning(data, 4, 9, loss=masked_mse, **options)
    assert_equal_parameters(eager, lit)


def test_sequence_starts_and_padding_with_target_counts():
    data = batches(starts=True, padding=True)
    options = {"carry_hidden": True, "target_count_fn": lambda y_pred, y: count_targets(y[..., 0]) * 4}
    eager, _ = trained_by_ignite(data, 4, 6, loss=masked_mse, **options)
    lit, _ = trained_by_lightning(data, 4, 6, loss=masked_mse, **options)
    assert_equal_parameters(eager, lit)


def test_the_parameters_equal_brute_force_tbptt():
    data = batches(count=3, length=12)
    torch.manual_seed(1)
    model = Net().double()
    reference_train(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        mse_loss,
        data,
        3,
        7,
        carry_hidden=True,
        epochs=2,
    )
    lit, _ = trained_by_lightning(data, 3, 7, carry_hidden=True)
    for p, q in zip(model.parameters(), lit.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-12, atol=1e-12)


def test_clipping_once_per_optimizer_step_after_the_division():
    from ignite_tbptt import GradientClipping

    def clip(trainer, model, optimizer):
        GradientClipping(model, max_norm=0.05).attach(trainer)

    data = batches()
    eager, _ = trained_by_ignite(data, 5, 10, carry_hidden=True, handlers=[clip], gradient_accumulation_steps=2)
    lit, _ = trained_by_lightning(data, 5, 10, carry_hidden=True, gradient_clip_val=0.05, gradient_accumulation_steps=2)
    assert_equal_parameters(eager, lit)


class ScheduledModule(TBPTTModule):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def test_a_scheduler_of_interval_step_steps_after_every_optimizer_step():
    def schedule(trainer, model, optimizer):
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_COMPLETED, lambda _: scheduler.step())

    data = batches()
    eager, _ = trained_by_ignite(data, 5, 10, carry_hidden=True, handlers=[schedule])
    lit, lightning = trained_by_lightning(data, 5, 10, carry_hidden=True, module=ScheduledModule)
    assert_equal_parameters(eager, lit)
    assert lightning.optimizers[0].param_groups[0]["lr"] == 0.1 * 0.5 ** (lightning.global_step // 3)


def test_resuming_at_an_epoch_boundary_gives_the_uninterrupted_run(tmp_path):
    # Random windows (their generator in the checkpoint), k2 > k1, and three windows a step: the epoch's leftover
    # windows are applied at its end, and the next epoch's windows continue the source's draws.
    data = batches()
    options = {"carry_hidden": True, "gradient_accumulation_steps": 3}

    def module():
        torch.manual_seed(1)
        return SGDModule(Net().double(), mse_loss, RandomWindows(4, 7, seed=5), **options)

    uninterrupted = module()
    lightning_trainer(3).fit(uninterrupted, train_dataloaders=DataLoader(data, batch_size=None))
    first = module()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    lightning_trainer(1, enable_checkpointing=True, callbacks=[checkpoints]).fit(
        first, train_dataloaders=DataLoader(data, batch_size=None)
    )
    torch.manual_seed(2)  # another initialisation: the checkpoint restores it all
    resumed = SGDModule(Net().double(), mse_loss, RandomWindows(4, 7, seed=5), **options)
    trainer = lightning_trainer(3)
    trainer.fit(resumed, train_dataloaders=DataLoader(data, batch_size=None), ckpt_path=tmp_path / "last.ckpt")
    assert_equal_parameters(uninterrupted, resumed)
    assert resumed._counts == uninterrupted._counts


def stopped_inside_the_first_epoch(tmp_path, loader, module):
    # A checkpoint written after the second of the epoch's four batches, where ModelCheckpoint(every_n_train_steps)
    # writes one; training stops there.
    from lightning.pytorch import Callback

    path = tmp_path / "inside.ckpt"

    class SaveAndStop(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 1:
                trainer.save_checkpoint(path)
                trainer.should_stop = True

    trainer = lightning_trainer(1, callbacks=[SaveAndStop()])
    trainer.fit(module(), train_dataloaders=loader())
    assert trainer.fit_loop.epoch_loop.batch_progress.current.completed == 2
    return path


def test_resuming_inside_an_epoch_from_a_stateful_loader_gives_the_uninterrupted_run(tmp_path):
    # torchdata's StatefulDataLoader, which Lightning resumes where it stopped; the stream (hidden state, the history
    # that k2 > k1 retains, two of three windows accumulated) restored from the checkpoint goes on.
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    data = batches()
    options = {"carry_hidden": True, "gradient_accumulation_steps": 3}

    def module(seed=1):
        torch.manual_seed(seed)
        return SGDModule(Net().double(), mse_loss, RandomWindows(4, 7, seed=5), **options)

    def loader():
        return stateful.StatefulDataLoader(data, batch_size=None)

    uninterrupted = module()
    lightning_trainer(2).fit(uninterrupted, train_dataloaders=loader())
    checkpoint = stopped_inside_the_first_epoch(tmp_path, loader, module)
    resumed = module(seed=2)  # another initialisation: the checkpoint restores it all
    lightning_trainer(2).fit(resumed, train_dataloaders=loader(), ckpt_path=checkpoint)
    assert_equal_parameters(uninterrupted, resumed)
    assert resumed._counts == uninterrupted._counts


def test_a_checkpoint_after_the_epochs_last_batch_resumes_from_a_plain_loader(tmp_path):
    # ModelCheckpoint(every_n_train_steps=6) lands on the first epoch's last batch (5 steps, and 1 as it ends):
    # Lightning counts it inside the epoch, but the stream has ended and nothing is iterated again.
    data, options = batches(), {"carry_hidden": True, "gradient_accumulation_steps": 3}

    def module():
        torch.manual_seed(1)
        return SGDModule(Net().double(), mse_loss, 5, 10, **options)

    uninterrupted = module()
    lightning_trainer(2).fit(uninterrupted, DataLoader(data, batch_size=None))
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=6, save_on_train_epoch_end=False)
    lightning_trainer(1, enable_checkpointing=True, callbacks=[checkpoints]).fit(
        module(), DataLoader(data, batch_size=None)
    )
    resumed = module()
    lightning_trainer(2).fit(resumed, DataLoader(data, batch_size=None), ckpt_path=tmp_path / "epoch=0-step=6.ckpt")
    assert_equal_parameters(uninterrupted, resumed)


def test_resuming_inside_an_epoch_from_a_loader_that_starts_over_is_refused(tmp_path):
    def module():
        return SGDModule(Net().double(), mse_loss, 5, 10, carry_hidden=True)

    def loader():
        return DataLoader(batches(), batch_size=None)

    checkpoint = stopped_inside_the_first_epoch(tmp_path, loader, module)
    with pytest.raises(ValueError, match=r"taken inside an epoch.*StatefulDataLoader.*save_on_train_epoch_end=True"):
        lightning_trainer(2).fit(module(), train_dataloaders=loader(), ckpt_path=checkpoint)


def trained_in_mixed_precision(data, trainer, **options):
    # float32: autocast leaves float64 alone.
    torch.manual_seed(1)
    model = Net()
    trainer.fit(SGDModule(model, mse_loss, 5, 10, carry_hidden=True, **options), DataLoader(data, batch_size=None))
    return model


def float32(data):
    return [tuple(t.float() if t.is_floating_point() else t for t in batch) for batch in data]


def test_bf16_mixed_trains_what_ignites_trainer_trains_under_autocast():
    data = float32(batches())
    torch.manual_seed(1)
    eager = Net()
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    create_tbptt_trainer(eager, optimizer, mse_loss, 5, 10, carry_hidden=True, autocast_dtype=torch.bfloat16).run(
        data, max_epochs=2
    )
    lit = trained_in_mixed_precision(data, lightning_trainer(precision="bf16-mixed"))
    assert_equal_parameters(eager, lit)


@pytest.mark.parametrize("init_scale", [2.0**8, 2.0**40], ids=["finite", "overflowing, steps skipped"])
def test_16_mixed_scales_every_backward_and_skips_inf_steps_as_ignites_trainer(init_scale):
    # Lightning makes 16-mixed on the CPU bf16-mixed; its plugin, given explicitly, keeps float16 and the scaler.
    from lightning.pytorch.plugins import MixedPrecision

    data = float32(batches())
    torch.manual_seed(1)
    eager = Net()
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    ignite = create_tbptt_trainer(
        eager, optimizer, mse_loss, 5, 10, carry_hidden=True, scaler=scaler, autocast_dtype=torch.float16
    )
    ignite.run(data, max_epochs=2)
    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=init_scale))
    lightning = lightning_trainer(plugins=[plugin])
    lit = trained_in_mixed_precision(data, lightning)
    assert_equal_parameters(eager, lit)
    assert plugin.scaler.get_scale() == scaler.get_scale()
    if init_scale > 2.0**30:
        assert scaler.get_scale() < init_scale  # the first steps overflowed, and were skipped in both
    # global_step counts the optimizer's steps that Lightning's wrapper took, skipped ones included.
    assert lightning.global_step == ignite.state.optimizer_step


def norm(module):
    return torch.nn.utils.get_total_norm([p.grad for p in module.parameters() if p.grad is not None]).item()


def test_the_gradient_norm_is_logged_at_each_step_before_clipping(tmp_path):
    # Lightning runs the Trainer's callbacks, then the module's (this one), then the module's own hook.
    import csv

    from lightning.pytorch import Callback
    from lightning.pytorch.loggers import CSVLogger

    before, after = [], []

    class Before(Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            before.append(norm(module))

    class Watching(SGDModule):
        def on_before_optimizer_step(self, optimizer):
            after.append(norm(self))

    trainer = lightning_trainer(1, logger=CSVLogger(tmp_path), log_every_n_steps=1, callbacks=[Before()])
    torch.manual_seed(1)
    module = Watching(Net().double(), mse_loss, 5, 10, carry_hidden=True, gradient_clip_val=0.05)
    trainer.fit(module, DataLoader(batches(), batch_size=None))
    with open(next(tmp_path.rglob("metrics.csv"))) as file:
        logged = [float(row["grad_norm"]) for row in csv.DictReader(file) if row.get("grad_norm")]
    # Four windows a batch, a step each; Lightning's logger takes a batch's last value logged on_step.
    assert len(before) == len(after) == trainer.global_step == 16
    assert logged == pytest.approx(before[3::4], rel=1e-6) and max(before) > 0.05
    assert max(after) <= 0.05 + 1e-12


def test_the_gradient_reach_at_the_cut_is_logged_as_gradient_reach_records_it(tmp_path):
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from ignite_tbptt import GradientReach

    at_cut = []

    def record(trainer, model, optimizer):
        GradientReach(every=2).attach(trainer)

        @trainer.on(TBPTTEvents.WINDOW_COMPLETED)
        def keep(engine):
            if engine.state.gradient_reach is not None:
                at_cut.append(engine.state.gradient_reach[max(engine.state.gradient_reach)])

    data = batches()
    trained_by_ignite(data, 5, 10, epochs=1, carry_hidden=True, handlers=[record])
    torch.manual_seed(1)
    module = SGDModule(Net().double(), mse_loss, 5, 10, carry_hidden=True, reach_every=2)
    lightning_trainer(1, logger=CSVLogger(tmp_path), log_every_n_steps=1).fit(module, DataLoader(data, batch_size=None))
    with open(next(tmp_path.rglob("metrics.csv"))) as file:
        logged = [float(row["reach_at_cut"]) for row in csv.DictReader(file) if row.get("reach_at_cut")]
    # Four windows a batch, windows 2 and 4 recorded: a batch logs its last, window 4's.
    assert len(at_cut) == 8 and logged == pytest.approx(at_cut[1::2], rel=1e-6)  # logged in float32
    with pytest.raises(ValueError, match="reach_every"):
        SGDModule(Net(), mse_loss, 5, reach_every=0)


def test_validation_carries_the_state_and_weighs_every_target_as_the_stream_evaluator():
    from ignite_tbptt import LossPerTarget, create_tbptt_evaluator

    data = batches(starts=True, padding=True, seed=4)
    counted = {"carry_hidden": True, "target_count_fn": lambda y_pred, y: count_targets(y[..., 0]) * 4}
    torch.manual_seed(1)
    model = Net().double()
    module = SGDModule(model, masked_mse, 5, 10, **counted)
    trainer = lightning_trainer(1)
    trainer.fit(module, DataLoader(batches(), batch_size=None), DataLoader(data, batch_size=None))
    logged = trainer.validate(module, DataLoader(data, batch_size=None), verbose=False)[0]["val_loss"]
    evaluator = create_tbptt_evaluator(model, {"loss": LossPerTarget(masked_mse)}, carry_hidden=True)
    expected = evaluator.run(data).metrics["loss"]
    fresh = create_tbptt_evaluator(model, {"loss": LossPerTarget(masked_mse)}).run(data).metrics["loss"]
    assert logged == pytest.approx(expected, rel=1e-6) and abs(expected - fresh) > 1e-4


def test_what_the_module_cannot_take_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"writes training_step, which TBPTTModule writes itself"):

        class Overriding(TBPTTModule):
            def training_step(self, batch, batch_idx):
                return None

    with pytest.raises(TypeError, match=r"writes on_after_backward, which TBPTTModule never runs.*on_before_optimizer"):

        class Inspecting(TBPTTModule):
            def on_after_backward(self):
                pass

    with pytest.raises(ValueError, match=r"scaler=...\): Lightning's Trainer owns this here; Trainer\(precision"):
        SGDModule(Net(), mse_loss, 5, scaler=True)
    with pytest.raises(ValueError, match=r"cuda_graphs=...\): Lightning's Trainer owns this"):
        SGDModule(Net(), mse_loss, 5, cuda_graphs=True)

    class TwoOptimizers(TBPTTModule):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]

    data = DataLoader(batches(count=1), batch_size=None)
    with pytest.raises(ValueError, match=r"gave 2 optimizers; .* Return one optimizer"):
        lightning_trainer(1).fit(TwoOptimizers(Net().double(), mse_loss, 5), train_dataloaders=data)
    with pytest.raises(ValueError, match=r"precision='bf16-true'.*Trainer\(precision='32-true'\), '16-mixed'"):
        lightning_trainer(1, precision="bf16-true").fit(SGDModule(Net(), mse_loss, 5), train_dataloaders=data)

    class Plateau(TBPTTModule):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}

    with pytest.raises(ValueError, match=r"ReduceLROnPlateau, .* step it yourself on val_loss"):
        lightning_trainer(1).fit(Plateau(Net().double(), mse_loss, 5), train_dataloaders=data)

    class OwnCallbacks(SGDModule):
        def configure_callbacks(self):
            return [ModelCheckpoint()]

    from lightning.pytorch.plugins import MixedPrecision

    class Fused(TBPTTModule):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, fused=True)

    fp16 = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match=r"SGD unscales the gradients inside its own step.*pass fused=False"):
        lightning_trainer(1, plugins=[fp16]).fit(Fused(Net(), mse_loss, 5, gradient_clip_val=1.0), data)

    with pytest.raises(RuntimeError, match=r"which did not run: return super\(\).configure_callbacks\(\) \+ \[yours\]"):
        lightning_trainer(1).fit(OwnCallbacks(Net().double(), mse_loss, 5), train_dataloaders=data)
    from lightning.pytorch.strategies import ModelParallelStrategy

    class Sharded(SGDModule):
        def configure_model(self):
            pass  # where fully_shard would go

    with pytest.raises(ValueError, match=r"strategy is ModelParallelStrategy, .* Use strategy='ddp'"):
        lightning_trainer(1, strategy=ModelParallelStrategy()).fit(Sharded(Net().double(), mse_loss, 5), data)

    class StatelessNet(torch.nn.Module):  # returns predictions only, no state to carry
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 4)

        def forward(self, x, hidden=None):
            return self.linear(x)

    stateless = StatelessNet().double()
    before = [p.detach().clone() for p in stateless.parameters()]
    with pytest.raises(TypeError, match=r"model_fn must return \(y_pred, hidden\)"):
        lightning_trainer(1).fit(SGDModule(stateless, mse_loss, 5), train_dataloaders=data)
    assert all(torch.equal(p, q) for p, q in zip(before, stateless.parameters()))  # nothing trained

    class Automatic(SGDModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.automatic_optimization = True

    with pytest.raises(ValueError, match=r"runs under manual optimization: leave automatic_optimization False"):
        lightning_trainer(1).fit(Automatic(Net().double(), mse_loss, 5), train_dataloaders=data)
    loose = DataLoader([torch.zeros(20, 3, 3)], batch_size=None)
    with pytest.raises(TypeError, match=r"batch is \(x, y\) or \(x, y, starts\).*got Tensor"):
        lightning_trainer(1).fit(SGDModule(Net(), mse_loss, 5), train_dataloaders=loose)


def test_a_callback_with_backward_hooks_is_warned_of():
    from lightning.pytorch import Callback

    class GradientWatcher(Callback):
        def on_after_backward(self, trainer, pl_module):
            pass

    trainer = lightning_trainer(1, callbacks=[GradientWatcher()])
    with pytest.warns(UserWarning, match=r"callback GradientWatcher writes on_after_backward, which TBPTTModule never"):
        trainer.fit(SGDModule(Net().double(), mse_loss, 5), DataLoader(batches(count=1), batch_size=None))


def test_padding_without_target_counts_is_warned_of_as_under_ignite():
    # The same batch handling as ignite's trainer: targets with padding and no target_count_fn are named.
    with pytest.warns(UserWarning, match=r"the targets hold padding \(24 of 240 .* Pass target_count_fn=count_targets"):
        trained_by_lightning(batches(padding=True), 5, 5, loss=masked_mse, carry_hidden=True)
