"""Batches of ``carry_hidden=True`` streams: one long token sequence, or many sequences packed into columns."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .packing import Packing, holds

__all__ = ["stream_batches", "pack_sequences", "PackedSequences", "pack_recordings", "PackedRecordings"]


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
    ) -> None:
        super().__init__(sequences, batch_size, length, shuffle=shuffle, seed=seed, drop_last=drop_last, align=align)
        self.ignore_index, self.pad_value = ignore_index, pad_value

    @property
    def sequences(self) -> Iterable[torch.Tensor]:
        """The token sequences."""
        return self.items

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
            ``drop_last``, ``align`` as for :func:`pack_sequences`.

    Returns:
        A :class:`PackedRecordings`: iterating it yields ``(x, y, starts)``, ``x`` of shape ``(T, B, *F)``,
        ``y`` of shape ``(T, B, *G)`` and ``starts`` bool of shape ``(T, B)``.

    Raises:
        TypeError: if ``batch_size``, ``length`` or ``align`` is not an int, or ``shuffle`` is True for recordings
            that have no length or cannot be indexed. While iterating, if a recording is not a pair of tensors.
        ValueError: if ``batch_size``, ``length`` or ``align`` is not positive, or ``y_pad`` is a real class of
            integer targets (not negative). While iterating, if a recording's ``x`` and ``y`` differ in steps, or
            its trailing shapes or dtypes differ from the first recording's.

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
    ) -> None:
        super().__init__(recordings, batch_size, length, shuffle=shuffle, seed=seed, drop_last=drop_last, align=align)
        if isinstance(y_pad, int) and not isinstance(y_pad, bool) and y_pad >= 0:
            raise ValueError(
                f"y_pad must not be a real class: class indices are not negative, got {y_pad}. Use the loss's "
                "ignore_index (-100 by default), or leave y_pad out."
            )
        self.x_pad, self.y_pad, self.ignore_index = x_pad, y_pad, ignore_index

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


def _checked(sequence: object, index: int) -> torch.Tensor:
    if not isinstance(sequence, torch.Tensor):
        raise TypeError(f"sequence {index} is a {type(sequence).__name__}; pack_sequences takes 1-D tensors.")
    if sequence.dim() != 1:
        raise ValueError(f"sequence {index} has shape {tuple(sequence.shape)}; pack_sequences takes 1-D tensors.")
    return sequence
