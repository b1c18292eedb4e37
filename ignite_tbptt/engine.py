"""ignite engines whose ``state_dict`` carries the TBPTT stream state, so ignite's ``Checkpoint`` saves it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ignite.engine import DeterministicEngine, Engine

from .events import COUNTERS

if TYPE_CHECKING:
    from .process import TBPTTStep

__all__ = ["TBPTTEngine", "DeterministicTBPTTEngine"]


class _StreamState:
    """Adds the stream state to the engine's state dict, as ``DeterministicEngine`` adds its random states.

    The entry is ``"tbptt"``: :meth:`TBPTTStep.state_dict`.
    """

    def __init__(self, step: TBPTTStep) -> None:
        super().__init__(step)  # type: ignore[call-arg]
        self.tbptt = step
        step.attach(self)  # type: ignore[arg-type]

    def state_dict(self) -> OrderedDict:
        state = super().state_dict()  # type: ignore[misc]
        state["tbptt"] = self.tbptt.state_dict()
        return state

    def load_state_dict(self, state_dict: Mapping) -> None:
        # A state saved by ignite's create_supervised_tbptt_trainer, or any plain Engine, has no TBPTT counters:
        # they start at 0, and the stream starts fresh at the saved epoch and iteration.
        missing = {name: 0 for name in (*COUNTERS, "targets_seen") if name not in state_dict}
        super().load_state_dict({**state_dict, **missing})  # type: ignore[misc]
        if "tbptt" in state_dict:
            self.tbptt.load_state_dict(state_dict["tbptt"])


class TBPTTEngine(_StreamState, Engine):
    """The engine of :func:`~ignite_tbptt.create_tbptt_trainer`.

    Args:
        step: the process function; reachable afterwards as ``engine.tbptt``.
    """


class DeterministicTBPTTEngine(_StreamState, DeterministicEngine):
    """:class:`TBPTTEngine` on ignite's ``DeterministicEngine``: resumable mid-epoch with the same data.

    Args:
        step: the process function; reachable afterwards as ``engine.tbptt``.
    """
