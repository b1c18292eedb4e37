"""Windows cut from recordings, each a stream of its own: the data of training with a burn-in, beside carried state.

System identification and forecasting train on windows of ``N`` steps cut from long recordings, shuffled, each
started from a fresh state (Schiller et al., ICLR 2026, whose code takes a window at every step; Forgione and
Piga's dynoNet and deepSI cut likewise). :class:`RecordingWindows` is such a set of windows for a ``DataLoader``,
which shuffles and batches them as it does any dataset; with ``carry_hidden=False`` (the default) and
``burn_in=m`` the trainer warms each window's state up for ``m`` steps before its loss counts
(docs/howto/burn-in.md). :func:`recording_columns` lays the same recordings out the other way, for carried state:
each cut into contiguous columns that the trainer walks in order with ``carry_hidden=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from ..checks import positive_int

__all__ = ["RecordingWindows", "recording_columns"]


class RecordingWindows(Dataset):
    """Windows of ``length`` steps cut from recordings ``(x, y)``, for a ``DataLoader`` to shuffle and batch.

    Each item is ``(x, y)`` of shapes ``(N, *F)`` and ``(N, *G)``, ``N = length``, steps along dimension 0 as the
    recordings give them. A ``DataLoader`` stacks ``B`` of them batch first, ``(B, N, *)``, which the trainer reads
    with ``time_dim=1`` and a batch-first model; ``collate_fn=RecordingWindows.collate`` stacks them time first,
    ``(N, B, *)``, the trainer's default ``time_dim=0`` and what ``nn.LSTM`` takes by default. Windows start every
    ``stride`` steps of every recording long enough (``stride=1``: at every step, as Schiller et al.'s code cuts
    them), or, with ``count``, at ``count`` places drawn afresh each epoch (:meth:`set_epoch`) from ``seed``,
    uniformly over all the places a window fits. Shuffling and batching are the ``DataLoader``'s (``shuffle=True``
    with a seeded ``generator``); resuming inside an epoch is a resumable loader's (torchdata's
    ``StatefulDataLoader``), the places of an epoch depending on its number only.

    Args:
        recordings: pairs ``(x, y)`` with the same number of steps along dimension 0; shorter than ``length``
            ones give no window.
        length: steps per window ``N``.
        stride: steps between the starts of consecutive windows of a recording (without ``count``).
        count: windows per epoch at random places instead of every ``stride`` steps.
        seed: the seed of the places (with ``count``); epoch ``e`` draws from ``seed + e``.

    Raises:
        TypeError: if a recording is not a pair of tensors, or ``length``, ``stride`` or ``count`` is not an int.
        ValueError: if ``length``, ``stride`` or ``count`` is not positive, a recording's ``x`` and ``y`` differ in
            steps, or no recording is as long as ``length``.

    Examples:
        >>> x = torch.arange(10.0).unsqueeze(1)  # one recording of 10 steps, 1 feature
        >>> windows = RecordingWindows([(x, 2 * x)], length=4, stride=3)
        >>> len(windows), windows[1][0].flatten().tolist()
        (3, [3.0, 4.0, 5.0, 6.0])
    """

    def __init__(
        self,
        recordings: Sequence[tuple[torch.Tensor, torch.Tensor]],
        length: int,
        *,
        stride: int = 1,
        count: int | None = None,
        seed: int = 0,
    ) -> None:
        self.length = positive_int("length", length, "steps per window")
        self.stride = positive_int("stride", stride, "steps between window starts")
        self.count = None if count is None else positive_int("count", count, "windows per epoch")
        self.recordings = [_checked(recording, i) for i, recording in enumerate(recordings)]
        # The places a window fits: (recording, first step), every stride steps.
        fits = [max(0, x.shape[0] - self.length + 1) for x, _ in self.recordings]
        if not any(fits):
            longest = max((x.shape[0] for x, _ in self.recordings), default=0)
            raise ValueError(
                f"no recording is {self.length} steps long (the longest has {longest}): pass a smaller length."
            )
        self._fits = torch.tensor(fits)
        self.seed, self.epoch = seed, 0
        self._places = self._draw()

    def set_epoch(self, epoch: int) -> None:
        """Draw the places of epoch ``epoch`` (with ``count``; call it as each epoch starts)."""
        self.epoch = epoch
        self._places = self._draw()

    def _draw(self) -> torch.Tensor:
        # (windows, 2): each window's recording and first step.
        if self.count is None:
            places = [(r, t) for r, fit in enumerate(self._fits.tolist()) for t in range(0, fit, self.stride)]
            return torch.tensor(places)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        # Uniform over all the places a window fits: a place of the concatenated list, then its recording.
        flat = torch.randint(int(self._fits.sum()), (self.count,), generator=generator)
        ends = self._fits.cumsum(0)
        recording = torch.searchsorted(ends, flat, right=True)
        return torch.stack([recording, flat - (ends - self._fits)[recording]], 1)

    @staticmethod
    def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``B`` windows stacked time first: ``(x, y)`` of shapes ``(N, B, *F)`` and ``(N, B, *G)``."""
        xs, ys = zip(*items)
        return torch.stack(xs, 1), torch.stack(ys, 1)

    def __len__(self) -> int:
        return self._places.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        recording, start = self._places[index].tolist()
        x, y = self.recordings[recording]
        return x[start : start + self.length], y[start : start + self.length]


def recording_columns(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, length: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One recording as ``batch_size`` contiguous columns cut into consecutive batches, for carried state.

    :func:`~ignite_tbptt.data.stream_batches` for a recording of features and targets: the recording is split into
    ``batch_size`` contiguous parts read side by side, so that batch ``i + 1`` continues batch ``i`` column by
    column (``create_tbptt_trainer(..., carry_hidden=True)``); steps that do not fill a whole column are dropped.

    Args:
        x: features ``(T, *F)``.
        y: targets ``(T, *G)``, as many steps.
        batch_size: columns ``B``.
        length: steps per batch; the last may be shorter.

    Returns:
        A list of ``(x, y)`` of shapes ``(length, B, *F)`` and ``(length, B, *G)``, time first (views).

    Raises:
        ValueError: if ``x`` and ``y`` differ in steps, or the recording has fewer steps than ``batch_size``.
    """
    batch_size = positive_int("batch_size", batch_size, "columns")
    length = positive_int("length", length, "steps per batch")
    x, y = _checked((x, y), 0)
    steps = x.shape[0] // batch_size
    if steps < 1:
        raise ValueError(f"a recording of {x.shape[0]} steps cannot fill {batch_size} columns: pass fewer.")

    def columns(t: torch.Tensor) -> torch.Tensor:  # (steps, B, *)
        return t[: steps * batch_size].reshape(batch_size, steps, *t.shape[1:]).transpose(0, 1)

    cx, cy = columns(x), columns(y)
    return [(cx[i : i + length], cy[i : i + length]) for i in range(0, steps, length)]


def _checked(recording: Any, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    # A pair of tensors with as many steps along dimension 0, or the error naming the recording.
    if not (isinstance(recording, (tuple, list)) and len(recording) == 2):
        raise TypeError(f"recording {index} must be a pair (x, y) of tensors, got {type(recording).__name__}.")
    x, y = recording
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        raise TypeError(f"recording {index} must be a pair (x, y) of tensors, got ({type(x).__name__}, ...).")
    if x.dim() == 0 or y.dim() == 0 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"recording {index}: x and y must have as many steps along dimension 0, got shapes {tuple(x.shape)} "
            f"and {tuple(y.shape)}."
        )
    return x, y
