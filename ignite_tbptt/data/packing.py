"""Packing variable-length pieces into the columns of ``carry_hidden=True`` batches, by list scheduling.

Each next piece (a token sequence, a recording) goes to the column that frees first, lowest column on a tie
(Graham 1969, "Bounds on multiprocessing timing anomalies", list scheduling): the rule that both an epoch's
length and its batches follow. :class:`Packing` holds what every packing shares (columns, epoch length,
shuffled order, alignment); :mod:`ignite_tbptt.data` says what a piece is and how its padding reads.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sized
from typing import Any, Protocol, runtime_checkable

import torch

from ..checks import positive_int
from .shards import shard_of

__all__ = ["Packing", "holds"]


@runtime_checkable
class _Indexed(Protocol):
    """Pieces read by index: a list, a tuple, a map-style dataset."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class Packing(ABC):
    """Re-iterable ``(x, y, starts)`` batches of pieces packed into ``batch_size`` columns of ``length`` steps.

    Subclasses say how many steps a piece takes (:meth:`steps_of`), what its ``(x, y)`` steps are
    (:meth:`pairs`) and what pads them (:meth:`padding`).
    """

    #: The function that builds such a packing and what it packs, for the error when nothing is to be packed.
    packer, pieces = "the packer", "pieces that take a step"

    def __init__(
        self,
        items: Iterable[Any],
        batch_size: int,
        length: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        align: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.items = items
        self.batch_size = positive_int("batch_size", batch_size, "columns")
        self.length = positive_int("length", length, "steps per batch")
        self.align = positive_int("align", align, "steps, e.g. k1")
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        if shuffle and not (isinstance(items, Sized) and hasattr(items, "__getitem__")):
            raise TypeError(
                f"shuffle=True needs pieces with len() and indexing (a list, a Dataset), got "
                f"{type(items).__name__}; shuffle them yourself or pass shuffle=False."
            )
        self.shard = shard_of(rank, world_size)  # this process's columns: every process packs all the same way
        self.shard.check(self.batch_size)
        self.epoch = 0
        self._steps: list[int] | None = None

    @abstractmethod
    def steps_of(self, item: Any, index: int) -> int:
        """The steps the piece ``item`` (the ``index``-th) takes in its column, 0 to skip it."""

    @abstractmethod
    def pairs(self, items: Iterator[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The ``(x, y)`` of each piece that takes steps, ``(n, ...)`` both, read lazily from ``items``."""

    @abstractmethod
    def padding(self, y: torch.Tensor) -> tuple[Any, Any, torch.dtype]:
        """The padding value of ``x``, that of ``y`` and ``y``'s dtype in the batches, given a piece's ``y``."""

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order ``shuffle`` draws (call it on ``Events.EPOCH_STARTED``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-self.steps // self.length)

    @property
    def steps(self) -> int:
        """Steps of an epoch in every column (``len()`` batches of ``length`` steps, the last maybe shorter).

        Raises:
            TypeError: if the pieces have no length.
        """
        if not isinstance(self.items, Sized):
            raise TypeError(f"the batches of {type(self.items).__name__} have no length; pass a list.")
        if self._steps is None:
            self._steps = [self.steps_of(item, i) for i, item in enumerate(self.items)]
        steps = [_aligned(n, self.align) for n in self._steps if n]
        if not steps:
            raise self.nothing_to_pack()
        columns, total, longest = self.batch_size, sum(steps), max(steps)
        if self.shuffle and self.drop_last:
            return max(0, -(-(total - (columns - 1) * longest) // columns))
        if self.shuffle:
            return (total - longest) // columns + longest
        first_free, last_free = _column_ends(steps, columns)
        return first_free if self.drop_last else last_free

    def nothing_to_pack(self) -> ValueError:
        """The error for pieces of which none takes a step: an epoch of them would have no iteration."""
        return ValueError(
            f"{self.packer} got no {self.pieces}: an epoch would have no batch. Check that the data is not empty "
            "(an exhausted generator, a filter that dropped everything)."
        )

    def _order(self) -> Iterator[Any]:
        items = self.items
        if not self.shuffle:
            return iter(items)
        if not isinstance(items, _Indexed):
            raise TypeError(f"shuffle=True reads the pieces by index: pass a list, got {type(items).__name__}.")
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        # On the CPU, as the generator is, also where torch's default device is a GPU.
        order = torch.randperm(len(items), generator=generator, device="cpu").tolist()
        return (items[i] for i in order)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        # With shuffle, every order is padded to the same number of steps, the most any order can need.
        steps = self.steps if self.shuffle else None
        batches = _pack(self, self.pairs(self._order()), steps)
        if self.shard.whole:
            return batches
        return (tuple(self.shard.select(t) for t in batch) for batch in batches)


def holds(dtype: torch.dtype, value: int) -> bool:
    """Whether ``dtype`` represents ``value`` exactly, so that padding targets never equal a real token."""
    if dtype == torch.bool:
        return False
    if dtype.is_floating_point or dtype.is_complex:
        return True
    info = torch.iinfo(dtype)
    return info.min <= value <= info.max


def _aligned(steps: int, align: int) -> int:
    """The steps a piece of ``steps`` takes in its column when pieces start at multiples of ``align``."""
    return -(-steps // align) * align


class _Columns:
    """Where the columns of a packing free: each next piece goes to the column that frees first."""

    def __init__(self, columns: int) -> None:
        self.free = [(0, b) for b in range(columns)]  # (step where the column frees, column), a heap

    def place(self, steps: int) -> tuple[int, int]:
        """Give the next piece, of ``steps`` steps, a column; returns its first step and the column."""
        step, b = heapq.heappop(self.free)
        heapq.heappush(self.free, (step + steps, b))
        return step, b

    @property
    def first_free(self) -> int:
        """The step where the first column frees (the next piece's first step)."""
        return self.free[0][0]

    @property
    def last_free(self) -> int:
        """The step where the last column frees."""
        return max(step for step, _ in self.free)


def _column_ends(steps: list[int], columns: int) -> tuple[int, int]:
    """The shortest and longest column when pieces of ``steps`` go, in order, to the column that frees first."""
    packing = _Columns(columns)
    for n in steps:
        packing.place(n)
    return packing.first_free, packing.last_free


def _pack(
    packing: Packing, pairs: Iterator[tuple[torch.Tensor, torch.Tensor]], steps: int | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The packed batches.

    Once the pieces are used up, the epoch ends at ``steps`` if given, else where the first column frees
    (``drop_last``) or the last one does.
    """
    columns, length = packing.batch_size, packing.length
    free = _Columns(columns)
    placed: list[list[tuple[int, torch.Tensor, torch.Tensor]]] = [[] for _ in range(columns)]  # (first step, x, y)
    exhausted, start = False, 0
    first: tuple[torch.Tensor, torch.Tensor] | None = None
    padding: tuple[Any, Any, torch.dtype] | None = None
    while True:
        end = start + length if steps is None else min(start + length, steps)
        while not exhausted and free.first_free < end:  # fill every column up to the batch's end
            pair = next(pairs, None)
            if pair is None:
                exhausted = True
                break
            step, b = free.place(_aligned(pair[0].shape[0], packing.align))
            placed[b].append((step, *pair))
            if first is None:  # every piece shares the first's trailing shapes and dtypes
                first, padding = pair, packing.padding(pair[1])
        if exhausted and first is None:
            raise packing.nothing_to_pack()
        if exhausted and steps is None:
            steps = free.first_free if packing.drop_last else free.last_free
            end = min(end, steps)
        if end <= start:
            return
        assert first is not None and padding is not None  # a column reaches past start only with a piece placed
        x_pad, y_pad, y_dtype = padding
        x = torch.full((end - start, columns, *first[0].shape[1:]), x_pad, dtype=first[0].dtype)
        y = torch.full((end - start, columns, *first[1].shape[1:]), y_pad, dtype=y_dtype)
        starts = torch.zeros((end - start, columns), dtype=torch.bool)
        for b, column in enumerate(placed):
            for step, xs, ys in column:
                lo, hi = max(step, start), min(step + xs.shape[0], end)
                x[lo - start : hi - start, b] = xs[lo - step : hi - step]
                y[lo - start : hi - start, b] = ys[lo - step : hi - step]
                if start <= step < end:
                    starts[step - start, b] = True
            placed[b] = [piece for piece in column if piece[0] + piece[1].shape[0] > end]
        yield x, y, starts
        start = end
