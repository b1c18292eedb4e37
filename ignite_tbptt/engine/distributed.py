"""Gradient synchronisation across processes, once per optimizer step, through ``ignite.distributed``.

PyTorch's ``DistributedDataParallel`` cannot serve the TBPTT backward sweep: its reducer all-reduces from
hooks fired during *each* backward call and expects one backward pass per forward pass of the same
iteration, while a window calls backward once per retained segment, on graphs of earlier forward passes
(with k2 > k1 some from before the last optimizer step). So the trainer keeps the model unwrapped and sums
the accumulated gradients and target counts of all processes at the optimizer step instead: one collective
for the gradients (per dtype and device) and one for the target count, however many windows and segments
the step covers. Dividing the summed gradient by the summed count gives exactly the gradient of
single-process training on the whole batch.
"""

from __future__ import annotations

import ignite.distributed as idist
import torch

__all__ = ["is_distributed", "broadcast_parameters", "all_reduce_gradients"]


def is_distributed() -> bool:
    """Whether this process is one of several in an ``ignite.distributed`` group."""
    return idist.get_world_size() > 1


@torch.no_grad()
def broadcast_parameters(parameters: list[torch.Tensor]) -> None:
    """Give every process rank 0's parameters, so that all start from the same weights."""
    for p in parameters:
        p.copy_(idist.broadcast(p.detach(), src=0))


@torch.no_grad()
def all_reduce_gradients(parameters: list[torch.Tensor], targets: int) -> int:
    """Sum the parameters' gradients and the target count over all processes, in place.

    A parameter without a gradient on this process counts as zeros, so that every process reduces
    buffers of the same layout.

    Returns:
        The target count summed over all processes.
    """
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for p in parameters:
        groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for grads in groups.values():
        flat = idist.all_reduce(torch.cat([g.reshape(-1) for g in grads]))
        torch._foreach_copy_(grads, [t.view_as(g) for t, g in zip(flat.split([g.numel() for g in grads]), grads)])
    device = parameters[0].device if parameters else torch.device("cpu")
    return int(idist.all_reduce(torch.tensor(targets, dtype=torch.int64, device=device)).item())
