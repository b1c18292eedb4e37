"""Peak memory of one training run, measured in a fresh process: ``python -m benchmarks.memory ...``.

Run it with ``MALLOC_MMAP_THRESHOLD_=65536`` (``benchmarks.run`` does): glibc otherwise raises its mmap
threshold after large blocks are freed and keeps later ones in its heap, so the resident set would count
freed activations. Memory is sampled right after every model call, when a segment's activations have just
been added to those retained (and, in recomputation mode, during each rebuild): on CPU the process's
current resident set, on CUDA the allocator's allocated bytes. The process-wide peak (``ru_maxrss``) would
not do: importing torch peaks higher than a small model's training. The bytes autograd holds for backward
are counted too (:class:`SavedBytes`). Batches are generated on the fly, so the data costs the same
whatever the stream's length; what grows with the stream, if anything, is the trainer's own state. Prints
one JSON line.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.methods import build_model, loss_fn
from ignite_tbptt import create_tbptt_trainer, default_model_fn


class Stream:
    """``steps`` steps of random tokens in batches of ``length``, made when asked for."""

    def __init__(self, steps: int, length: int, batch: int, vocab: int = 100) -> None:
        self.steps, self.length, self.batch, self.vocab = steps, length, batch, vocab

    def __len__(self) -> int:
        return -(-self.steps // self.length)

    def __iter__(self):
        for i in range(len(self)):
            g = torch.Generator().manual_seed(i)
            t = min(self.length, self.steps - i * self.length)
            tokens = torch.randint(0, self.vocab, (t + 1, self.batch), generator=g)
            yield tokens[:-1], tokens[1:]


class SavedBytes:
    """Bytes of the non-parameter tensors autograd holds for backward (unique storages), and their peak.

    Counted through ``saved_tensors_hooks`` around training. The trainer's own hooks (which keep the weights
    of k2 > k1 histories across optimizer steps) take precedence inside their scope, so for those segments
    the count is incomplete: use it for k2 <= k1 and for recomputation mode.
    """

    def __init__(self, parameters) -> None:
        self.parameters = {p.untyped_storage().data_ptr() for p in parameters}
        self.live: dict[int, list[int]] = {}  # storage -> [bytes, saved tensors alive]
        self.now = self.peak = 0

    def pack(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self.parameters:
            return tensor
        entry = self.live.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.now += entry[0]
            self.peak = max(self.peak, self.now)
        entry[1] += 1
        return _Saved(self, key, tensor)

    def release(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]


class _Saved:
    def __init__(self, owner: SavedBytes, key: int, tensor: torch.Tensor) -> None:
        self.owner, self.key, self.tensor = owner, key, tensor.detach()

    def __del__(self) -> None:
        self.owner.release(self.key)


def unpack(saved):
    return saved.tensor if isinstance(saved, _Saved) else saved


def current_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    with open("/proc/self/statm") as f:  # resident pages
        return int(f.read().split()[1]) * 4096 / 2**20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--k1", type=int, required=True)
    p.add_argument("--k2", type=int, required=True)
    p.add_argument("--recompute", type=int, default=None)
    p.add_argument("--batch-length", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--cell", default="lstm", choices=["lstm", "gru"])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--embedding", type=int, default=64)
    p.add_argument("--vocab", type=int, default=100)
    p.add_argument("--autocast", choices=["bfloat16", "float16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(args, args.cell, device)
    samples = []

    def sampled(model, x, hidden):
        out = default_model_fn(model, x, hidden)
        samples.append(current_mib(device))
        return out

    trainer = create_tbptt_trainer(
        model,
        torch.optim.Adam(model.parameters()),
        loss_fn,
        args.k1,
        args.k2,
        carry_hidden=True,
        recompute=args.recompute,
        model_fn=sampled,
        device=device,
    )
    with torch.no_grad():  # loads the kernels: the baseline is the process ready to train
        model(torch.zeros(2, args.batch, dtype=torch.long, device=device))
    before = current_mib(device)
    saved = SavedBytes(model.parameters())
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, unpack):
        trainer.run(Stream(args.steps, args.batch_length, args.batch, args.vocab), max_epochs=1)
    result = {"peak_mib": max(samples), "baseline_mib": before, "training_mib": max(samples) - before}
    print(json.dumps({**result, "saved_activations_mib": saved.peak / 2**20}))


if __name__ == "__main__":
    main()
