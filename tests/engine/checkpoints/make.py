"""Write the checkpoint files that later releases must still load: ``python -m tests.engine.checkpoints.make``.

Each file holds a checkpoint of a run stopped mid-stream (an open window, retained segments, gradients accumulated
for the next optimizer step, a window source's draws) and the parameters the uninterrupted run ends with. The
files in this folder were written by ignite-tbptt 0.3 (``v0.3-*.pt``) and are never regenerated: they are what a
user's checkpoint of that release holds.
"""

from pathlib import Path

import torch
from ignite.engine import Events

from ignite_tbptt import ARTBP, create_tbptt_trainer
from ignite_tbptt.version import __version__

from ...helpers import make_batches
from ...reference import Net, cross_entropy

BATCHES = make_batches([7, 12, 5, 9, 11])  # float64, 44 steps per epoch
STOP_AT, EPOCHS = 7, 3  # the stream of the second epoch is under way
CASES = {
    "schedule": {"k1": 3, "k2": 7, "gradient_accumulation_steps": 2},
    "artbp": {"k1": ARTBP(2, mean_length=5, seed=3), "k2": None},
    "recompute": {"k1": 2, "k2": 5, "recompute": 2},
}


def build(case):
    """A seeded float64 model, its Adam optimizer and a deterministic trainer for ``case``."""
    torch.manual_seed(0)
    model = Net(n_hidden=6).double()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    options = dict(CASES[case])
    if case == "artbp":  # a fresh source: its draws are part of what the checkpoint restores
        options["k1"] = ARTBP(2, mean_length=5, seed=3)
    k1, k2 = options.pop("k1"), options.pop("k2")
    trainer = create_tbptt_trainer(
        model, optimizer, cross_entropy, k1, k2, carry_hidden=True, deterministic=True, **options
    )
    return model, optimizer, trainer


def write(folder: Path) -> None:
    for case in CASES:
        model, _, trainer = build(case)
        trainer.run(BATCHES, max_epochs=EPOCHS)
        final = [p.detach().clone() for p in model.parameters()]
        model, optimizer, trainer = build(case)
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=STOP_AT), lambda e: e.terminate())
        trainer.run(BATCHES, max_epochs=EPOCHS)
        checkpoint = {"trainer": trainer.state_dict(), "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        release = ".".join(__version__.split(".")[:2])
        torch.save({"checkpoint": checkpoint, "final": final}, folder / f"v{release}-{case}.pt")


if __name__ == "__main__":
    write(Path(__file__).parent)
