"""Variable-length recordings ``(x, y)`` of any trailing shapes, packed into the columns of a stream."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .packing import Packing, holds

__all__ = ["pack_recordings", "PackedRecordings"]


def pack_recordings(
    recordings: Iterable[tuple[torch.Tensor, torch.Tensor]], batch_size: int, length: int, **options: Any
) -> PackedRecordings:
    """Pack variable-length recordings ``(x, y)`` of any trailing shapes into ``batch_size`` columns.

    :func:`pack_sequences` for data that is not one token stream: sensor channels with their labels, multi-hot
    frames of music, episodes of observations and targets. Each recording is a pair of tensors with the same
    number of steps ``T_i`` along dimension 0, features ``x`` of shape ``(T_i, *F)`` and targets ``y`` of shape
    ``(T_i, *G)`` (``y`` is given, not shifted from ``x``). They are packed into columns exactly as token
    sequences are (the next goes to the column that frees first, ``starts`` True at its first step; ``shuffle``,
    ``drop_last`` and ``align`` as there), and the steps no recording fills are padding.

    The padded targets say which steps are padding, with no mask to carry: NaN for floating-point targets (real
    values, multi-hot frames; bool targets become float32), ``ignore_index`` for integer class indices (promoted
    to int64 where the dtype cannot hold it). :func:`~ignite_tbptt.masked_loss` and
    :func:`~ignite_tbptt.count_targets` read them so, for the trainer (``target_count_fn``) and the
    metrics, which count only real targets by default.

    Args:
        recordings: pairs ``(x, y)``; recordings without steps are skipped. Indexable with a length if
            ``shuffle`` is True.
        batch_size: number of columns ``B``.
        length: steps per batch ``T``; the last batch of an epoch may be shorter.
        **options: keyword-only: ``x_pad`` (the features' padding value, default 0), ``y_pad`` (the targets',
            default NaN or ``ignore_index`` as above), ``ignore_index`` (default -100), and ``shuffle``, ``seed``,
            ``drop_last``, ``align``, ``rank``, ``world_size`` as for :func:`pack_sequences`.

    Returns:
        A :class:`PackedRecordings`: iterating it yields ``(x, y, starts)``, ``x`` of shape ``(T, B, *F)``,
        ``y`` of shape ``(T, B, *G)`` and ``starts`` bool of shape ``(T, B)``.

    Raises:
        TypeError: if ``batch_size``, ``length`` or ``align`` is not an int, or ``shuffle`` is True for recordings
            that have no length or cannot be indexed. While iterating, if a recording is not a pair of tensors.
        ValueError: if ``batch_size``, ``length`` or ``align`` is not positive, or ``y_pad`` is a real class of
            integer targets (not negative). While iterating, if a recording's ``x`` and ``y`` differ in steps, or
            its trailing shapes or dtypes differ from the first recording's, or if no recording has a step (from
            ``len()`` too): an epoch would have no batch.

    Examples:
        >>> x1, y1 = torch.ones(3, 2), torch.tensor([[1.0], [0.0], [1.0]])  # 3 steps of 2 features, 1 target
        >>> x2, y2 = torch.full((2, 2), 2.0), torch.tensor([[0.0], [0.0]])
        >>> (x, y, starts), *_ = pack_recordings([(x1, y1), (x2, y2)], batch_size=2, length=4)
        >>> x.shape, y.shape, y[:, :, 0].t().tolist()
        (torch.Size([3, 2, 2]), torch.Size([3, 2, 1]), [[1.0, 0.0, 1.0], [0.0, 0.0, nan]])
    """
    return PackedRecordings(recordings, batch_size, length, **options)


class PackedRecordings(Packing):
    """The re-iterable batches of :func:`pack_recordings`; its arguments are documented there.

    ``len()`` and the epoch's steps follow :class:`PackedSequences`' rules.
    """

    def __init__(
        self,
        recordings: Iterable[tuple[torch.Tensor, torch.Tensor]],
        batch_size: int,
        length: int,
        *,
        x_pad: Any = 0,
        y_pad: Any = None,
        ignore_index: int = -100,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        align: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(
            recordings,
            batch_size,
            length,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            align=align,
            rank=rank,
            world_size=world_size,
        )
        if isinstance(y_pad, int) and not isinstance(y_pad, bool) and y_pad >= 0:
            raise ValueError(
                f"y_pad must not be a real class: class indices are not negative, got {y_pad}. Use the loss's "
                "ignore_index (-100 by default), or leave y_pad out."
            )
        self.x_pad, self.y_pad, self.ignore_index = x_pad, y_pad, ignore_index

    packer, pieces = "pack_recordings", "recording of at least one step"

    def steps_of(self, item: Any, index: int) -> int:
        """A recording's steps, ``T_i``."""
        return self._checked(item, index)[0].shape[0]

    def pairs(self, items: Iterator[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The recordings with at least one step."""
        first = None  # trailing shapes and dtypes every recording must share
        for i, item in enumerate(items):
            x, y = self._checked(item, i)
            layout = (x.shape[1:], x.dtype, y.shape[1:], y.dtype)
            first = first or layout
            if layout != first:
                raise ValueError(
                    f"recording {i} has features {tuple(x.shape[1:])} {x.dtype} and targets {tuple(y.shape[1:])} "
                    f"{y.dtype} per step, the first had {tuple(first[0])} {first[1]} and {tuple(first[2])} "
                    f"{first[3]}: every recording must share them."
                )
            if x.shape[0]:
                yield x, y

    def padding(self, y: torch.Tensor) -> tuple[Any, Any, torch.dtype]:
        """``x_pad``, and NaN or ``ignore_index`` (or ``y_pad``) with the dtype that holds it."""
        if y.dtype == torch.bool or y.dtype.is_floating_point or y.dtype.is_complex:
            dtype = torch.float32 if y.dtype == torch.bool else y.dtype
            return self.x_pad, float("nan") if self.y_pad is None else self.y_pad, dtype
        pad = self.ignore_index if self.y_pad is None else self.y_pad
        return self.x_pad, pad, y.dtype if holds(y.dtype, pad) else torch.int64

    @staticmethod
    def _checked(item: Any, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and all(torch.is_tensor(t) for t in item)):
            raise TypeError(f"recording {index} is a {type(item).__name__}; pack_recordings takes (x, y) tensor pairs.")
        x, y = item
        if x.dim() == 0 or y.dim() == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"recording {index} has x of shape {tuple(x.shape)} and y of shape {tuple(y.shape)}; both need the "
                "same number of steps along dimension 0."
            )
        return x, y
