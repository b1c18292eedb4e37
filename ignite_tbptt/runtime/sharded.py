"""Parameters sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``), as the trainer needs to see them.

FSDP2 replaces each parameter of a sharded module with a ``DTensor`` holding this process's shard, all-gathers the
unsharded parameter before the module's forward pass and again before its backward pass, frees it after each
(``reshard_after_forward``), and reduce-scatters the gradients in its post-backward hooks. Three things follow for
a TBPTT trainer:

- The gradients arrive reduced: the trainer's own reduction leaves sharded parameters alone, and every sharded
  module must reduce *sums* (``set_gradient_divide_factor(1.0)``), not FSDP2's default mean over processes, so that
  the trainer's division by the target count of all processes gives single-process training on the whole batch.
  Setting it on the root module alone leaves the inner modules averaging, which is what made sharded training
  differ from one process by 0.012 after one epoch.
- Nothing is broadcast: each shard lives on one process, so a sharded parameter is one tensor already. (Every
  process must build the model alike before ``fully_shard``, the same seed, as FSDP2 asks: each keeps its own
  initial values of its shard.)
- A graph saves the *unsharded* parameter, whose storage FSDP2 frees after the forward pass and fills again with the
  current weights before the backward pass. A segment retained across an optimizer step (k2 > k1) must be
  backpropagated with the weights it ran with: :class:`~ignite_tbptt.runtime.ParameterVersions` recognises the
  unsharded storages (:func:`unsharded_storages`, by storage object, which survives the freeing) and keeps each
  version's *shard* (1 / world size of the weights), gathered again when a retained segment first needs it.

Source: PyTorch's FSDP2 documentation (``torch.distributed.fsdp.fully_shard``, ``FSDPModule``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["is_sharded", "fsdp_modules", "reduce_gradients_by_sum", "unsharded_storages", "gathered"]


def is_sharded(t: Any) -> TypeGuard[DTensor]:
    """Whether ``t`` is a ``DTensor`` (a parameter FSDP2 sharded)."""
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(t, dtensor)


def fsdp_modules(model: torch.nn.Module) -> list[Any]:
    """The modules of ``model`` that ``fully_shard`` wrapped (``FSDPModule``), outermost first."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def reduce_gradients_by_sum(model: torch.nn.Module, backend: str | None = None) -> None:
    """Have every sharded module of ``model`` reduce-scatter gradient sums rather than means over processes.

    For float32 and bfloat16 gradients FSDP2 reduces with NCCL's pre-multiplied sum, which gloo lacks: on a gloo
    ``backend`` it is told to reduce with plain sums (``set_force_sum_reduction_for_comms``).
    """
    for module in fsdp_modules(model):
        module.set_gradient_divide_factor(1.0)
        if backend == "gloo" and hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)


def unsharded_storages(model: torch.nn.Module, trained: set[int]) -> dict[int, Any]:
    """The FSDP2 parameters of ``model`` by the storage object of their unsharded tensor, once FSDP2 made it.

    Only those whose sharded parameter's ``id`` is in ``trained`` (the optimizer's): the others never change, and
    their versions keep no shard.

    The storage object (``UntypedStorage._cdata``) stays the same while FSDP2 frees and refills its memory, so a
    tensor a graph saved during the forward pass is recognised by it whether or not the memory is there now.
    """
    found = {}
    for module in fsdp_modules(model):
        group = module._get_fsdp_state()._fsdp_param_group
        for fsdp_param in group.fsdp_params if group is not None else ():
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None and id(fsdp_param.sharded_param) in trained:
                found[unsharded.untyped_storage()._cdata] = fsdp_param
    return found


def gathered(shard: torch.Tensor, like: DTensor) -> torch.Tensor:
    """The unsharded tensor of ``shard``, this process's piece of the sharded parameter ``like``: one all-gather."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        shard, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
    ).full_tensor()


@functools.lru_cache(maxsize=1)
def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor
