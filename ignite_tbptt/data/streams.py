"""One long token sequence cut into the batches of a ``carry_hidden=True`` stream: the language-model layout."""

from __future__ import annotations

import torch

from .shards import shard_of

__all__ = ["stream_batches"]


def stream_batches(
    tokens: torch.Tensor, batch_size: int, length: int, *, rank: int | None = None, world_size: int | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Lay ``tokens`` out as ``batch_size`` parallel streams and cut them into consecutive batches.

    The usual language-model layout (Zaremba et al., 2014, "Recurrent neural network regularization",
    section 4.1): the sequence is split into ``batch_size`` contiguous parts read side by side, so that batch
    ``i + 1`` continues batch ``i`` column by column and the hidden state can be carried over
    (``create_tbptt_trainer(..., carry_hidden=True)``). Tokens that do not fill a whole column are dropped.

    Args:
        tokens: 1-D tensor of token ids, shape ``(N,)``.
        batch_size: number of parallel streams ``B``.
        length: steps per batch ``T``; the last batch may be shorter.
        rank: this process's rank in a distributed run; with ``world_size``, or both read from
            ``ignite.distributed`` (0 and 1 outside one). The process keeps the columns ``rank::world_size`` of the
            ``batch_size`` (:mod:`ignite_tbptt.data.shards`): every process gets as many batches, and together they
            train as one process on all the columns.
        world_size: the number of processes.

    Returns:
        A list of ``(x, y)`` with ``x`` and ``y`` of shape ``(T, B)``, time first as the trainer's default
        ``time_dim=0`` reads them (views of one tensor; ``B`` this process's columns), where ``y`` is ``x`` shifted
        one step ahead: the next token to predict.

    Raises:
        ValueError: if ``tokens`` is not 1-D, ``batch_size`` or ``length`` is not positive, ``tokens`` is
            too short to give every stream at least two tokens, or there are fewer columns than processes.

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
    shard = shard_of(rank, world_size)
    shard.check(batch_size)
    columns = shard.select(tokens[: steps * batch_size].view(batch_size, steps).t())  # (steps, B)
    starts = range(0, steps - 1, length)
    return [(columns[i : min(i + length, steps - 1)], columns[i + 1 : i + 1 + length]) for i in starts]
