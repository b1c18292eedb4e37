"""Gradient synchronisation across processes, once per optimizer step, through ``ignite.distributed``.

PyTorch's ``DistributedDataParallel`` cannot serve the TBPTT backward sweep: its reducer all-reduces from
hooks fired during *each* backward call and expects one backward pass per forward pass of the same
iteration, while a window calls backward once per retained segment, on graphs of earlier forward passes
(with k2 > k1 some from before the last optimizer step). So the trainer keeps the model unwrapped and sums
the accumulated gradients and target counts of all processes at the optimizer step instead: one collective
for the gradients (per dtype and device) and one for the target count, however many windows and segments
the step covers. Dividing the summed gradient by the summed count gives exactly the gradient of
single-process training on the whole batch.

Every process must do the same work: the same batches per epoch, so the same windows and optimizer steps. Where
they do not (a user's own uneven shards), one would wait in a collective another never makes, or pair it with a
different one. So the target counts travel in a record of where each process is (its epoch length, epoch,
iteration, window, optimizer step), gathered from all at every optimizer step and at every epoch's end: where the
records differ, every process raises at once an error that names them, instead of hanging.
"""

from __future__ import annotations

import ignite.distributed as idist
import torch

from ..runtime import is_sharded

__all__ = [
    "is_distributed",
    "broadcast_parameters",
    "all_reduce_gradients",
    "synchronise",
    "ProcessesDisagree",
    "all_start_steps",
    "check_same_batch",
    "gather_states",
    "own_state",
]


def is_distributed() -> bool:
    """Whether this process is one of several in an ``ignite.distributed`` group."""
    return idist.get_world_size() > 1


@torch.no_grad()
def broadcast_parameters(parameters: list[torch.Tensor]) -> None:
    """Give every process rank 0's parameters, so that all start from the same weights.

    Parameters sharded by FSDP2 are left alone: each shard lives on one process, so they are one tensor already.
    """
    for p in parameters:
        if not is_sharded(p):
            p.copy_(_tensor(idist.broadcast(p.detach(), src=0)))


def _tensor(result: object) -> torch.Tensor:
    # ignite.distributed annotates each collective with the union of the types it takes; a tensor in gives a tensor.
    assert isinstance(result, torch.Tensor)
    return result


class ProcessesDisagree(RuntimeError):
    """The processes of a distributed run are at different points of their work: their data differs in length."""


#: What a process reports at a synchronisation: (kind, epoch length or -1 if unknown, epoch, iteration, window,
#: optimizer step). Kinds: an optimizer step, or an epoch's end.
STEP, EPOCH_END = 0, 1


def synchronise(position: tuple[int, ...], targets: int, device: torch.device) -> int:
    """Check that every process is at ``position`` and sum their target counts: one collective, one read.

    Args:
        position: ``(kind, epoch_length, epoch, iteration, window, optimizer_step)`` of this process, with
            ``epoch_length`` -1 while unknown.
        targets: this process's target count.
        device: where the collective runs (the parameters' device).

    Returns:
        The target count summed over all processes.

    Raises:
        ProcessesDisagree: on every process, if any reports another position; naming each process's.
    """
    record = torch.tensor([*position, targets], dtype=torch.int64, device=device)
    gathered = _tensor(idist.all_gather(record)).view(-1, record.numel()).tolist()
    if any(row[:-1] != gathered[0][:-1] for row in gathered):
        raise ProcessesDisagree(_disagreement(gathered))
    return sum(row[-1] for row in gathered)


def _disagreement(rows: list[list[int]]) -> str:
    lengths = [row[1] for row in rows]
    if all(n >= 0 for n in lengths) and len(set(lengths)) > 1:
        counts = ", ".join(f"rank {r} runs {n}" for r, n in enumerate(lengths))
        what = f"the processes run different numbers of batches per epoch: {counts}"
    else:
        where = ", ".join(f"rank {r} at {_shown(row)}" for r, row in enumerate(rows))
        what = f"the processes are at different points of the epoch: {where}"
    return (
        f"{what}. Every process must run the same batches per epoch (the same windows and optimizer steps): give each "
        "its share with pack_sequences, pack_recordings or stream_batches, which shard their columns so that every "
        "process gets as many batches, or make your shards' counts equal (pad with batches of padding only)."
    )


