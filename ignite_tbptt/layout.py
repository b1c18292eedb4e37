"""Which axis of a batch is time and which is the batch: the one place that knows, free of torch.

A batch's tensors ``x``, ``y`` and the predictions share one time dimension, ``time_dim``, counted as Python counts
(a negative value from the end, so that ``time_dim=-1`` names the last axis of tensors of different ranks, e.g.
``x`` of shape ``(B, C, T)`` and ``y`` of shape ``(B, T)``). The batch dimension is the first axis that is not time:
1 where time comes first, ``(T, B, *)``; 0 otherwise, ``(B, T, *)``, ``(B, C, T)``. Windows, segments and the
evaluator's pieces are slices along time; the columns of a stream, the rows of an initial state and the columns a
sequence start resets are counted along the batch dimension; ``starts`` is ``(T, B)`` where time comes first and
``(B, T)`` otherwise.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Layout"]


class Layout(NamedTuple):
    """The time and batch axes of a trainer's or evaluator's batches.

    Args:
        time_dim: the index of the time dimension of ``x``, ``y`` and ``y_pred``; negative counts from the end.

    Examples:
        >>> import torch
        >>> layout = Layout(time_dim=-1)  # (B, C, T) audio features
        >>> x = torch.zeros(4, 3, 10)
        >>> layout.time_first(x), layout.batch_axis(x), layout.length(x), layout.columns(x)
        (False, 0, 10, 4)
        >>> tuple(layout.steps(x, 2, 7).shape)
        (4, 3, 5)
    """

    time_dim: int = 0

    @classmethod
    def of(cls, time_dim: Any) -> Layout:
        """The layout of a trainer's or an evaluator's ``time_dim`` argument, made once where the options are read.

        Raises:
            TypeError: if ``time_dim`` is not an int.
        """
        if isinstance(time_dim, bool) or not isinstance(time_dim, int):
            raise TypeError(
                f"time_dim must be an int (0 for (T, B, *) batches, 1 for (B, T, *), -1 for the last axis), "
                f"got {time_dim!r}."
            )
        return cls(time_dim)

    def time_first(self, t: Any) -> bool:
        """Whether time is ``t``'s first axis, so that ``starts`` is ``(T, B)`` rather than ``(B, T)``."""
        return self.time_dim % t.dim() == 0

    def batch_axis(self, t: Any) -> int:
        """The batch dimension of ``t``: 1 if time is its first axis, else 0."""
        return 1 if self.time_first(t) else 0

    def starts_axes(self, x: Any) -> tuple[int, int]:
        """The time and batch axes of the ``starts`` of a batch whose input is ``x``: ``(T, B)`` or ``(B, T)``."""
        return (0, 1) if self.time_first(x) else (1, 0)

    def length(self, t: Any) -> int:
        """The number of steps of ``t``."""
        return t.shape[self.time_dim]

    def columns(self, t: Any) -> int:
        """The number of columns (parallel streams) of ``t``.

        Raises:
            ValueError: if ``t`` has a time axis only (shape ``(T,)``), so no batch axis to count.
        """
        if t.dim() < 2:
            raise ValueError(
                f"an input of shape {tuple(t.shape)} has a time axis only, but its number of columns is needed (by "
                "initial_state(batch_size), or a per-column reset); give it a batch axis, e.g. x.unsqueeze(1) for "
                "(T, 1)."
            )
        return t.shape[self.batch_axis(t)]

    def steps(self, t: Any, start: int, end: int) -> Any:
        """Steps ``[start, end)`` of ``t``, a view."""
        # Basic slicing is the cheaper view where time comes first: one call per segment.
        return t[start:end] if self.time_dim == 0 else t.narrow(self.time_dim, start, end - start)
