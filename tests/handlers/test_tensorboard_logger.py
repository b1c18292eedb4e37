import json
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from ignite.engine import Events
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from ignite_tbptt import (
    BitsPerTarget,
    GradientClipping,
    attach_tensorboard,
    create_tbptt_evaluator,
    create_tbptt_trainer,
)

from ..helpers import make_batches
from ..reference import Net, cross_entropy


def train_with_logging(log_dir, x_axis="windows", scaler=False):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = [(x.float(), y) for x, y in make_batches([8, 12])]
    trainer = create_tbptt_trainer(model, optimizer, cross_entropy, 4, 6, carry_hidden=True, scaler=scaler)
    GradientClipping(model, max_norm=0.1).attach(trainer)
    evaluator = create_tbptt_evaluator(model, {"bpc": BitsPerTarget(cross_entropy)}, carry_hidden=True)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda _: evaluator.run(batches))
    norms = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: norms.append(e.state.grad_norm.item()))
    logger = attach_tensorboard(
        trainer, log_dir, evaluators={"validation": evaluator}, hparams={"lr": 0.5}, x_axis=x_axis
    )
    trainer.run(batches, max_epochs=2)
    logger.close()
    return trainer, evaluator, norms


def read(log_dir):
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return events


def test_curves_validation_hparams_and_schedule_read_back(tmp_path):
    trainer, evaluator, norms = train_with_logging(tmp_path, scaler=True)
    events = read(tmp_path)
    tags = set(events.Tags()["scalars"])
    expected = {
        "train/window_loss",
        "train/grad_norm",
        "train/lr/group_0",
        "train/loss_scale",
        "train/targets_per_second",
        "train/peak_memory_mib",
        "validation/bpc",
    }
    assert expected <= tags
    loss = events.Scalars("train/window_loss")
    assert [e.step for e in loss] == list(range(1, 11))  # 20 steps per epoch in windows of 4
    assert all(e.value > 0 for e in loss)
    # The logged norm is the one before clipping, the same that the clipping handler recorded.
    grad_norms = [e.value for e in events.Scalars("train/grad_norm")]
    assert grad_norms[4] == pytest.approx(norms[1], rel=1e-6) and max(grad_norms) > 0.1
    assert {e.value for e in events.Scalars("train/lr/group_0")} == {0.5}
    assert {e.value for e in events.Scalars("train/loss_scale")} == {65536.0}
    assert all(e.value > 0 for e in events.Scalars("train/targets_per_second"))
    assert all(e.value > 10 for e in events.Scalars("train/peak_memory_mib"))
    validation = events.Scalars("validation/bpc")
    assert [e.step for e in validation] == [5, 10]
    assert validation[-1].value == pytest.approx(evaluator.state.metrics["bpc"], rel=1e-6)
    assert events.Tags()["images"] == ["schedule"]

    content = events.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    logged = {k: getattr(v, v.WhichOneof("kind")) for k, v in data.session_start_info.hparams.items()}
    # torch writes booleans as numbers
    assert logged["k1"] == 4 and logged["k2"] == 6 and logged["lr"] == 0.5 and logged["carry_hidden"] == 1


def test_tokens_on_the_x_axis(tmp_path):
    trainer, _, _ = train_with_logging(tmp_path, x_axis="tokens")
    events = read(tmp_path)
    steps = [e.step for e in events.Scalars("train/window_loss")]
    assert steps == [3 * 4 * w for w in range(1, 11)]  # 3 streams x 4 steps per window
    assert [e.step for e in events.Scalars("validation/bpc")] == [60, 120] == [60, trainer.state.targets_seen]


def test_a_real_tensorboard_server_serves_the_curves(tmp_path, free_port):
    train_with_logging(tmp_path)
    port = free_port
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path), "--host", "127.0.0.1"]
        + ["--port", str(port), "--load_fast=false"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/data/plugin/scalars"
        deadline, tags = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/tags", timeout=5) as response:
                    tags = json.load(response)
                if tags.get(".", {}).get("train/window_loss"):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert {"train/window_loss", "train/grad_norm", "validation/bpc"} <= set(tags["."])
        with urllib.request.urlopen(f"{url}/scalars?tag=train/window_loss&run=.", timeout=5) as response:
            points = json.load(response)
        assert [step for _, step, _ in points] == list(range(1, 11))
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_arguments_are_checked(tmp_path):
    model = Net()
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, 2)
    with pytest.raises(ValueError, match="x_axis"):
        attach_tensorboard(trainer, tmp_path, x_axis="epochs")
    with pytest.raises(TypeError, match="create_tbptt_trainer"):
        from ignite.engine import Engine

        attach_tensorboard(Engine(lambda e, b: None), tmp_path)


