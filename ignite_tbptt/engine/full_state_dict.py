"""Checkpoints of a model sharded by FSDP2, through ignite's ``Checkpoint``: the full state dicts.

ignite's ``Checkpoint`` asks every process for ``state_dict()`` and rank 0 writes the file. A sharded model's own
``state_dict()`` holds only this process's shards, so the file would miss the others. :class:`FullStateDict` gives
``Checkpoint`` the model's (or the optimizer's) *full* state dict instead, gathered on every process by
``torch.distributed.checkpoint.state_dict`` (a collective, which ``Checkpoint`` calls on every process alike), and
loads one back into the shards. The trainer's own state needs nothing: each process's stream, accumulated gradients
and retained weights travel in its entry of the engine's state dict.

Source: PyTorch's "Distributed Checkpoint" documentation, ``get_model_state_dict`` / ``set_model_state_dict`` with
``StateDictOptions(full_state_dict=True)``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["FullStateDict"]


class FullStateDict:
    """A sharded model, or its optimizer, saved and loaded by ignite's ``Checkpoint`` as its full state dict.

    Args:
        model: the model, sharded by ``fully_shard`` (or not: then its usual state dict).
        optimizer: the optimizer of ``model``'s parameters, to save it rather than the model.

    Examples:
        .. code-block:: python

            to_save = {
                "trainer": trainer,
                "model": FullStateDict(model),
                "optimizer": FullStateDict(model, optimizer),
            }
            trainer.add_event_handler(Events.ITERATION_COMPLETED(every=100), Checkpoint(to_save, DiskSaver(folder)))
            # and to resume, on every process:
            Checkpoint.load_objects(to_save, load_checkpoint(path))
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        """The full state dict, gathered to rank 0's CPU (call it on every process; the others get an empty dict).

        Take it after the first optimizer step: before it, ``get_optimizer_state_dict`` creates the optimizer's state
        with a step at learning rate 0, which Adam counts in its bias correction.
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        if self.optimizer is None:
            return get_model_state_dict(self.model, options=options)
        return get_optimizer_state_dict(self.model, self.optimizer, options=options)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full state dict into this process's shards (call it on every process, each with the whole dict)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        if self.optimizer is None:
            set_model_state_dict(self.model, state_dict, options=options)
        else:
            set_optimizer_state_dict(self.model, self.optimizer, state_dict, options=options)
