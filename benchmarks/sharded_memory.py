"""Peak memory per process of an FSDP2-sharded model against k2 / k1: ``python -m benchmarks.sharded_memory``.

A character LSTM (embedding 64, ``--hidden`` units, vocabulary 256) sharded by ``fully_shard`` per layer and at the
root over ``--nproc`` gloo processes on the CPU, SGD, each process ``--batch`` columns of batches of 100 steps.
Each k2 / k1 runs in fresh processes; rank 0 reports the growth of its peak resident memory (``ru_maxrss``) over
training, measured from after a warm-up batch at k1 = k2. At k2 > k1 a segment retained across an optimizer step
keeps its weight version's shard and, once a later window reaches it, the gathered unsharded weights, and the
retained segments keep their activations: the growth is expected to rise with k2 / k1.

The model's unsharded size and one process's shard are printed with the table. Resident memory counts everything
the process holds, the C allocator's free memory included. glibc's ``malloc`` serves a block of several MB from
its heap, not from a mapping of its own, once a block that large was freed (its mmap threshold rises to the
largest freed block), and such heap memory is not given back while anything above it lives; FSDP2 frees a gathered
tensor or a reduce-scatter's input of the whole model's size in every model call, so the default allocator's peak
grows with the number of such blocks, not with what is alive. The processes therefore run with
``MALLOC_MMAP_THRESHOLD_`` set to 1 MiB (set before they start; it also stops the threshold from moving), which
maps every block of 1 MiB or more on its own and unmaps it when freed: the peak then follows the memory alive.
``--default-allocator`` shows glibc's default.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import socket
import sys
import tempfile
from pathlib import Path

import ignite.distributed as idist
import torch
from torch import nn

from benchmarks.report import markdown_table
from ignite_tbptt import create_tbptt_trainer

K1 = 10


class CharLSTM(nn.Module):
    def __init__(self, hidden: int, vocab: int = 256) -> None:
        super().__init__()
        self.embedding, self.lstm, self.readout = nn.Embedding(vocab, 64), nn.LSTM(64, hidden), nn.Linear(hidden, vocab)

    def forward(self, x, hidden=None):
        out, hidden = self.lstm(self.embedding(x), hidden)
        return self.readout(out), hidden


def loss_fn(y_pred, y):
    return nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def run(local_rank: int, args: argparse.Namespace, ratio: int, out: Path) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = CharLSTM(args.hidden)
    if not args.unsharded:
        for layer in (model.embedding, model.lstm, model.readout):
            fully_shard(layer)
        fully_shard(model)
    g = torch.Generator().manual_seed(idist.get_rank())
    tokens = torch.randint(0, 256, (100 * args.batches + 1, args.batch), generator=g)
    batches = [(tokens[i : i + 100], tokens[i + 1 : i + 101]) for i in range(0, 100 * args.batches, 100)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    create_tbptt_trainer(model, optimizer, loss_fn, K1, K1, carry_hidden=True).run(batches[:1])  # warm-up
    before = peak_mb()
    create_tbptt_trainer(model, optimizer, loss_fn, K1, K1 * ratio, carry_hidden=True).run(batches)
    if idist.get_rank() == 0:
        out.write_text(
            json.dumps(
                {
                    "full_mb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20,
                    "shard_mb": sum(_local(p).numel() * p.element_size() for p in model.parameters()) / 2**20,
                    "growth_mb": peak_mb() - before,
                    "peak_mb": peak_mb(),
                }
            )
        )
    del model, optimizer
    gc.collect()  # while the group is alive: FSDP2's last asynchronous work objects
    # Both processes leave together: one tearing its group down while the other (rank 0, writing the result) still
    # holds work on it aborted a process once ("terminate called without an active exception"), with the machine busy.
    idist.barrier()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4, help="columns per process")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--unsharded", action="store_true", help="the same processes without FSDP2, for comparison")
    p.add_argument("--ratios", type=int, nargs="+", default=[1, 2, 4, 8], help="the k2 / k1 to measure, k1 = 10")
    p.add_argument(
        "--default-allocator",
        action="store_true",
        help="glibc's default mmap threshold (the peak then counts freed heap)",
    )
    args = p.parse_args(argv)
    if not args.default_allocator:  # read by glibc when a process starts: the spawned processes inherit it
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(2**20)
    results = {}
    for ratio in args.ratios:  # fresh processes for each: a peak is never lowered
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "result.json"
            with idist.Parallel(
                backend="gloo", nproc_per_node=args.nproc, master_addr="127.0.0.1", master_port=_free_port()
            ) as par:
                par.run(run, args, ratio, out)
            results[ratio] = json.loads(out.read_text())
    first = results[args.ratios[0]]
    print(
        f"LSTM of {args.hidden} units on {args.nproc} gloo processes{' (not sharded)' if args.unsharded else ''}: "
        f"weights {first['full_mb']:.1f} MB, one process's part {first['shard_mb']:.1f} MB; k1 = {K1}"
        f"{'; glibc default allocator' if args.default_allocator else '; MALLOC_MMAP_THRESHOLD_=1 MiB'}",
        file=sys.stderr,
    )
    print(
        markdown_table(
            ["k2 / k1", "peak resident memory growth over k1 = k2's, rank 0 (MB)", "peak resident memory (MB)"],
            [[str(r), f"{v['growth_mb']:.0f}", f"{v['peak_mb']:.0f}"] for r, v in results.items()],
        )
    )


if __name__ == "__main__":
    main()
