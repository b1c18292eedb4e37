"""Batches of ``carry_hidden=True`` streams: one long token sequence, or many sequences packed into columns."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch

from .checks import positive_int

__all__ = ["stream_batches", "pack_sequences", "PackedSequences"]


def stream_batches(tokens: torch.Tensor, batch_size: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Lay ``tokens`` out as ``batch_size`` parallel streams and cut them into consecutive batches.

    The usual language-model layout (Zaremba et al., 2014, "Recurrent neural network regularization",
    section 4.1): the sequence is split into ``batch_size`` contiguous parts read side by side, so that batch
    ``i + 1`` continues batch ``i`` column by column and the hidden state can be carried over
    (``create_tbptt_trainer(..., carry_hidden=True)``). Tokens that do not fill a whole column are dropped.

    Args:
        tokens: 1-D tensor of token ids, shape ``(N,)``.
        batch_size: number of parallel streams ``B``.
        length: steps per batch ``T``; the last batch may be shorter.

    Returns:
        A list of ``(x, y)`` with ``x`` and ``y`` of shape ``(T, B)`` (views of one tensor), where ``y`` is ``x``
        shifted one step ahead: the next token to predict.

    Raises:
        ValueError: if ``tokens`` is not 1-D, ``batch_size`` or ``length`` is not positive, or ``tokens`` is
            too short to give every stream at least two tokens.

    Examples:
        >>> batches = stream_batches(torch.arange(10), batch_size=2, length=3)
        >>> [(x.tolist(), y.tolist()) for x, y in batches]
        [([[0, 5], [1, 6], [2, 7]], [[1, 6], [2, 7], [3, 8]]), ([[3, 8]], [[4, 9]])]
    """
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D (N,), got shape {tuple(tokens.shape)}.")
    if batch_size < 1 or length < 1:
        raise ValueError(f"batch_size and length must be positive, got {batch_size} and {length}.")
    steps = tokens.numel() // batch_size
    if steps < 2:
        raise ValueError(f"{tokens.numel()} tokens are too few for {batch_size} streams; use a smaller batch_size.")
    columns = tokens[: steps * batch_size].view(batch_size, steps).t()  # (steps, B)
    starts = range(0, steps - 1, length)
    return [(columns[i : min(i + length, steps - 1)], columns[i + 1 : i + 1 + length]) for i in starts]


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

    Returns:
        A :class:`PackedSequences`: iterating it yields ``(x, y, starts)`` with ``x`` and ``y`` of shape
        ``(T, B)`` and ``starts`` bool of shape ``(T, B)``. ``y`` has the tokens' dtype where that holds
        ``ignore_index``, else ``int64`` (uint8 or bool tokens), so that padding never reads as a real token.

    Raises:
        TypeError: if ``batch_size``, ``length`` or ``align`` is not an int, or ``shuffle`` is True for sequences
            that have no length or cannot be indexed. While iterating, if a sequence is not a tensor.
        ValueError: if ``batch_size``, ``length`` or ``align`` is not positive. While iterating, if a sequence is
            not 1-D.

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


class PackedSequences:
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
    ) -> None:
        self.sequences = sequences
        self.batch_size = positive_int("batch_size", batch_size, "columns")
        self.length = positive_int("length", length, "steps per batch")
        self.align = positive_int("align", align, "steps, e.g. k1")
        self.ignore_index, self.pad_value, self.shuffle, self.seed = ignore_index, pad_value, shuffle, seed
        self.drop_last = drop_last
        if shuffle and not (isinstance(sequences, Sized) and hasattr(sequences, "__getitem__")):
            raise TypeError(
                f"shuffle=True needs sequences with len() and indexing (a list, a Dataset), got "
                f"{type(sequences).__name__}; shuffle it yourself or pass shuffle=False."
            )
        self.epoch = 0
        self._steps: list[int] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order ``shuffle`` draws (call it on ``Events.EPOCH_STARTED``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-self.steps // self.length)

    @property
    def steps(self) -> int:
        """Steps of an epoch in every column (``len()`` batches of ``length`` steps, the last maybe shorter).

        Raises:
            TypeError: if ``sequences`` has no length.
        """
        if not isinstance(self.sequences, Sized):
            raise TypeError(f"the batches of {type(self.sequences).__name__} have no length; pass a list.")
        if self._steps is None:
            self._steps = [max(0, _checked(s, i).numel() - 1) for i, s in enumerate(self.sequences)]
        steps = [_aligned(n, self.align) for n in self._steps if n]
        if not steps:
            return 0
        columns, total, longest = self.batch_size, sum(steps), max(steps)
        if self.shuffle and self.drop_last:
            return max(0, -(-(total - (columns - 1) * longest) // columns))
        if self.shuffle:
            return (total - longest) // columns + longest
        first_free, last_free = _column_ends(steps, columns)
        return first_free if self.drop_last else last_free

    def _order(self) -> Iterator[torch.Tensor]:
        if not self.shuffle:
            return iter(self.sequences)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return (self.sequences[i] for i in torch.randperm(len(self.sequences), generator=generator).tolist())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        # With shuffle, every order is padded to the same number of steps, the most any order can need.
        steps = self.steps if self.shuffle else None
        return _pack(
            self._order(),
            self.batch_size,
            self.length,
            self.ignore_index,
            self.pad_value,
            steps,
            self.drop_last,
            self.align,
        )


def _holds(dtype: torch.dtype, value: int) -> bool:
    """Whether ``dtype`` represents ``value`` exactly, so that padding targets never equal a real token."""
    if dtype == torch.bool:
        return False
    if dtype.is_floating_point or dtype.is_complex:
        return True
    info = torch.iinfo(dtype)
    return info.min <= value <= info.max


def _aligned(steps: int, align: int) -> int:
    """The steps a sequence of ``steps`` takes in its column when sequences start at multiples of ``align``."""
    return -(-steps // align) * align


def _checked(sequence: object, index: int) -> torch.Tensor:
    if not isinstance(sequence, torch.Tensor):
        raise TypeError(f"sequence {index} is a {type(sequence).__name__}; pack_sequences takes 1-D tensors.")
    if sequence.dim() != 1:
        raise ValueError(f"sequence {index} has shape {tuple(sequence.shape)}; pack_sequences takes 1-D tensors.")
    return sequence


class _Columns:
    """Where the columns of a packing free.

    Each next sequence goes to the column that frees first (on a tie, the lower column): the list-scheduling
    rule that both ``len()`` and the batches follow.
    """

    def __init__(self, columns: int) -> None:
        self.free = [(0, b) for b in range(columns)]  # (step where the column frees, column), a heap

    def place(self, steps: int) -> tuple[int, int]:
        """Give the next sequence, of ``steps`` steps, a column; returns its first step and the column."""
        step, b = heapq.heappop(self.free)
        heapq.heappush(self.free, (step + steps, b))
        return step, b

    @property
    def first_free(self) -> int:
        """The step where the first column frees (the next sequence's first step)."""
        return self.free[0][0]

    @property
    def last_free(self) -> int:
        """The step where the last column frees."""
        return max(step for step, _ in self.free)


def _column_ends(steps: list[int], columns: int) -> tuple[int, int]:
    """The shortest and longest column when sequences of ``steps`` go, in order, to the column that frees first."""
    packing = _Columns(columns)
    for n in steps:
        packing.place(n)
    return packing.first_free, packing.last_free


def _pack(
    sequences: Iterator[torch.Tensor],
    columns: int,
    length: int,
    ignore_index: int,
    pad_value: int,
    steps: int | None,
    drop_last: bool,
    align: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The packed batches.

    Once the sequences are used up, the epoch ends at ``steps`` if given, else where the first column frees
    (``drop_last``) or the last one does.
    """
    packing = _Columns(columns)
    placed: list[list[tuple[int, torch.Tensor]]] = [[] for _ in range(columns)]  # (first step, tokens)
    source = ((i, _checked(s, i)) for i, s in enumerate(sequences))
    exhausted, start, dtype = False, 0, None
    while True:
        end = start + length if steps is None else min(start + length, steps)
        while not exhausted and packing.first_free < end:  # fill every column up to the batch's end
            item = next(((i, s) for i, s in source if s.numel() >= 2), None)
            if item is None:
                exhausted = True
                break
            step, b = packing.place(_aligned(item[1].numel() - 1, align))
            placed[b].append((step, item[1]))
            dtype = item[1].dtype
        if exhausted and steps is None:
            steps = packing.first_free if drop_last else packing.last_free
            end = min(end, steps)
        if end <= start:
            return
        x = torch.full((end - start, columns), pad_value, dtype=dtype)
        y = torch.full(x.shape, ignore_index, dtype=dtype if _holds(dtype, ignore_index) else torch.int64)
        starts = torch.zeros(x.shape, dtype=torch.bool)
        for b, column in enumerate(placed):
            for first, tokens in column:
                lo, hi = max(first, start), min(first + tokens.numel() - 1, end)
                x[lo - start : hi - start, b] = tokens[lo - first : hi - first]
                y[lo - start : hi - start, b] = tokens[lo - first + 1 : hi - first + 1]
                if start <= first < end:
                    starts[first - start, b] = True
            placed[b] = [(first, tokens) for first, tokens in column if first + tokens.numel() - 1 > end]
        yield x, y, starts
        start = end
