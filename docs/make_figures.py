"""Regenerate the pictures used in the README and the docs: ``python docs/make_figures.py``."""

from pathlib import Path

import torch

from ignite_tbptt import GradientReach, TBPTTEvents, create_tbptt_trainer, plot_columns, plot_reach, plot_schedule
from ignite_tbptt.data import pack_sequences, stream_batches
from ignite_tbptt.examples.char_lm import CharLSTM, Vocabulary, cross_entropy, stdlib_corpus


def reach_figure(path: Path) -> None:
    """The gradient reach of a real run: a small char-LSTM on the standard library, TBPTT(25, 50), 1,200 windows."""
    torch.manual_seed(0)
    text = stdlib_corpus()[:240_000]
    vocab = Vocabulary(text)
    model = CharLSTM(len(vocab), embedding=32, hidden=128)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    trainer = create_tbptt_trainer(model, optimizer, cross_entropy, 25, 50, carry_hidden=True)
    GradientReach(every=10, stride=5).attach(trainer)
    early, late = [], []
    trainer.add_event_handler(
        TBPTTEvents.WINDOW_COMPLETED(every=10),
        lambda e: (
            (early if e.state.window <= 300 else late).append(e.state.gradient_reach)
            if e.state.window_bounds[1] - e.state.window_bounds[0] == 25  # full windows: the same lags
            else None
        ),
    )
    trainer.run(stream_batches(vocab.encode(text), batch_size=8, length=100))
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    plot_reach(early, ax=left)
    plot_reach(late, ax=right)
    left.set_title(f"windows 1-300 ({len(early)} recorded)")
    right.set_title(f"windows 301-{trainer.state.window} ({len(late)} recorded)")
    fig.savefig(path, dpi=90)


HERE = Path(__file__).parent / "images"

if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    for k1, k2, n in [(4, 4, 16), (2, 5, 12), (5, 2, 15)]:
        plot_schedule(k1, k2, n).savefig(HERE / f"schedule_k1-{k1}_k2-{k2}.png", dpi=90)
    lengths = torch.randint(3, 22, (9,), generator=torch.Generator().manual_seed(4)).tolist()
    sequences = [torch.arange(n) for n in lengths]
    plot_columns(pack_sequences(sequences, batch_size=3, length=12), k1=4).savefig(HERE / "packed_columns.png", dpi=90)
    reach_figure(HERE / "gradient_reach.png")
