"""ignite engines whose ``state_dict`` carries the TBPTT stream state, so ignite's ``Checkpoint`` saves it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from ignite.engine import DeterministicEngine, Engine

from . import distributed
from .checkpoint import COMPARED, check_resume, handler_sources, source_type
from .events import COUNTERS

if TYPE_CHECKING:
    from .process import TBPTTProcessFunction

__all__ = ["TBPTTEngine", "DeterministicTBPTTEngine"]


class _SavesStream:
    """Adds the TBPTT state to the engine's state dict, as ``DeterministicEngine`` adds its random states.

    The entry is ``"tbptt"``: :meth:`TBPTTProcessFunction.state_dict`. In a distributed run it also holds every
    process's, in ``"processes"`` (each process's columns carry their own stream), and each process resumes its own.
    """

    def __init__(self, step: TBPTTProcessFunction) -> None:
        super().__init__(step)  # type: ignore[call-arg]
        self.tbptt = step
        step.attach(self)  # type: ignore[arg-type]

    def state_dict(self) -> OrderedDict:
        state = super().state_dict()  # type: ignore[misc]
        tbptt = self.tbptt.state_dict()
        tbptt["configuration"] = {**tbptt["configuration"], "deterministic": self._deterministic}
        if distributed.is_distributed():  # each process's columns have their own stream: rank 0 saves them all
            tbptt["processes"] = distributed.gather_states(tbptt)
        state["tbptt"] = tbptt
        return state

    @property
    def _deterministic(self) -> bool:
        return isinstance(self, DeterministicEngine)

    def load_state_dict(self, state_dict: Mapping) -> None:
        # Refused before anything changes if made with another configuration (ignite_tbptt.engine.checkpoint); a trainer
        # listed first in Checkpoint.load_objects' to_load leaves the model and optimizer untouched then too.
        saved = state_dict.get("tbptt", {}).get("configuration")
        if "tbptt" in state_dict:  # before anything loads: a stream saved by another number of processes
            distributed.own_state(state_dict["tbptt"])
        if saved is not None:
            given = {**self.tbptt.configuration(), "deterministic": self._deterministic}
            length, iteration = state_dict.get("epoch_length"), state_dict.get("iteration", 0)
            epoch_end = iteration == 0 or (length is not None and iteration % length == 0)
            # The windows are compared here, unless they came from a handler's source (AdaptiveTruncation) and this
            # trainer's are not yet of that type: the handler may be attached after loading, so when the run starts.
            saved_type = source_type(saved)
            deferred = saved_type != source_type(given) and saved_type in handler_sources()
            names = tuple(name for name in COMPARED if name != "windows") if deferred else None
            check_resume(saved, given, state_dict["tbptt"], epoch_end, names)
            self.tbptt.resumes_from(saved, epoch_end if deferred else None)
        # A state saved by ignite's create_supervised_tbptt_trainer, or any plain Engine, has no TBPTT counters:
        # they start at 0, and the stream starts fresh at the saved epoch and iteration.
        missing = {name: 0 for name in (*COUNTERS, "targets_seen") if name not in state_dict}
        super().load_state_dict({**state_dict, **missing})  # type: ignore[misc]
        if "tbptt" in state_dict:
            self.tbptt.load_state_dict(distributed.own_state(state_dict["tbptt"]))


class TBPTTEngine(_SavesStream, Engine):
    """The engine of :func:`~ignite_tbptt.create_tbptt_trainer`.

    Args:
        step: the process function; reachable afterwards as ``engine.tbptt``.
    """


class DeterministicTBPTTEngine(_SavesStream, DeterministicEngine):
    """:class:`TBPTTEngine` on ignite's ``DeterministicEngine``: resumable mid-epoch with the same data.

    ``DeterministicEngine`` saves numpy's random state as a numpy array, which ``torch.load(path,
    weights_only=True)`` (PyTorch's default since 2.6, and ignite's ``Checkpoint.load_objects(to_load, path)``)
    refuses: unpickling arbitrary objects can run code. This engine saves that array as a tensor and turns it
    back when loading, so its checkpoints load with ``weights_only=True`` and nothing needs allow-listing.

    ``DeterministicEngine`` restores Python's, numpy's and torch's CPU generators mid-epoch but not CUDA's, so
    dropout on a GPU would draw other masks after a resume. This engine also saves the CUDA generators
    (``"cuda_rng_states"``, one state per device, where CUDA was used) and restores them where ignite restores the
    others: a mid-epoch resume on a GPU trains as the uninterrupted run. In a run of several processes these are
    the states of the process that saves (rank 0), as the other generators are.

    Args:
        step: the process function; reachable afterwards as ``engine.tbptt``.
    """

    _cuda_rng_states: list[torch.Tensor] | None = None

    def state_dict(self) -> OrderedDict:
        """The engine's state with the stream (``"tbptt"``) and the random states as tensors and numbers."""
        state = super().state_dict()
        state["rng_states"] = [_as_tensors(s) for s in state["rng_states"]]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda_rng_states"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Load :meth:`state_dict`'s state (numpy's random state as ignite restores it)."""
        if state_dict.get("rng_states") is not None:
            state_dict = {**state_dict, "rng_states": [_as_numpy(s) for s in state_dict["rng_states"]]}
        super().load_state_dict(state_dict)
        self._cuda_rng_states = state_dict.get("cuda_rng_states")  # once the checkpoint is accepted

    def _setup_engine(self) -> None:
        pending = getattr(self.state, "rng_states", None) is not None
        super()._setup_engine()
        # ignite restores (and then drops) the saved states only when the run resumes mid-epoch; CUDA's follow.
        restored = pending and getattr(self.state, "rng_states", None) is None
        if restored and self._cuda_rng_states is not None and torch.cuda.is_available():
            states = [state.cpu() for state in self._cuda_rng_states[: torch.cuda.device_count()]]
            torch.cuda.init()  # else the states wait in torch's lazy queue, behind the epoch's seed ignite just set
            torch.cuda.set_rng_state_all(states)
        self._cuda_rng_states = None


# numpy's state is ("MT19937", key: uint32 array of 624, pos, has_gauss, cached_gaussian).
def _as_tensors(rng_state: Any) -> Any:
    if isinstance(rng_state, tuple) and rng_state and rng_state[0] == "MT19937" and hasattr(rng_state[1], "dtype"):
        key = torch.from_numpy(rng_state[1].astype("int64"))
        return (rng_state[0], key, *rng_state[2:])
    return rng_state


def _as_numpy(rng_state: Any) -> Any:
    if isinstance(rng_state, tuple) and rng_state and rng_state[0] == "MT19937" and torch.is_tensor(rng_state[1]):
        # .cpu(): a checkpoint loaded with map_location="cuda" brings the key to the GPU.
        return (rng_state[0], rng_state[1].cpu().numpy().astype("uint32"), *rng_state[2:])
    return rng_state
