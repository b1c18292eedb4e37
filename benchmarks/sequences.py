"""Sequence starts, split or aligned: ``python -m benchmarks.sequences [--repeats N] [--markdown FILE]``.

The same documents (random tokens, geometric lengths of mean 2, 4 and 16 x k1) trained one epoch three ways,
each a ``carry_hidden=True`` stream of 32 columns in batches of 200 steps:

- **one stream, no starts**: the documents joined into one token stream (``stream_batches``): what the model's
  compute costs without any start, the reference;
- **packed**: ``pack_sequences(..., drop_last=True)``: each document starts right after the previous one in its
  column, and every step where some column starts ends the fused model call of all columns;
- **packed, align=k1**: ``pack_sequences(..., drop_last=True, align=k1)``: every document starts at a multiple of
  k1, where a window ends anyway, and its column is padded up to there.

Time is per predicted token, padding included in the time but not in the count (the loss ignores it), so the
padding's cost shows. ``drop_last`` ends the epoch where the first column runs out, so the padding is that of
the alignment alone, not of the ragged end (a separate matter: the how-to on sequences). There are about 10
documents per column. Runs are interleaved and repeated; the median is reported.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from benchmarks import methods
from benchmarks.report import markdown_table, rotated, write_page
from ignite_tbptt import create_tbptt_trainer
from ignite_tbptt.data import pack_sequences, stream_batches

COLUMNS, LENGTH = 32, 200


def documents(mean: float, tokens: int, seed: int = 0) -> list[torch.Tensor]:
    """Random documents of geometric lengths (at least 2 tokens) with the given mean, about ``tokens`` in all."""
    g = torch.Generator().manual_seed(seed)
    p = 1 / mean
    docs, total = [], 0
    while total < tokens:
        n = 1 + int(torch.empty(1).geometric_(p, generator=g).item())  # steps: n - 1, of mean `mean`
        docs.append(torch.randint(0, 100, (n,), generator=g))
        total += n
    return docs


def layouts(docs: list[torch.Tensor], k1: int) -> dict[str, list]:
    return {
        "one stream, no starts": stream_batches(torch.cat(docs), COLUMNS, LENGTH),
        "packed": list(pack_sequences(docs, COLUMNS, LENGTH, drop_last=True)),
        "packed, align=k1": list(pack_sequences(docs, COLUMNS, LENGTH, drop_last=True, align=k1)),
    }


def targets(batches) -> int:
    return sum(int((batch[1] != -100).sum()) for batch in batches)


def train(cell: str, batches, k1: int, k2: int) -> float:
    torch.manual_seed(0)
    model = methods.CharModel(cell)
    trainer = create_tbptt_trainer(
        model, torch.optim.Adam(model.parameters(), lr=1e-3), methods.loss_fn, k1, k2, carry_hidden=True
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        # Timed as the page's figures were, without a count of targets (and its read per model call): the padding
        # then counts in the mean, which the time does not depend on.
        warnings.filterwarnings("ignore", "the targets hold padding", UserWarning)
        trainer.run(batches)
    return time.perf_counter() - start


def measure(cells, means, k1, k2, repeats, per_column) -> list[dict]:
    rows = []
    for cell in cells:
        for mean in means:
            runs = layouts(documents(mean * k1, int(per_column * COLUMNS * mean * k1)), k1)
            for batches in runs.values():  # warm-up
                train(cell, batches[:1], k1, k2)
            times = {name: [] for name in runs}
            for repeat in range(repeats):
                for name in rotated(list(runs), repeat):
                    times[name].append(train(cell, runs[name], k1, k2))
            reference = None
            for name, batches in runs.items():
                predicted = targets(batches)
                steps = sum(batch[0].shape[0] for batch in batches) * COLUMNS
                per_token = statistics.median(times[name]) / predicted
                reference = per_token if reference is None else reference
                rows.append(
                    {
                        "model": cell,
                        "mean": mean,
                        "layout": name,
                        "us_per_token": per_token * 1e6,
                        "vs_stream": per_token / reference,
                        "padding": 1 - predicted / steps,
                    }
                )
            print(f"timed {cell} mean {mean} x k1", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], k1: int, k2: int) -> str:
    header = ["model", "k1", "k2", "mean document length", "layout", "µs per predicted token", "vs one stream"]
    cells = [
        [
            r["model"],
            str(k1),
            str(k2),
            f"{r['mean']} x k1",
            r["layout"],
            f"{r['us_per_token']:.2f}",
            f"{r['vs_stream']:.2f}x",
            f"{r['padding']:.0%}",
        ]
        for r in rows
    ]
    return markdown_table([*header, "padding"], cells)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--k1", type=int, default=25)
    p.add_argument("--k2", type=int, default=25)
    p.add_argument("--means", nargs="+", type=float, default=[2, 4, 16], help="mean document lengths, in k1")
    p.add_argument("--cells", nargs="+", default=["lstm", "gru"])
    p.add_argument("--per-column", type=float, default=10, help="documents per column, on average")
    p.add_argument("--markdown", type=Path, help="also write the page to this file")
    args = p.parse_args(argv)
    rows = measure(args.cells, args.means, args.k1, args.k2, args.repeats, args.per_column)
    text = table(rows, args.k1, args.k2)
    print(text)
    if args.markdown:
        setup = (
            f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}. Model: embedding "
            "64, an LSTM or GRU of 256, vocabulary 100, Adam"
        )
        intro = __doc__.split("\n\n", 1)[1]
        title = "sequence starts, split or aligned"
        write_page(args.markdown, title, "benchmarks.sequences", argv, setup, intro, text)
    return rows


if __name__ == "__main__":
    main()
