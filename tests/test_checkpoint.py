import pytest
import torch

from ignite_tbptt import create_tbptt_trainer

from .helpers import assert_resume_is_bit_identical, make_batches
from .reference import Net, cross_entropy

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
