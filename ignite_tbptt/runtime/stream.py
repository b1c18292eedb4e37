"""The state of the stream a trainer is running along, with its own ``state_dict``."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import hidden as hs
from .backward_sweep import RetainedHistory
from .loss_sum import LossSum

__all__ = ["StreamState"]


@dataclass(eq=False)
class StreamState:
    """Where the trainer is in its stream: position, hidden state, the open window's loss and retained history.

    With ``carry_hidden=True`` it lives through the iterations of an epoch; otherwise every batch starts it
    anew. :meth:`state_dict` saves it as plain tensors and numbers (the history as what rebuilds it), so a
    run resumed from a checkpoint continues the stream exactly. Its windows are the planner's
    (:class:`~ignite_tbptt.planning.StreamPlanner`), which saves them beside it.

    Attributes:
        history: the retained segments.
        position: steps of the stream run so far.
        columns: parallel columns (the batch size) of a carried stream, once known.
        hidden: the hidden state after the last step (``None`` at the stream's start).
        window_loss: the loss of the open window's steps so far, with their target count.
    """

    history: RetainedHistory
    position: int = 0
    columns: int | None = None
    hidden: Any = None
    window_loss: LossSum = field(default_factory=LossSum)

    def reset(self) -> None:
        """Forget the stream: position 0, no hidden state, no retained history, no window loss."""
        self.position, self.columns, self.hidden = 0, None, None
        self.window_loss = LossSum()
        self.history.clear()

    def open_window(self) -> None:
        """A window starts at the current position: its loss starts at zero."""
        self.window_loss = LossSum()

    def check_columns(self, columns: int) -> None:
        """Check that a batch of a carried stream has the stream's ``columns``; the epoch's first batch sets them.

        Raises:
            ValueError: if it has another number of columns than the epoch's first batch.
        """
        if self.columns is not None and columns != self.columns:
            raise ValueError(
                f"with carry_hidden=True the batches of an epoch are pieces of the same {self.columns} parallel "
                f"streams, but this batch has {columns}. Drop the last incomplete batch (stream_batches lays out "
                "equal columns), or use carry_hidden=False."
            )
        self.columns = columns

    def recover(self) -> None:
        """After an optimizer step skipped for inf/NaN: cut the history there, restart a non-finite hidden state."""
        self.history.clear()
        if self.hidden is not None and not all(torch.isfinite(t).all() for t in hs.flatten(self.hidden)):
            self.hidden = None

    def state_dict(self) -> dict[str, Any]:
        """The stream as plain tensors and numbers; the retained graphs as what rebuilds them."""
        return {
            "position": self.position,
            "columns": self.columns,
            "hidden": hs.detached(self.hidden),
            **self.window_loss.state_dict(),
            **self.history.state_dict(),
        }

    def _on_model_device(self, state: dict[str, Any]) -> dict[str, Any]:
        # torch.load leaves a checkpoint where map_location puts it (by default where it was saved): a stream saved on
        # the CPU and resumed on a GPU, or the reverse, goes on where the model now is. Random states go to the host,
        # where torch reads them; a CUDA generator's state is dropped where the model is not on CUDA.
        device = next((p.device for p in self.history.parameters()), None)
        if device is None:
            return state
        move = functools.partial(pytree.tree_map_only, torch.Tensor, lambda t: t.to(device))

        def segment(saved: dict[str, Any]) -> dict[str, Any]:
            cpu, cuda = saved["rng"]
            rng = (cpu.cpu(), cuda.cpu() if cuda is not None and device.type == "cuda" else None)
            return {key: rng if key == "rng" else move(value) for key, value in saved.items()}

        return {key: [segment(s) for s in value] if key == "segments" else move(value) for key, value in state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s stream, rebuilding the retained graphs.

        Call it once the model and the optimizer hold the checkpoint's values.
        """
        self.reset()
        state = self._on_model_device(state)
        self.position, self.hidden = state["position"], state["hidden"]
        self.columns = state["columns"] if "columns" in state else state["streams"]  # "streams" up to 0.3
        self.window_loss.load_state_dict(state)
        self.history.load_state_dict(state)
