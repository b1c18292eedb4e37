"""``create_tbptt_trainer``: an ignite ``Engine`` that trains with generalised TBPTT(k1, k2)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from ignite.engine import Engine

from ..checks import callable_or_none, positive_int
from ..data.batch import prepare_batch as default_prepare_batch
from ..layout import Layout
from ..planning import Schedule, WindowSource
from ..runtime import (
    Execution,
    StepPrograms,
    build_model_call,
    default_model_fn,
    default_reset_hidden,
    device_type_of,
    refuse_own_dropout_state,
)
from .engine import DeterministicTBPTTEngine, TBPTTEngine
from .optimizer_step import OptimizerStep
from .process import TBPTTStep

__all__ = ["create_tbptt_trainer", "tbptt_training_step"]


def tbptt_training_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    k1: int | WindowSource,
    k2: int | None = None,
    *,
    time_dim: int = 0,
    carry_hidden: bool = False,
    gradient_accumulation_steps: int = 1,
    scaler: bool | torch.amp.GradScaler = False,
    autocast_dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    non_blocking: bool = False,
    prepare_batch: Callable = default_prepare_batch,
    model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]] = default_model_fn,
    output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] | None = None,
    target_count_fn: Callable[[Any, Any], int] | None = None,
    recompute: int | None = None,
    reset_hidden: Callable[[Any, torch.Tensor], Any] = default_reset_hidden,
    module_state: Sequence[str] | None = None,
    initial_state: Callable[[int], Any] | None = None,
    cuda_graphs: bool | str = False,
) -> TBPTTStep:
    """Factory of the TBPTT(k1, k2) process function; :func:`create_tbptt_trainer` documents the arguments.

    As ignite's ``supervised_training_step``, the result is a process function: ``Engine(step)`` runs it, and
    it registers :class:`~ignite_tbptt.TBPTTEvents`, its counters and the handlers that start and end streams
    and epochs on that engine at its first iteration (``step.attach(engine)`` does it before the run, so that
    handlers can be attached to its events first). Only :func:`create_tbptt_trainer`'s engine saves the
    stream in its ``state_dict()``, which resuming mid-epoch needs.

    Raises:
        TypeError, ValueError: as :func:`create_tbptt_trainer`.

    Examples:
        >>> import torch
        >>> from ignite.engine import Engine
        >>> from ignite_tbptt import TBPTTEvents, tbptt_training_step
        >>> model = torch.nn.RNN(1, 1)  # y_pred, hidden = model(x, hidden)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> step = tbptt_training_step(model, optimizer, torch.nn.functional.mse_loss, k1=2, k2=3)
        >>> trainer = Engine(step)
        >>> x = torch.randn(6, 1, 1)  # (T, B, 1)
        >>> trainer.run([(x, x)]).window
        3
    """
    _check_model(model, optimizer, loss_fn)
    source = _source(k1, k2)
    layout = Layout.of(time_dim)
    _check_options(autocast_dtype, prepare_batch, model_fn, output_transform, target_count_fn, reset_hidden)
    accumulation = positive_int("gradient_accumulation_steps", gradient_accumulation_steps)
    device_type = device_type_of(model, device)
    execution = _execution(cuda_graphs, device_type)
    recompute = _recompute(recompute, model, device_type, execution)
    optimizer_step = _optimizer_step(optimizer, _scaler(scaler, device_type, autocast_dtype), accumulation, execution)
    model_call = build_model_call(
        model,
        model_fn,
        device=device,
        autocast_dtype=autocast_dtype,
        reset_hidden=reset_hidden,
        module_state=module_state,
        initial_state=initial_state,
        layout=layout,
        cache_casts=execution is Execution.EAGER,
    )
    return TBPTTStep(
        model,
        loss_fn,
        source,
        model_call=model_call,
        optimizer_step=optimizer_step,
        layout=layout,
        carry_hidden=bool(carry_hidden),
        device=device,
        non_blocking=non_blocking,
        prepare_batch=prepare_batch,
        output_transform=output_transform,
        target_count_fn=target_count_fn,
        recompute=recompute,
        execution=execution,
    )


def _optimizer_step(optimizer: Any, scaler: Any, accumulation: int, execution: Execution) -> OptimizerStep:
    # With window programs, the optimizer step runs as a program too where it can.
    programs = None
    if execution is not Execution.EAGER:
        programs = StepPrograms(optimizer, scaler, execution.graph_capture())
    return OptimizerStep(optimizer, scaler, accumulation, programs)


def _execution(cuda_graphs: Any, device_type: str) -> Execution:
    # The one decision of how windows run; which windows a program may run is the plans' (SegmentPlan.replayable),
    # and whether the window source allows programs, the stream loop's as the source is installed.
    if cuda_graphs is False or cuda_graphs is None:
        return Execution.EAGER
    if cuda_graphs is True:
        if device_type != "cuda":
            raise ValueError(
                f"cuda_graphs=True captures windows in CUDA graphs, but the model is on {device_type!r}: move it to a "
                "CUDA device (model.to('cuda'), or device='cuda'), pass cuda_graphs='replayed' to check the "
                "programs under capture's rules on this device, 'uncaptured' to run them without capture, or "
                "cuda_graphs=False."
            )
        execution = Execution.CUDA_GRAPHS
    elif cuda_graphs == "uncaptured":
        execution = Execution.PROGRAMS
    elif cuda_graphs == "replayed":
        execution = Execution.REPLAYED
    else:
        raise ValueError(f"cuda_graphs must be True, False, 'uncaptured' or 'replayed', got {cuda_graphs!r}.")
    return execution


def _recompute(recompute: Any, model: torch.nn.Module, device_type: str, execution: Execution) -> int | None:
    if recompute is None:
        return None
    recompute = positive_int("recompute", recompute, "steps per rebuilt segment")
    if device_type == "cuda" and execution is Execution.EAGER:  # programs check it as they first run
        refuse_own_dropout_state(model, "recompute", "recompute=None")
    return recompute


def _source(k1: int | WindowSource, k2: int | None) -> WindowSource:
    if isinstance(k1, WindowSource):
        if not k1.standalone:
            name = type(k1).__name__
            raise TypeError(f"{name} is a handler: pass k1 here, then {name}(...).attach(trainer).")
        if k2 is not None:
            raise ValueError("k2 belongs to the window source passed as k1: pass it there, e.g. RandomWindows(k1, k2).")
        return k1
    return Schedule(positive_int("k1", k1), k1 if k2 is None else positive_int("k2", k2))


def _check_options(
    autocast_dtype: Any,
    prepare_batch: Any,
    model_fn: Any,
    output_transform: Any,
    target_count_fn: Any,
    reset_hidden: Any,
) -> None:
    for name, fn in (
        ("prepare_batch", prepare_batch),
        ("model_fn", model_fn),
        ("output_transform", output_transform),
        ("target_count_fn", target_count_fn),
        ("reset_hidden", reset_hidden),
    ):
        callable_or_none(name, fn)
    if autocast_dtype is not None and not isinstance(autocast_dtype, torch.dtype):
        raise TypeError(f"autocast_dtype must be a torch.dtype such as torch.bfloat16, got {autocast_dtype!r}.")


def _check_model(model: Any, optimizer: Any, loss_fn: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    # As ignite, any object the trainer can use: a torch.optim.Optimizer, a wrapper, a third-party optimizer.
    missing = [name for name in ("param_groups", "zero_grad", "step") if not hasattr(optimizer, name)]
    if missing:
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer or have param_groups, zero_grad() and step(); "
            f"{type(optimizer).__name__} has no {', '.join(missing)}."
        )
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}.")
    model_params = {id(p) for p in model.parameters()}
    if not any(id(p) in model_params for group in optimizer.param_groups for p in group["params"]):
        raise ValueError("optimizer holds none of model's parameters; build it from model.parameters().")


def _scaler(
    scaler: bool | torch.amp.GradScaler | None, device_type: str, autocast_dtype: torch.dtype | None
) -> torch.amp.GradScaler | None:
    if scaler is True:
        scaler = torch.amp.GradScaler(device_type)
    elif scaler is False or scaler is None:
        return None
    elif not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler or a bool, got {type(scaler).__name__}.")
    if autocast_dtype is not None and autocast_dtype != torch.float16:
        warnings.warn(
            f"a GradScaler is only needed with float16; autocast_dtype={autocast_dtype} keeps float32's range. "
            "Pass scaler=False.",
            stacklevel=4,
        )
    return scaler


def create_tbptt_trainer(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    k1: int | WindowSource,
    k2: int | None = None,
    *,
    time_dim: int = 0,
    carry_hidden: bool = False,
    gradient_accumulation_steps: int = 1,
    scaler: bool | torch.amp.GradScaler = False,
    autocast_dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    non_blocking: bool = False,
    prepare_batch: Callable = default_prepare_batch,
    model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]] = default_model_fn,
    output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] | None = None,
    target_count_fn: Callable[[Any, Any], int] | None = None,
    recompute: int | None = None,
    reset_hidden: Callable[[Any, torch.Tensor], Any] = default_reset_hidden,
    module_state: Sequence[str] | None = None,
    initial_state: Callable[[int], Any] | None = None,
    cuda_graphs: bool | str = False,
    deterministic: bool = False,
) -> Engine:
    """Create an ignite trainer that runs truncated backpropagation through time, TBPTT(k1, k2).

    Every ``k1`` steps of a stream, and at its end, the trainer backpropagates the losses of the steps since
    the last backward pass through (up to) ``k2`` steps back: Williams & Peng (1990), BPTT(h; h') with
    h' = k1 and h = k2; Sutskever (2013), PhD thesis, section 2.8.6. ``k1 = k2`` is the common truncated BPTT
    of ignite's ``create_supervised_tbptt_trainer``; ``k2 > k1`` lets every step's loss reach at least
    ``k2 - k1`` steps back; ``k2 < k1`` backpropagates only the window's last ``k2`` steps through time, the
    steps before that getting the gradient of their own loss (as DL4J's ``tbpttBackLength``).

    The losses of all steps in a window count (per-token losses, not just the last step's). A segment of
    the batch with ``n`` targets contributes ``n * loss_fn(y_pred, y)`` (``loss_fn`` reducing by mean, as
    PyTorch's losses do), and an optimizer step divides the summed gradient of its windows by their total
    target count: the exact gradient of the mean per-target loss, whatever the windows' lengths.

    The model is called on segments of several steps (fused kernels such as ``nn.LSTM`` run whole): one call
    per window for ``k1 = k2``, at most two for ``k2 > k1``. Each segment's loss is backpropagated to its
    predictions at once, and a window's backward pass traverses each retained segment once. Only the
    segments a later window reaches are retained (never more than ``k2`` steps), with the weights they were
    computed with across optimizer steps; nothing is recomputed unless ``recompute`` asks for it.

    Args:
        model: the recurrent model; called through ``model_fn`` and returning ``(y_pred, hidden)``, where
            ``hidden`` is a tensor or any nesting of tuples, lists and dicts of tensors.
        optimizer: the optimizer (a ``torch.optim.Optimizer``, or any object with ``param_groups``,
            ``zero_grad`` and ``step``, as ignite accepts); it must hold at least one of ``model``'s parameters.
        loss_fn: ``loss_fn(y_pred, y)`` reducing by mean over its targets, e.g. ``nn.CrossEntropyLoss()``.
        k1: steps between backward passes (and window length), a positive int; or a
            :class:`~ignite_tbptt.WindowSource` that decides each window's end and cut as the stream goes, such
            as :class:`~ignite_tbptt.RandomWindows` (then without ``k2``).
        k2: steps a full window's backward pass reaches back from its end; default ``k1``. To let k2 follow
            the measured gradient decay, attach an :class:`~ignite_tbptt.AdaptiveTruncation` to the trainer.
        time_dim: index of the time dimension of ``x``, ``y`` and ``y_pred``: 0 for ``(T, B, *)`` batches,
            1 for ``(B, T, *)``, any other axis alike (2 or -1 for ``(B, C, T)`` features); negative counts from
            the end of each tensor. The batch dimension is 1 where time comes first, else 0
            (:class:`~ignite_tbptt.layout.Layout`).
        carry_hidden: if False, every batch is a stream of its own: the hidden state starts fresh (the model
            is called without it) and the batch ends the last window. If True, the batches of an epoch are
            consecutive pieces of one stream (the language-model layout): the hidden state and the retained
            history carry over between iterations, windows may span batches, and all is reset when an epoch
            starts. Where the batches are cut does not change the result.
        gradient_accumulation_steps: windows per optimizer step. Windows not yet applied when an epoch ends
            are applied then.
        scaler: a ``torch.amp.GradScaler``, or True to create one for the device. Every backward is scaled;
            gradients are unscaled once per optimizer step, before ``TBPTTEvents.OPTIMIZER_STEP_STARTED``;
            steps with inf/NaN gradients are skipped by the scaler. The scaler is also at
            ``engine.state.scaler``.
        autocast_dtype: run the model and the loss under ``torch.autocast`` with this dtype (e.g.
            ``torch.bfloat16``, which also works on CPU; ``torch.float16`` with a scaler on CUDA).
        device: device to move batches to; the model is not moved (as in ignite).
        non_blocking: passed to ``prepare_batch`` for asynchronous host-to-device copies.
        prepare_batch: ``prepare_batch(batch, device, non_blocking) -> (x, y)`` or ``(x, y, starts)``, ignite's
            signature; the default moves each to ``device``. ``x`` and ``y`` are tensors with the same length
            along ``time_dim``. ``starts``, a bool tensor of shape ``(T, B)`` (``(B, T)`` where time is not the
            first axis), marks where a new sequence starts in a column of a stream of many sequences: the column's
            hidden state is reset before that step (``reset_hidden``) and no gradient flows back past it (SPEC.md,
            "Sequence starts"; :func:`~ignite_tbptt.data.pack_sequences` lays out such batches). The model is
            called once more per step where some column starts; a batch with ``starts`` costs one read of
            where they are from the device.
        model_fn: ``model_fn(model, x, hidden) -> (y_pred, hidden)`` with ``hidden`` None for a stream's
            first segment; default ``model(x)`` then, ``model(x, hidden)`` after, as in ignite's trainer.
        output_transform: ``output_transform(x, y, y_pred, loss)``, ignite's signature, where ``y_pred`` is the
            batch's predictions (detached, joined along ``time_dim``) and ``loss`` the mean per-target loss of
            the targets processed in the iteration; default ``loss.item()``.
        target_count_fn: ``target_count_fn(y_pred, y) -> int``, the number of targets in a segment (for padded
            or ``ignore_index`` targets; :func:`~ignite_tbptt.count_targets` counts all but the packers'
            padding); default ``y.numel()``, which needs no read from the device. A 0-dim tensor is accepted
            (converting it synchronises a GPU). Segments without targets contribute nothing; an optimizer step
            whose windows have none is skipped.
        recompute: recomputation mode, to trade time for memory (Chen et al., 2016, arXiv:1604.06174): run
            the model on segments of at most ``recompute`` steps without keeping their graphs, only their input
            hidden state and random state, and recompute each segment's forward pass in the backward sweep,
            with the weights it first ran with, just before backpropagating through it. The gradients are the
            same (dropout included); activation memory is that of one segment instead of the retained
            history, for one extra forward pass per backward traversal. Default ``None``: off.
        reset_hidden: ``reset_hidden(hidden, starts) -> hidden`` with ``starts`` of shape ``(B,)``: the hidden
            state with the starting columns replaced by the initial state, in a way that passes no gradient
            to their old values (e.g. ``masked_fill``, or ``torch.where``). The default,
            :func:`~ignite_tbptt.default_reset_hidden`, zeroes dimension 1 of 3-D tensors (``nn.RNN``,
            ``nn.GRU``, ``nn.LSTM`` states) and dimension 0 of 2-D ones (cells' ``(B, H)`` states).
        module_state: paths from ``model`` of the attributes where the model keeps its hidden state, e.g.
            ``["lif1.mem", "lif2.mem"]`` for snnTorch neurons built with ``init_hidden=True``: the trainer writes the
            state into them before each model call and reads it back after, and carries, cuts, resets and saves it
            as a returned state (:mod:`ignite_tbptt.runtime.module_state`). The model is then called as
            ``y_pred = model(x)`` (or through ``model_fn``, which returns ``(y_pred, returned_hidden_or_None)``).
        initial_state: ``initial_state(batch_size) -> hidden``, the state at a stream's start and, per column, at
            every sequence start, in place of the model's own (``model(x)``) and of ``reset_hidden``'s zeros. A
            module with parameters (a learned initial state, a Recurrent Memory Transformer's initial memory) gets
            the gradient of every window whose backward pass reaches such a start, computed with its values at
            that step (SPEC.md, "Learned initial state"); put it in the optimizer.
        cuda_graphs: capture windows in CUDA graphs (:mod:`ignite_tbptt.runtime.window_programs`), for small models
            whose GPU steps are bound by kernel launches. Each window of a new shape runs three times eagerly, is then
            captured once (its forward pass, loss and backward pass, the reset of columns starting a sequence at
            its first step as a mask) and is replayed with its input, targets and hidden state copied into static
            buffers; up to 8 shapes. A window of several model calls (a sequence start inside it, or a later cut)
            and a window reaching back (k2 > k1) run whole as a sweep program
            (:mod:`ignite_tbptt.runtime.sweep_programs`), its calls and one backward pass, the retained segments in
            reach run again with the weights they ran with (with ``recompute``, every window, each call's activations
            computed again in its backward pass). A fused optimizer's step is a step program
            (:mod:`ignite_tbptt.runtime.step_programs`); where no handler needs the host between windows, the rest of
            a batch is one program. Events fire for every window, in order. A stream's first window, the run's
            second, a window the batch ends inside, and the first ``(k2 - k1) // k1`` windows of a stream after its
            first run eagerly. Needs the model on CUDA and k2 >= k1; the model, ``model_fn``
            and ``loss_fn`` must not read values back to the host, and Python code in them runs only at capture.
            ``target_count_fn`` runs in the window on its static targets (it must give a tensor, or an int the
            shapes fix) and its count is read after the window, for the step's divisor; a window without targets
            adds no gradient. State kept in attributes (``module_state``) is written from the static buffers at
            capture, so that between replays the attributes hold the graph's output state, which the next replay
            overwrites.
            A window's gradients are added into ``.grad`` as an eager backward pass adds them. ``"uncaptured"`` runs
            the same window programs without capture, on any device: they give the eager parameters bit for bit,
            more slowly. ``"replayed"`` keeps capture's rules on any device, the CPU included
            (:mod:`ignite_tbptt.runtime.replayed_capture`): each program is recorded operator by operator after its
            warm-up, refusing what a capture refuses (a read back to the host, a shape from data), and replayed
            without its Python, so that a Python value read at capture stays as captured and a tensor freed or moved
            since is named: the check, without a GPU, that a model, its loss and its handlers capture. Default False.
        deterministic: use ignite's ``DeterministicEngine``.

    Returns:
        A :class:`~ignite_tbptt.TBPTTEngine` (an ignite ``Engine``; :class:`~ignite_tbptt.DeterministicTBPTTEngine`
        with ``deterministic=True``); ``engine.state.output`` after an iteration is ``output_transform``'s value
        (by default the batch's mean per-target loss as a float; 0.0 for a batch of padding only, so that ignite's
        ``TerminateOnNan`` runs a packed epoch to its end).
        It fires :class:`~ignite_tbptt.TBPTTEvents` (counters ``engine.state.window`` and
        ``engine.state.optimizer_step``, saved in ``engine.state_dict()``) and ignite's ``Tbptt_Events``, with
        ``engine.state.output`` the window's mean per-target loss as a float and ``engine.state.window_bounds``
        its ``(start, end, cut)`` in stream steps while their handlers run; it also keeps
        ``engine.state.targets_seen`` (targets processed in the run), ``window_targets`` (of the last window)
        and ``step_targets`` (of the last optimizer step). Its ``state_dict()`` holds the stream, so
        ignite's ``Checkpoint`` resumes it exactly (mid-epoch with ``deterministic=True``); its
        ``load_state_dict`` also takes a state saved by ignite's ``create_supervised_tbptt_trainer`` or any plain
        ``Engine``, going on at its epoch and iteration with the TBPTT counters at 0 and a fresh stream.

    torch.compile:
        A model compiled with ``torch.compile`` (or a ``model_fn`` that calls one) trains to the parameters of the eager
        model for every k1, k2, recomputation included. Two settings are scoped to the trainer's own calls: while
        k2 > k1, compiled graphs are built without donated buffers (``torch._functorch.config.donated_buffer``),
        because a retained segment is backpropagated once per window that reaches it; and the saved-tensor hooks
        that keep retained weights across optimizer steps are never traced by Dynamo
        (:mod:`ignite_tbptt.runtime.compiled`). Neither costs anything while nothing is compiled.

    Distributed:
        In an ``ignite.distributed`` group (``idist.Parallel``, any backend: gloo on CPUs, nccl on GPUs, one or
        many nodes), give each process its shard of the batch (the same steps, its own streams) and an
        unwrapped model: rank 0's parameters are broadcast when a run starts, and the accumulated gradients and
        target counts are summed over processes once per optimizer step, which equals single-process training
        on the whole batch. Do not wrap the model in ``DistributedDataParallel``: its reducer expects one
        backward pass per forward pass (see :mod:`ignite_tbptt.engine.distributed`).

    Raises:
        TypeError: if ``model``, ``optimizer``, ``scaler``, ``autocast_dtype`` or a callable argument has the wrong
            type, ``k1``, ``k2``, ``time_dim`` or ``gradient_accumulation_steps`` is not an int, or ``k1`` is an
            :class:`~ignite_tbptt.AdaptiveTruncation` (a handler, to attach to the trainer), ``module_state`` is not a
            list of attribute paths or ``initial_state`` is not callable. During a run,
            if ``prepare_batch`` does not return tensors, ``model_fn`` does not return ``(y_pred, hidden)``,
            ``loss_fn`` does not return a tensor, or the first hidden state of a stream holds an object the trainer
            cannot see into (naming its path and type; dataclasses and namedtuples are seen into).
        ValueError: if ``k1``, ``k2``, ``gradient_accumulation_steps`` or ``recompute`` is not positive, or
            ``optimizer`` holds none of ``model``'s parameters. During a run, if ``time_dim`` is out of range,
            ``x`` and ``y`` differ in length along it, a batch is empty, ``starts`` has the wrong shape (a
            TypeError if it is not a bool tensor), the default ``reset_hidden`` cannot reset the hidden state,
            the hidden state changes shape between segments, ``starts`` is on another device than ``x``,
            ``loss_fn`` returns a tensor that is not 0-dim or has no graph, or (with ``carry_hidden=True``) a
            batch has another number of parallel streams than the epoch's first.
            Batch errors are raised before the batch changes anything. From ``trainer.load_state_dict`` (ignite's
            ``Checkpoint.load_objects``), before anything loads, if the checkpoint was made with another
            configuration where that change is unsafe (:mod:`ignite_tbptt.engine.checkpoint`). ``module_state``
            naming no attribute, or both ``initial_state`` and a ``reset_hidden`` of one's own. With
            ``cuda_graphs=True``: a model that is not on a CUDA device; with ``cuda_graphs=True``, ``"uncaptured"``
            or ``"replayed"``: k2 < k1, windows of varying length with k2 != k1 (also a handler's window source), or
            ARTBP; with k2 > k1, a trained parameter that is neither the model's nor ``initial_state``'s; when a run
            starts, a model sharded by FSDP2; at the first sweep program that runs forward passes again (reaching
            back, or ``recompute``), a model that draws random numbers (dropout); there, and with ``recompute`` on
            CUDA, an ``nn.RNN``, ``nn.GRU`` or ``nn.LSTM`` with dropout between its layers (cuDNN draws it from a
            state of its own, which no replay restores), named. ``cuda_graphs`` of another value.
        GraphCaptureError: (a ``RuntimeError``) during a run with ``cuda_graphs=True`` or ``"replayed"``, if a
            window cannot be captured (a read from the device, or shapes from data, in the model, the loss or
            ``target_count_fn``), naming the fix; with ``"replayed"``, the operator and the line that called it.
        GraphReplayError: (a ``RuntimeError``) during a run with ``cuda_graphs="replayed"``, if a program reads a
            tensor freed, moved or resized since its capture, naming it.
        StateWrittenInPlace: (a ``RuntimeError``) during a run, if a model call wrote in place into the hidden
            state it was given, naming the tensor's path in the state, its shape, the segment and its window, before
            autograd's own error (:mod:`ignite_tbptt.runtime.in_place`).
        RuntimeError: after the first window, if the model keeps tensors with a graph in its attributes that
            ``module_state`` does not name and that are not tensors of the state it returned (hidden state the
            trainer would neither cut nor reset nor save).
        FloatingPointError: without a ``scaler``, after an optimizer step whose gradients hold inf or NaN. The
            step is not taken, so the parameters keep their last finite values; no further window of the batch
            runs and the iteration's output is ``float("nan")``, so that ignite's ``TerminateOnNan`` ends the run
            cleanly there. With an optimizer that skips a step on the device (``fused=True``) and parameters on
            an accelerator, the decision is read only at the iteration's end: the rest of the batch runs, every
            later step of it is refused too (the parameters end as above), and the NaN output and the error
            follow then (on the CPU, where a read waits for nothing, it is read at once). Otherwise the error is
            raised before anything else runs: when the next iteration starts or when the epoch completes. With
            a ``scaler`` such a step is skipped and training goes on: the retained history is dropped (the next
            window reaches back only to the skipped step) and a non-finite carried hidden state is restarted.

    Warns:
        UserWarning: if a scaler is combined with an ``autocast_dtype`` other than float16.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from ignite_tbptt import create_tbptt_trainer
        >>> class CharLM(nn.Module):
        ...     def __init__(self, vocab=10, hidden=16):
        ...         super().__init__()
        ...         self.emb, self.rnn, self.out = nn.Embedding(vocab, 8), nn.LSTM(8, hidden), nn.Linear(hidden, vocab)
        ...     def forward(self, x, hidden=None):  # x: (T, B) token ids
        ...         h, hidden = self.rnn(self.emb(x), hidden)
        ...         return self.out(h), hidden  # (T, B, vocab)
        >>> model = CharLM()
        >>> loss_fn = lambda y_pred, y: nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten())
        >>> trainer = create_tbptt_trainer(
        ...     model, torch.optim.Adam(model.parameters()), loss_fn, k1=5, k2=10, carry_hidden=True
        ... )
        >>> stream = torch.randint(0, 10, (61, 4))  # (T, B): 4 parallel streams of 61 steps
        >>> batches = [(stream[i : i + 20], stream[i + 1 : i + 21]) for i in range(0, 60, 20)]
        >>> state = trainer.run(batches, max_epochs=2)
        >>> state.window, state.optimizer_step  # 12 windows of 5 steps per epoch
        (24, 24)
    """
    step = tbptt_training_step(
        model,
        optimizer,
        loss_fn,
        k1,
        k2,
        time_dim=time_dim,
        carry_hidden=carry_hidden,
        gradient_accumulation_steps=gradient_accumulation_steps,
        scaler=scaler,
        autocast_dtype=autocast_dtype,
        device=device,
        non_blocking=non_blocking,
        prepare_batch=prepare_batch,
        model_fn=model_fn,
        output_transform=output_transform,
        target_count_fn=target_count_fn,
        recompute=recompute,
        reset_hidden=reset_hidden,
        module_state=module_state,
        initial_state=initial_state,
        cuda_graphs=cuda_graphs,
    )
    engine = DeterministicTBPTTEngine(step) if deterministic else TBPTTEngine(step)
    if step.scaler is not None:
        engine.state.scaler = step.scaler
    return engine
