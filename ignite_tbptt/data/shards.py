"""Each process's share of the columns, so that every process of a distributed run gets as many batches.

Documents and recordings are uneven: packing ``docs[rank::world_size]`` on each process gives each its own number of
batches, and a process with more then waits in a collective that never comes. The data helpers instead lay out all
the data in ``batch_size`` columns, the same on every process, and each process keeps its own columns,
``rank::world_size``: every process gets the same batches (a column whose data ran out carries padding, which adds
no gradient), and the processes together train exactly as one process on all the columns would (the trainer sums
gradients and target counts at each optimizer step, :mod:`ignite_tbptt.engine.distributed`). The same shuffle seed
and epoch give every process the same layout, and resuming mid-epoch finds the same batches.
"""

from __future__ import annotations

from typing import Any

import ignite.distributed as idist

from ..checks import positive_int

__all__ = ["Shard", "shard_of"]


class Shard:
    """This process's columns: ``rank::world_size``.

    Args:
        rank: the process's rank, ``0 <= rank < world_size``.
        world_size: the number of processes.
    """

    __slots__ = ("rank", "world_size")

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    @property
    def whole(self) -> bool:
        """Whether this process keeps every column (one process)."""
        return self.world_size == 1

    def select(self, t: Any, dim: int = 1) -> Any:
        """This process's columns of ``t`` along ``dim``, 1 for the packers' ``(T, B, *)`` batches (a view)."""
        if self.whole:
            return t
        index = [slice(None)] * t.dim()
        index[dim] = slice(self.rank, None, self.world_size)
        return t[tuple(index)]

    def check(self, batch_size: int) -> None:
        """Check that every process gets a column of ``batch_size``.

        Raises:
            ValueError: if there are fewer columns than processes.
        """
        if batch_size < self.world_size:
            raise ValueError(
                f"batch_size is the number of columns of all processes together; {batch_size} columns cannot be "
                f"shared among {self.world_size} processes. Use at least one column per process."
            )


def shard_of(rank: int | None = None, world_size: int | None = None) -> Shard:
    """The shard of this process: ``rank`` and ``world_size`` as given, else ``ignite.distributed``'s.

    Raises:
        TypeError, ValueError: if only one of them is given, or they are not ``0 <= rank < world_size``.
    """
    if rank is None and world_size is None:
        return Shard(idist.get_rank(), idist.get_world_size())  # 0 and 1 outside a distributed run
    if rank is None or world_size is None:
        raise TypeError("pass both rank and world_size, or neither (to read them from ignite.distributed).")
    world_size = positive_int("world_size", world_size, "processes")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size) = [0, {world_size}), got {rank!r}.")
    return Shard(rank, world_size)
