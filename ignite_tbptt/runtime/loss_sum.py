"""The loss of a window or an iteration over its segments, added up on the device only when it is read."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LossSum"]


class LossSum:
    """Summed per-target loss over segments, with their target count.

    Each segment's loss arrives as a detached 0-dim tensor: its sum over its targets or, for a window of one
    segment, its mean. Nothing runs on the device until :meth:`mean` is read, and then one stack and one sum
    however many segments there were; a single mean is returned as it is, without a division.
    """

    __slots__ = ("losses", "weights", "targets")

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.weights: list[int] = []  # 1 for a sum, the target count for a mean
        self.targets = 0

    def add(self, loss: Any, targets: int, mean: bool = False) -> None:
        """Add a segment's loss over ``targets`` targets, their ``mean`` or their sum (nothing without targets)."""
        if targets:
            self.losses.append(loss)
            self.weights.append(targets if mean else 1)
            self.targets += targets

    @property
    def divisor(self) -> int:
        """What divides :meth:`total` into the mean per-target loss: 1 for a single mean, else the target count."""
        return 1 if len(self.losses) == 1 and self.weights[0] == self.targets else self.targets

    def total(self) -> Any:
        """The summed per-target loss, a 0-dim tensor (0.0 without targets)."""
        if not self.losses:
            return 0.0
        if len(self.losses) == 1:
            loss, weight = self.losses[0], self.weights[0]
            return loss if weight == 1 else loss * weight
        stacked = torch.stack(self.losses)
        if any(weight != 1 for weight in self.weights):
            stacked = stacked * torch.tensor(self.weights, dtype=stacked.dtype).to(stacked.device, non_blocking=True)
        return stacked.sum()

    def mean(self) -> torch.Tensor:
        """The mean per-target loss, a 0-dim tensor.

        Without targets (a window or a batch of padding only) it is 0.0: nothing was learned, and padding must not
        read as a failed step to ignite's ``TerminateOnNan``, which a NaN would.
        """
        if not self.targets:
            return torch.tensor(0.0)
        return self.losses[0] if self.divisor == 1 else self.total() / self.targets

    def state_dict(self) -> dict[str, Any]:
        """The sum and the target count, as the stream's checkpoint keeps them."""
        return {"window_loss": self.total(), "window_targets": self.targets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s sum and target count."""
        self.losses, self.weights, self.targets = [], [], state["window_targets"]
        if self.targets:
            self.losses, self.weights = [state["window_loss"]], [1]
