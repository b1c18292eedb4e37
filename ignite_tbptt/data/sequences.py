"""Many token sequences (documents, episodes) packed into the columns of a ``carry_hidden=True`` stream."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .packing import Packing, holds

__all__ = ["pack_sequences", "PackedSequences"]


def pack_sequences(sequences: Iterable[torch.Tensor], batch_size: int, length: int, **options: Any) -> PackedSequences:
    """Pack variable-length token sequences into ``batch_size`` columns of ``(x, y, starts)`` batches.

    Each column is a queue: the next sequence goes to the column that frees first (the lowest column on a
    tie), and starts at the step after that column's previous sequence ends, with ``starts`` True there.
    The trainer (``create_tbptt_trainer(..., carry_hidden=True)``) then carries the hidden state along a
    column and resets it where a sequence starts, so no state and no gradient cross from one sequence into
    the next, while long sequences span as many batches as they need. ``y`` is ``x`` shifted one step ahead
    within each sequence, as in :func:`stream_batches`: a sequence of ``n`` tokens gives ``n - 1`` steps.
    Once the input is used up, columns are padded to the end of the last sequence: ``x`` with ``pad_value``
    and ``y`` with ``ignore_index``, so that a loss with ``ignore_index`` (``nn.CrossEntropyLoss``'s default
    is -100) and ``target_count_fn=lambda y_pred, y: (y != ignore_index).sum()`` give the exact mean over
    real targets.

    With ``align=A`` every sequence also starts at a multiple of ``A`` steps: its column is padded after it
    (``x`` with ``pad_value``, ``y`` with ``ignore_index``) up to the next multiple. With ``A = k1`` of fixed
    windows, every start falls on a window boundary, where the trainer ends a model call anyway, so starts no
    longer split the fused calls of the other columns: padding instead of shorter calls. A sequence of ``n``
    steps then takes ``ceil(n / A) * A``; the trade is measured in ``docs/benchmarks-alignment.md``.

    With ``drop_last=True`` the epoch ends instead at the first step where a column has no sequence left, so
    every batch is full; the steps the sequences still running would have had are not used (as a
    ``DataLoader`` drops its last incomplete batch). An optimizer step on the ragged end, where only a few
    columns still hold a long sequence, can pull the model towards those few sequences. It suits many
    sequences per column; with fewer sequences than columns it gives no batch at all, and with a few of very
    different lengths it leaves most of the longest ones out.

    Sequences are read lazily, only as far as the batch being built needs, so a corpus larger than memory
    (e.g. a generator reading files) streams through; pass a re-iterable (a list, a ``Dataset``) to run
    several epochs.

    Args:
        sequences: 1-D token tensors, shape ``(N_i,)``; shorter than two tokens are skipped. Indexable with a
            length if ``shuffle`` is True.
        batch_size: number of columns ``B``.
        length: steps per batch ``T``; the last batch of an epoch may be shorter.
        **options: keyword-only, as follows.
        ignore_index: target value of the padding steps; default -100.
        pad_value: input value of the padding steps; default 0.
        shuffle: visit the sequences in a random order, drawn from ``seed`` and the epoch
            (:meth:`PackedSequences.set_epoch`, as ``DistributedSampler``); default False.
        seed: seed of the order when ``shuffle`` is True; default 0.
        drop_last: end the epoch where the first column runs out of sequences instead of padding; default False.
        align: start every sequence at a multiple of this many steps (``k1``, say), padding after the previous
            one; default 1 (no padding between sequences).
        rank, world_size: this process's rank and the number of processes of a distributed run; default
            ``ignite.distributed``'s (0 and 1 outside one). Every process packs all the sequences into the
            ``batch_size`` columns alike and keeps the columns ``rank::world_size`` (:mod:`ignite_tbptt.data.shards`):
            every process gets as many batches, and together they train as one process on all the columns.

    Returns:
        A :class:`PackedSequences`: iterating it yields ``(x, y, starts)`` with ``x`` and ``y`` of shape
        ``(T, B)`` and ``starts`` bool of shape ``(T, B)``. ``y`` has the tokens' dtype where that holds
        ``ignore_index``, else ``int64`` (uint8 or bool tokens), so that padding never reads as a real token.

    Raises:
        TypeError: if ``batch_size``, ``length`` or ``align`` is not an int, or ``shuffle`` is True for sequences
            that have no length or cannot be indexed. While iterating, if a sequence is not a tensor.
        ValueError: if ``batch_size``, ``length`` or ``align`` is not positive. While iterating, if a sequence is
            not 1-D, or if no sequence has two tokens (from ``len()`` too): an epoch would have no batch.

    Examples:
        >>> batches = pack_sequences([torch.arange(5), torch.arange(10, 13), torch.arange(20, 24)], 2, length=3)
        >>> for x, y, starts in batches:
        ...     print(x.t().tolist(), y.t().tolist(), starts.t().int().tolist())
        [[0, 1, 2], [10, 11, 20]] [[1, 2, 3], [11, 12, 21]] [[1, 0, 0], [1, 0, 1]]
        [[3, 0], [21, 22]] [[4, -100], [22, 23]] [[0, 0], [0, 0]]
        >>> aligned = pack_sequences([torch.arange(5), torch.arange(10, 13), torch.arange(20, 24)], 1, 8, align=4)
        >>> [(x.t().tolist(), starts.t().int().tolist()) for x, y, starts in aligned]  # starts at steps 0, 4, 8
        [([[0, 1, 2, 3, 10, 11, 0, 0]], [[1, 0, 0, 0, 1, 0, 0, 0]]), ([[20, 21, 22, 0]], [[1, 0, 0, 0]])]
    """
    return PackedSequences(sequences, batch_size, length, **options)


class PackedSequences(Packing):
    """The re-iterable batches of :func:`pack_sequences`; its arguments are documented there.

    ``len()`` is the number of batches per epoch when ``sequences`` has a length (it reads every sequence's
    length once). With ``shuffle`` it is the same for every order: enough for the longest packing any order
    can give (Graham's list-scheduling bound: (total - longest) // B + longest steps), the columns being padded
    to it, because ignite fixes an epoch's length when the run starts; with ``drop_last`` too, the fewest
    steps any order keeps every column busy for (at least (total - (B - 1) * longest) / B), where it is cut.
    """

    def __init__(
        self,
        sequences: Iterable[torch.Tensor],
        batch_size: int,
        length: int,
        *,
        ignore_index: int = -100,
        pad_value: int = 0,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        align: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(
            sequences,
            batch_size,
            length,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            align=align,
            rank=rank,
            world_size=world_size,
        )
        self.ignore_index, self.pad_value = ignore_index, pad_value

    @property
    def sequences(self) -> Iterable[torch.Tensor]:
        """The token sequences."""
        return self.items

    packer, pieces = "pack_sequences", "sequence of at least two tokens"

    def steps_of(self, item: Any, index: int) -> int:
        """A sequence of ``n`` tokens gives ``n - 1`` steps (none if shorter than two tokens)."""
        return max(0, _checked(item, index).numel() - 1)

    def pairs(self, items: Iterator[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each sequence as ``(x, y)``: its tokens but the last, and the tokens one step ahead."""
        for i, tokens in enumerate(items):
            if _checked(tokens, i).numel() >= 2:
                yield tokens[:-1], tokens[1:]

    def padding(self, y: torch.Tensor) -> tuple[Any, Any, torch.dtype]:
        """``pad_value`` and ``ignore_index``, ``y`` promoted to int64 where its dtype cannot hold the latter."""
        return self.pad_value, self.ignore_index, y.dtype if holds(y.dtype, self.ignore_index) else torch.int64


def _checked(sequence: object, index: int) -> torch.Tensor:
    if not isinstance(sequence, torch.Tensor):
        raise TypeError(f"sequence {index} is a {type(sequence).__name__}; pack_sequences takes 1-D tensors.")
    if sequence.dim() != 1:
        raise ValueError(f"sequence {index} has shape {tuple(sequence.shape)}; pack_sequences takes 1-D tensors.")
    return sequence