def test_schedule_picture_matches_the_schedule():
    from ignite_tbptt import Schedule, plot_schedule

    for k1, k2, n in [(2, 5, 12), (5, 2, 12), (4, 4, 10)]:
        fig = plot_schedule(k1, k2, n)
        patches = {p.get_gid(): p for p in fig.axes[0].patches if p.get_gid()}
        s = Schedule(k1, k2)
        starts = range(0, n, k1)
        own = 0
        for w, start in enumerate(starts):
            end = s.window_end(start, n)
            reach, losses = patches[f"reach-{w}"], patches[f"losses-{w}"]
            assert (reach.get_x(), reach.get_x() + reach.get_width()) == (s.cut(start, end), end)
            assert (losses.get_x(), losses.get_x() + losses.get_width()) == (start, end)
            own += s.cut(start, end) - start if k2 < k1 else 0
        assert sum(gid.startswith("own-") for gid in patches) == own
        assert own == (6 if (k1, k2) == (5, 2) else 0)  # 3 steps in each of the 2 full windows


def test_gradient_reach_is_logged_as_a_scalar_per_recorded_window_and_a_picture(tmp_path):
    from ignite_tbptt import GradientReach, TBPTTEvents

    torch.manual_seed(0)
    model = Net()
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, 4, 6)
    GradientReach(every=2).attach(trainer)
    expected = {}

    def remember(engine):
        reach, (_, end, cut) = engine.state.gradient_reach, engine.state.window_bounds
        if reach and end - cut in reach:
            expected[engine.state.window] = reach[end - cut] / max(reach.values())

    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, remember)
    logger = attach_tensorboard(trainer, tmp_path, reach_picture_every=2)
    trainer.run([(x.float(), y) for x, y in make_batches([16, 16])])
    logger.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    scalars = events.Scalars("train/reach_at_cut")
    assert len(expected) >= 4  # windows 2, 4, 6, 8; each batch's first window reaches the stream's start
    assert {e.step: pytest.approx(e.value, rel=1e-5) for e in scalars} == expected
    assert all(0 < v <= 1 for v in expected.values())
    assert "gradient_reach" in events.Tags()["images"]


def test_windows_of_padding_only_log_no_curve(tmp_path):
    # Packed sequences end in padding: windows 4 to 6 (steps 6-11) have no target to learn from.
    torch.manual_seed(0)
    model = Net()
    x, y = make_batches([12])[0]
    y[6:] = -100
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        lambda y_pred, y: torch.nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten()),
        2,
        target_count_fn=lambda y_pred, y: int((y != -100).sum()),
    )
    logger = attach_tensorboard(trainer, tmp_path)
    trainer.run([(x.float(), y)])
    logger.close()
    assert trainer.state.window == 6 and trainer.state.output > 0
    assert [e.step for e in read(tmp_path).Scalars("train/window_loss")] == [1, 2, 3]


def test_how_programs_ran_is_logged_with_cuda_graphs(tmp_path):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, fused=True)
    batches = [(x.float(), y) for x, y in make_batches([8, 12])]
    trainer = create_tbptt_trainer(model, optimizer, cross_entropy, 4, carry_hidden=True, cuda_graphs="recorded")
    logger = attach_tensorboard(trainer, tmp_path)
    trainer.run(batches, max_epochs=3)
    logger.close()
    events = read(tmp_path)
    counts = trainer.state.programs
    assert counts.replays > 0 and counts.captures > 0
    for name, value in counts.as_dict().items():
        logged = [e.value for e in events.Scalars(f"train/programs/{name}")]
        assert logged == sorted(logged) and logged[-1] == value  # counts so far, at every window
    eager = create_tbptt_trainer(model, optimizer, cross_entropy, 4, carry_hidden=True)
    assert eager.state.programs is None
