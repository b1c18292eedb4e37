"""Checkpoints written by earlier releases load and resume to the uninterrupted run's parameters."""

from pathlib import Path

import pytest
import torch
from ignite.handlers import Checkpoint

from .checkpoints.make import BATCHES, CASES, EPOCHS, build

FOLDER = Path(__file__).parent / "checkpoints"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("release", ["0.3"])
def test_a_checkpoint_of_an_earlier_release_resumes_exactly(release, case):
    saved = torch.load(FOLDER / f"v{release}-{case}.pt", weights_only=True)
    stream = saved["checkpoint"]["trainer"]["tbptt"]
    assert stream["position"] > 0 and stream["window"] is not None  # taken with a window open, mid-stream

    model, optimizer, trainer = build(case)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer}, saved["checkpoint"])
    trainer.run(BATCHES, max_epochs=EPOCHS)
    for p, q in zip(model.parameters(), saved["final"], strict=True):  # the file's tensors are the CPU's
        torch.testing.assert_close(p, q.to(p.device), rtol=0, atol=1e-12)