def _shown(row: list[int]) -> str:
    kind, _, epoch, iteration, window, step = row[:-1]
    if kind == EPOCH_END:
        return f"the end of epoch {epoch} (iteration {iteration})"
    return f"optimizer step {step} (epoch {epoch}, iteration {iteration}, window {window})"


def check_same_batch(length: int, has_starts: bool, device: torch.device) -> bool:
    """Check that every process's batch has ``length`` steps: one small collective.

    A model sharded by FSDP2 gathers its weights in every model call, so processes whose batches differ in length
    would make different calls, each waiting in a collective the others never reach.

    Returns:
        Whether any process's batch marks sequence starts (then all take part in :func:`all_start_steps`).

    Raises:
        ProcessesDisagree: on every process, if the lengths differ; naming each process's.
    """
    record = torch.tensor([length, int(has_starts)], dtype=torch.int64, device=device)
    rows = _tensor(idist.all_gather(record)).view(-1, 2).tolist()
    if any(row[0] != rows[0][0] for row in rows):
        lengths = ", ".join(f"rank {r} has {row[0]}" for r, row in enumerate(rows))
        raise ProcessesDisagree(
            f"the processes' batches differ in length ({lengths} steps), and a model sharded by FSDP2 needs every "
            "process to make the same model calls: give every process batches of the same lengths (e.g. "
            "stream_batches or pack_sequences with the same length and drop_last=True on each)."
        )
    return any(row[1] for row in rows)


def all_start_steps(steps: list[int], length: int, device: torch.device) -> list[int]:
    """The steps of a batch of ``length`` steps where some column of *any* process starts a sequence: one collective.

    A model sharded by FSDP2 gathers its weights in every model call, so every process must make the same calls:
    a segment ends where a sequence starts on any process, not only on this one.
    """
    marks = torch.zeros(length, dtype=torch.int32, device=device)
    marks[steps] = 1
    return torch.nonzero(_tensor(idist.all_reduce(marks, op="MAX"))).flatten().tolist()


@torch.no_grad()
def all_reduce_gradients(parameters: list[torch.Tensor]) -> None:
    """Sum the parameters' gradients over all processes, in place: one collective per dtype and device.

    A parameter without a gradient on this process counts as zeros, so that every process reduces
    buffers of the same layout. Parameters sharded by FSDP2 are left alone: their gradients were reduce-scattered
    as sums in FSDP2's post-backward hooks (:func:`~ignite_tbptt.runtime.sharded.reduce_gradients_by_sum`).
    """
    parameters = [p for p in parameters if not is_sharded(p)]
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for p in parameters:
        grad = p.grad
        if grad is None:
            grad = p.grad = torch.zeros_like(p)
        groups.setdefault((grad.dtype, grad.device), []).append(grad)
    for grads in groups.values():
        flat = _tensor(idist.all_reduce(torch.cat([g.reshape(-1) for g in grads])))
        torch._foreach_copy_(grads, [t.view_as(g) for t, g in zip(flat.split([g.numel() for g in grads]), grads)])


def gather_states(state: dict) -> list[dict]:
    """Every process's ``state`` (its stream: its columns' hidden state, history and gradients), in rank order.

    A collective: every process calls it where it saves (ignite's ``Checkpoint`` asks every process for its
    ``state_dict``, and rank 0 writes it).
    """
    states: list = [None] * idist.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return states


def own_state(state: dict) -> dict:
    """This process's part of a trainer's saved ``state``, checked against the number of processes.

    Raises:
        ValueError: if a stream under way was saved by another number of processes than there are now.
    """
    processes, world = state.get("processes"), idist.get_world_size()
    saved = 1 if processes is None else len(processes)
    under_way = any(s.get("position", 0) > 0 for s in (processes or [state]))
    if saved != world and under_way:
        raise ValueError(
            f"the checkpoint holds the streams of {saved} process{'es' if saved > 1 else ''}, taken mid-epoch, and "
            f"{world} are resuming it: each process's columns carry their own hidden state and history. Resume with "
            f"{saved} process{'es' if saved > 1 else ''}, or from a checkpoint taken at an epoch's end."
        )
    return state if processes is None or saved != world else processes[idist.get_rank()]
