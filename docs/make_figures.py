"""Regenerate the pictures used in the README and the docs: ``python docs/make_figures.py``."""

from pathlib import Path

import torch

from ignite_tbptt import plot_columns, plot_schedule
from ignite_tbptt.data import pack_sequences

HERE = Path(__file__).parent / "images"

if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    for k1, k2, n in [(4, 4, 16), (2, 5, 12), (5, 2, 15)]:
        plot_schedule(k1, k2, n).savefig(HERE / f"schedule_k1-{k1}_k2-{k2}.png", dpi=90)
    lengths = torch.randint(3, 22, (9,), generator=torch.Generator().manual_seed(4)).tolist()
    sequences = [torch.arange(n) for n in lengths]
    plot_columns(pack_sequences(sequences, batch_size=3, length=12), k1=4).savefig(HERE / "packed_columns.png", dpi=90)
