"""Resuming into another configuration: refused before anything changes where unsafe, allowed where safe."""

import pytest
import torch
from ignite.engine import Events
from ignite.handlers import Checkpoint

from ignite_tbptt import AdaptiveTruncation, RandomWindows, create_tbptt_trainer, load_checkpoint

from ..helpers import make_batches
from ..reference import Net, cross_entropy

BATCHES = [(x.float(), y) for x, y in make_batches([7, 12, 5, 9, 11])]  # 44 steps, 5 batches per epoch
SAVED = {"k1": 3, "k2": 7, "accumulation": 2}


def build(k1=3, k2=7, accumulation=2, carry_hidden=True, deterministic=True, recompute=None, adaptive=False):
    torch.manual_seed(0)
    model = Net(n_hidden=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    trainer = create_tbptt_trainer(
        model,
        optimizer,
        cross_entropy,
        k1,
        k2 if isinstance(k1, int) else None,
        carry_hidden=carry_hidden,
        gradient_accumulation_steps=accumulation,
        deterministic=deterministic,
        recompute=recompute,
    )
    if adaptive:
        AdaptiveTruncation(0.1, k2_min=4, k2_max=9, every=1).attach(trainer)
    return model, optimizer, trainer


def checkpoint(tmp_path, iteration, **config):
    """A checkpoint file of a run stopped after ``iteration``, as ignite's ``Checkpoint`` writes it."""
    model, optimizer, trainer = build(**config)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=iteration), lambda e: e.terminate())
    trainer.run(BATCHES, max_epochs=2)
    path = tmp_path / f"checkpoint_{iteration}.pt"
    state = {"trainer": trainer.state_dict(), "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, path)
    return path


def snapshot(model, optimizer, trainer):
    return [p.detach().clone() for p in model.parameters()], optimizer.state_dict()["state"], trainer.state.iteration


@pytest.mark.parametrize(
    "given,shown",
    [
        ({"k2": 9}, r"windows: saved Schedule\(k1=3, k2=7\), given Schedule\(k1=3, k2=9\)"),
        ({"k2": 3}, r"windows: saved Schedule\(k1=3, k2=7\), given Schedule\(k1=3, k2=3\)"),
        ({"k1": RandomWindows(3, 7, seed=0)}, r"given RandomWindows\(k1=3, k2=7, p=0.95"),
        ({"recompute": 2}, r"recompute: saved None, given 2"),
        ({"carry_hidden": False}, r"carry_hidden: saved True, given False"),
        ({"deterministic": False}, r"deterministic: saved True, given False"),
        ({"accumulation": 1}, r"gradient_accumulation_steps: saved 2, given 1"),  # iteration 4: one is waiting
    ],
    ids=["longer-k2", "k2=k1", "random-windows", "recompute", "carry_hidden", "deterministic", "accumulation"],
)
def test_a_mid_stream_checkpoint_refuses_another_configuration_and_changes_nothing(tmp_path, given, shown):
    path = checkpoint(tmp_path, 4 if "accumulation" in given else 2, **SAVED)  # a stream under way
    model, optimizer, trainer = build(**{**SAVED, **given})
    before = snapshot(model, optimizer, trainer)
    with pytest.raises(ValueError, match=shown):
        # The trainer first, as docs/howto/checkpoint.md lists it: refused before the model or optimizer load.
        Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, load_checkpoint(path))
    after = snapshot(model, optimizer, trainer)
    assert all(torch.equal(p, q) for p, q in zip(before[0], after[0]))
    assert after[1:] == before[1:] == ({}, 0)


def test_the_configuration_may_change_at_an_epochs_end(tmp_path):
    path = checkpoint(tmp_path, 5, **SAVED)  # the end of epoch 1
    model, optimizer, trainer = build(k1=4, k2=4, accumulation=1, deterministic=False, recompute=2)
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, load_checkpoint(path))
    state = trainer.run(BATCHES, max_epochs=2)
    assert (state.epoch, state.iteration, state.window) == (2, 10, 15 + 11)  # 15 windows of 3 steps, 11 of 4


def test_accumulation_may_change_where_no_window_waits_for_its_step(tmp_path):
    outcomes = set()
    for iteration in range(1, 5):
        path = checkpoint(tmp_path, iteration, **SAVED)
        state = load_checkpoint(path)
        waiting = state["trainer"]["tbptt"]["group_windows"] > 0
        model, optimizer, trainer = build(**{**SAVED, "accumulation": 3})
        to_load = {"trainer": trainer, "model": model, "optimizer": optimizer}
        if waiting:
            with pytest.raises(ValueError, match="gradient_accumulation_steps: saved 2, given 3"):
                Checkpoint.load_objects(to_load, state)
        else:
            Checkpoint.load_objects(to_load, state)
            trainer.run(BATCHES, max_epochs=2)
            assert trainer.state.iteration == 10
        outcomes.add(waiting)
    assert outcomes == {True, False}


def test_a_checkpoint_without_a_configuration_loads_as_before(tmp_path):
    # Written by 0.2.0 and earlier: nothing to compare, so nothing is refused.
    state = load_checkpoint(checkpoint(tmp_path, 2, **SAVED))
    del state["trainer"]["tbptt"]["configuration"]
    model, optimizer, trainer = build(**SAVED)
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, state)
    assert trainer.run(BATCHES, max_epochs=2).iteration == 10


