import pickle

import pytest
import torch
from ignite.handlers import Checkpoint

from ignite_tbptt import create_tbptt_trainer
from ignite_tbptt.examples import char_lm

from ..examples.test_char_lm import STREAM
from ..helpers import assert_resume_is_bit_identical, make_batches
from ..reference import Net, cross_entropy

DROPOUT = 0.3  # dropout makes the rebuilt history depend on replaying the random state


def build(k1, k2, accumulation, scaler, **options):
    model = Net(n_hidden=8, dropout=DROPOUT)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    trainer = create_tbptt_trainer(
        model,
        optimizer,
        cross_entropy,
        k1,
        k2,
        carry_hidden=True,
        gradient_accumulation_steps=accumulation,
        scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8) if scaler else False,
        deterministic=True,
        **options,
    )
    return model, optimizer, trainer


# 44 steps in 5 batches per epoch; iteration 7 is the second batch of epoch 2, where windows and accumulated
# windows are left open and, for k2 > k1, history from before the last optimizer steps is retained.
BATCHES = [(x.float(), y) for x, y in make_batches([7, 12, 5, 9, 11])]
_starts = torch.rand(44, 3, generator=torch.Generator().manual_seed(3)) < 0.15
_starts[[15, 16, 17, 18], [0, 1, 2, 0]] = True  # in the history retained when iteration 7 (steps 12-18) ends
WITH_STARTS = [(x, y, s) for (x, y), s in zip(BATCHES, _starts.split([7, 12, 5, 9, 11]))]


@pytest.mark.parametrize(
    "k1,k2,accumulation,scaler",
    [(3, 7, 2, False), (2, 9, 1, True), (4, 4, 3, False), (5, 2, 2, False)],
    ids=["k2>k1-acc2", "k2>>k1-scaler", "k1=k2-acc3", "k2<k1-acc2"],
)
@pytest.mark.parametrize("stop_at", [7, 3])
def test_resuming_mid_epoch_through_ignite_checkpoint_is_bit_identical(tmp_path, k1, k2, accumulation, scaler, stop_at):
    resume_and_compare(tmp_path, k1, k2, accumulation, scaler, stop_at)


def test_a_checkpoint_written_before_window_sources_resumes_bit_identically(tmp_path):
    # Version 0.1.0 wrote the same stream state without the window source's entry.
    resume_and_compare(tmp_path, 3, 7, 2, False, 7, edit=lambda state: state["trainer"]["tbptt"].pop("source"))


@pytest.mark.parametrize("recompute", [None, 2], ids=["retained", "recompute"])
@pytest.mark.parametrize("k1,k2", [(3, 7), (4, 4), (5, 2)])
def test_resuming_with_sequence_starts_is_bit_identical(tmp_path, k1, k2, recompute):
    resume_and_compare(tmp_path, k1, k2, 2, False, 7, batches=WITH_STARTS, recompute=recompute)


@pytest.mark.parametrize("gradient", [True, False], ids=["burn-in with gradient", "without"])
def test_resuming_inside_a_burn_in_is_bit_identical(tmp_path, gradient):
    # The columns started sequences at steps 18, 16 and 17, inside the batch the run stops after: their burn-ins of
    # 4 steps end 1, 3 and 2 steps into the next batch, which each column's count in the checkpoint says.
    options = {"burn_in": 4, "burn_in_gradient": gradient}
    resume_and_compare(tmp_path, 3, 7, 2, False, 7, batches=WITH_STARTS, **options)


def test_resuming_with_a_burn_in_ending_in_the_retained_history_is_bit_identical(tmp_path):
    # Burn-ins of 2 steps from the starts at steps 15 and 16 end at 17 and 18, inside the history TBPTT(3, 7) retains
    # when iteration 7 (steps 12-18) ends: the rebuilt segments stop those columns' gradient where they did.
    resume_and_compare(tmp_path, 3, 7, 2, False, 7, batches=WITH_STARTS, burn_in=2, burn_in_gradient=False)


def resume_and_compare(tmp_path, k1, k2, accumulation, scaler, stop_at, edit=None, batches=BATCHES, **options):
    def seeded():
        torch.manual_seed(0)
        return build(k1, k2, accumulation, scaler, **options)

    def stopped(trainer):
        assert trainer.tbptt.history.segments or k2 <= k1  # there is retained history to rebuild
        torch.save(trainer.tbptt.state_dict(), tmp_path / "stream.pt")
        torch.load(tmp_path / "stream.pt", weights_only=True)  # the stream state is plain tensors and numbers

    trainer = assert_resume_is_bit_identical(tmp_path, seeded, batches, stop_at, edit=edit, stopped=stopped)
    assert trainer.state.iteration == 15 and trainer.state.window > 0


class Payload:
    """Unpickling this calls ``ran.append``: what a hostile checkpoint would do with ``os.system``."""

    def __reduce__(self):
        return (RAN.append, ("code ran",))


RAN: list = []


def test_a_checkpoint_that_would_run_code_is_refused_by_every_documented_load_path(tmp_path):
    path = tmp_path / "checkpoint_1.pt"
    model, optimizer, trainer = build(3, 7, 1, False)
    trainer.run([(x.float(), y) for x, y in make_batches([6, 6])])
    state = {"trainer": trainer.state_dict(), "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "extra": Payload()}, path)
    to_load = {"trainer": trainer, "model": model, "optimizer": optimizer}
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)  # README and docs/howto/checkpoint.md
    with pytest.raises(pickle.UnpicklingError):
        Checkpoint.load_objects(to_load, str(path))  # ignite's own loader, given the path
    with pytest.raises(SystemExit, match="refusing to load .*checkpoint_1.pt"):
        char_lm.main([*STREAM, "--epochs", "1", "--no-progress", "--logdir", str(tmp_path), "--resume", str(path)])
    assert RAN == []  # nothing ran
    torch.save(state, path)  # the same state without the payload loads on every path
    Checkpoint.load_objects(to_load, torch.load(path, weights_only=True))
    Checkpoint.load_objects(to_load, str(path))
    assert RAN == []


def test_an_unreadable_checkpoint_names_the_file(tmp_path):
    path = tmp_path / "truncated.pt"
    path.write_bytes(b"PK\x03\x04 not a whole file")
    with pytest.raises(SystemExit, match="cannot read the checkpoint .*truncated.pt"):
        char_lm.main([*STREAM, "--epochs", "1", "--no-progress", "--logdir", str(tmp_path), "--resume", str(path)])