def test_a_rebuild_that_fails_leaves_the_checkpoints_weights_and_a_fresh_stream(tmp_path):
    path = checkpoint(tmp_path, 2, **SAVED)
    state = load_checkpoint(path)
    tbptt = state["trainer"]["tbptt"]
    assert len(tbptt["weights"]) > 1  # graphs of older weights, copied in while the history is rebuilt
    model, optimizer, trainer = build(**SAVED)
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, state)
    loaded = [p.detach().clone() for p in model.parameters()]
    forward, calls = model.forward, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return forward(*args)

    model.forward = failing
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.run(BATCHES, max_epochs=2)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), loaded))
    assert not trainer.tbptt.history.segments and trainer.tbptt.loop.stream.position == 0


def test_resuming_an_adaptive_run_without_its_handler_is_refused(tmp_path):
    path = checkpoint(tmp_path, 2, **SAVED, adaptive=True)
    model, optimizer, trainer = build(**SAVED)
    # A handler may still be attached after loading: the windows in use are compared when the run starts.
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, load_checkpoint(path))
    with pytest.raises(ValueError, match=r"windows: saved AdaptiveTruncation\(k1=3, delta=.*\), given Schedule\(k1=3"):
        trainer.run(BATCHES, max_epochs=2)
    model, optimizer, trainer = build(**SAVED)
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, load_checkpoint(path))
    AdaptiveTruncation(0.1, k2_min=4, k2_max=9, every=1).attach(trainer)  # attached after loading, as before
    assert trainer.run(BATCHES, max_epochs=2).iteration == 10


def test_a_source_of_another_type_starts_afresh_where_the_change_is_allowed(tmp_path):
    # With carry_hidden=False every batch is its own stream: the windows may change, and the new source does not
    # load the old one's state.
    path = checkpoint(tmp_path, 2, k1=RandomWindows(3, k2=7, seed=0), carry_hidden=False, adaptive=True)
    model, optimizer, trainer = build(k1=RandomWindows(3, k2=7, seed=0), carry_hidden=False)
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, load_checkpoint(path))
    assert trainer.run(BATCHES, max_epochs=2).iteration == 10


def test_load_checkpoint_names_a_file_it_cannot_read(tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(b"PK\x03\x04 not a whole file")
    with pytest.raises(OSError, match="cannot read the checkpoint .*truncated.pt"):
        load_checkpoint(truncated)
    with pytest.raises(OSError, match="cannot read the checkpoint .*missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")


def test_an_older_record_of_an_adaptive_run_is_read_as_it_was_meant(tmp_path):
    # Up to 0.4.0.dev0 the record named the built windows, Schedule, and the handler's source apart, by type.
    state = load_checkpoint(checkpoint(tmp_path, 2, **SAVED, adaptive=True))
    record = state["trainer"]["tbptt"]["configuration"]
    record["windows"], record["source"] = {"type": "Schedule", "k1": 3, "k2": 7}, "AdaptiveTruncation"
    model, optimizer, trainer = build(**SAVED)
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, state)
    with pytest.raises(ValueError, match=r"windows: saved AdaptiveTruncation\(k1=3\), given Schedule\(k1=3, k2=7\)"):
        trainer.run(BATCHES, max_epochs=2)
    # The handler keeps the built windows' k1: another k1 is refused mid-stream, when it loads.
    model, optimizer, trainer = build(**{**SAVED, "k1": 2}, adaptive=True)
    with pytest.raises(ValueError, match=r"windows: saved AdaptiveTruncation\(k1=3\), given AdaptiveTruncation\(k1=2"):
        Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, state)
    model, optimizer, trainer = build(**SAVED, adaptive=True)
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, state)
    assert trainer.run(BATCHES, max_epochs=2).iteration == 10


@pytest.mark.cpu_only("stands in for CUDA's generators, which a GPU's own resume tests use")
@pytest.mark.parametrize("stop_at,restored", [(7, True), (5, False)], ids=["mid-epoch", "epoch-end"])
def test_cuda_generators_are_saved_and_restored_where_ignite_restores_the_others(stop_at, restored, monkeypatch):
    # ignite's DeterministicEngine restores the CPU generators only when a run resumes mid-epoch (at an epoch's end
    # it reseeds); CUDA's, which dropout on a GPU draws from, must follow it there and only there.
    saved_state = torch.arange(4, dtype=torch.uint8)
    set_calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [saved_state.clone()])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: set_calls.append(states))
    # ignite turns deterministic algorithms on where CUDA is available: not for the rest of the suite.
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda *args, **kwargs: None)
    model, optimizer, trainer = build()
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=stop_at), lambda e: e.terminate())
    trainer.run(BATCHES, max_epochs=2)
    state = trainer.state_dict()
    assert torch.equal(state["cuda_rng_states"][0], saved_state)

    _, _, resumed = build()
    resumed.load_state_dict(state)
    resumed.run(BATCHES, max_epochs=2)
    if restored:
        assert len(set_calls) == 1 and torch.equal(set_calls[0][0], saved_state)
    else:
        assert set_calls == []
