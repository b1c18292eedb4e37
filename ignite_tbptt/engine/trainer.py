"""``create_tbptt_trainer``: an ignite ``Engine`` that trains with generalised TBPTT(k1, k2)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypedDict

import torch
from ignite.engine import Engine

from ..checks import callable_or_none, called_as, positive_int
from ..data.batch import prepare_batch as default_prepare_batch
from ..data.masks import count_targets
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
from .burn_in import BurnIn
from .engine import DeterministicTBPTTEngine, TBPTTEngine
from .optimizer_step import OptimizerStep
from .process import TBPTTProcessFunction
from .state import tbptt_state

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # a dependency of torch
    from typing_extensions import Unpack

__all__ = ["create_tbptt_trainer", "tbptt_training_step", "TrainingOptions"]


class TrainingOptions(TypedDict, total=False):
    """The keyword arguments :func:`create_tbptt_trainer` and :func:`tbptt_training_step` share.

    Each is optional; :func:`create_tbptt_trainer` gives its meaning and default.
    """

    time_dim: int
    carry_hidden: bool
    gradient_accumulation_steps: int
    scaler: bool | torch.amp.GradScaler
    autocast_dtype: torch.dtype | None
    device: str | torch.device | None
    non_blocking: bool
    prepare_batch: Callable[..., Any]
    model_fn: Callable[[Any, Any, Any], tuple[Any, Any]]
    output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] | None
    target_count_fn: Callable[[Any, Any], int | torch.Tensor] | None
    recompute: int | None
    reset_hidden: Callable[[Any, torch.Tensor], Any]
    module_state: Sequence[str] | None
    initial_state: Callable[[int], Any] | None
    cuda_graphs: bool | Literal["uncaptured", "recorded"]
    burn_in: int
    burn_in_gradient: bool


#: Each option's default, as :func:`create_tbptt_trainer` documents it.
_DEFAULTS: TrainingOptions = {
    "time_dim": 0,
    "carry_hidden": False,
    "gradient_accumulation_steps": 1,
    "scaler": False,
    "autocast_dtype": None,
    "device": None,
    "non_blocking": False,
    "prepare_batch": default_prepare_batch,
    "model_fn": default_model_fn,
    "output_transform": None,
    "target_count_fn": None,
    "recompute": None,
    "reset_hidden": default_reset_hidden,
    "module_state": None,
    "initial_state": None,
    "cuda_graphs": False,
    "burn_in": 0,
    "burn_in_gradient": True,
}


def _with_defaults(caller: str, options: TrainingOptions) -> TrainingOptions:
    """``options`` completed with the defaults; an unknown name raises as Python does for a keyword argument."""
    for name in options:
        if name not in _DEFAULTS:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    return {**_DEFAULTS, **options}


def tbptt_training_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    k1: int | WindowSource,
    k2: int | None = None,
    **options: Unpack[TrainingOptions],
) -> TBPTTProcessFunction:
    """Factory of the TBPTT(k1, k2) process function, with :func:`create_tbptt_trainer`'s arguments.

    As ignite's ``supervised_training_step``, the result is a process function: ``Engine(step)`` runs it, and
    it registers :class:`~ignite_tbptt.TBPTTEvents`, its counters and the handlers that start and end streams
    and epochs on that engine at its first iteration (``step.attach(engine)`` does it before the run, so that
    handlers can be attached to its events first). Only :func:`create_tbptt_trainer`'s engine saves the
    stream in its ``state_dict()``, which resuming mid-epoch needs.

    Args:
        model: as :func:`create_tbptt_trainer`.
        optimizer: as :func:`create_tbptt_trainer`.
        loss_fn: as :func:`create_tbptt_trainer`.
        k1: as :func:`create_tbptt_trainer`.
        k2: as :func:`create_tbptt_trainer`.
        **options: the keyword arguments of :func:`create_tbptt_trainer` but ``deterministic``
            (:class:`TrainingOptions`), with the same meanings and defaults.

    Returns:
        The process function, a :class:`~ignite_tbptt.TBPTTProcessFunction`.

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
    o = _with_defaults("tbptt_training_step", options)
    _check_model(model, optimizer, loss_fn)
    source = _source(k1, k2)
    layout = Layout.of(o["time_dim"])
    _check_options(o)
    accumulation = positive_int("gradient_accumulation_steps", o["gradient_accumulation_steps"])
    device = o["device"]
    device_type = device_type_of(model, device)
    execution = _execution(o["cuda_graphs"], device_type)
    if execution is Execution.CUDA_GRAPHS:
        refuse_own_dropout_state(model, "cuda_graphs=True", "cuda_graphs=False", captured=True)
    recompute = _recompute(o["recompute"], model, device_type, execution)
    burn_in = _burn_in(o["burn_in"], o["burn_in_gradient"], execution)
    target_count_fn = o["target_count_fn"]
    if burn_in is not None and target_count_fn is None:  # the burn-in's targets are padding: they are not counted
        target_count_fn = count_targets
    scaler = _scaler(o["scaler"], device_type, o["autocast_dtype"])
    optimizer_step = _optimizer_step(optimizer, scaler, accumulation, execution)
    model_call = build_model_call(
        model,
        o["model_fn"],
        device=device,
        autocast_dtype=o["autocast_dtype"],
        reset_hidden=o["reset_hidden"],
        module_state=o["module_state"],
        initial_state=o["initial_state"],
        layout=layout,
        cache_casts=execution is Execution.EAGER,
    )
    return TBPTTProcessFunction(
        model,
        loss_fn,
        source,
        model_call=model_call,
        optimizer_step=optimizer_step,
        layout=layout,
        carry_hidden=bool(o["carry_hidden"]),
        device=device,
        non_blocking=o["non_blocking"],
        prepare_batch=o["prepare_batch"],
        output_transform=o["output_transform"],
        target_count_fn=target_count_fn,
        recompute=recompute,
        execution=execution,
        burn_in=burn_in,
    )


def _optimizer_step(optimizer: Any, scaler: Any, accumulation: int, execution: Execution) -> OptimizerStep:
    # With window programs, the optimizer step runs as a program too where planning says so.
    step_programs = None
    if execution is not Execution.EAGER:
        step_programs = StepPrograms(optimizer, scaler, execution.graph_capture())
    return OptimizerStep(optimizer, scaler, accumulation, step_programs)


def _execution(cuda_graphs: Any, device_type: str) -> Execution:
    # How windows run, read from cuda_graphs once; which windows and steps run as programs, and which window sources
    # programs take, planning decides (planning/execution.py).
    if cuda_graphs is False or cuda_graphs is None:
        return Execution.EAGER
    if cuda_graphs is True:
        if device_type != "cuda":
            raise ValueError(
                f"cuda_graphs=True captures windows in CUDA graphs, but the model is on {device_type!r}: move it to a "
                "CUDA device (model.to('cuda'), or device='cuda'), pass cuda_graphs='recorded' to check the "
                "programs under capture's rules on this device, 'uncaptured' to run them without capture, or "
                "cuda_graphs=False."
            )
        execution = Execution.CUDA_GRAPHS
    elif cuda_graphs == "replayed":  # its name before 0.5
        warnings.warn(
            "cuda_graphs='replayed' is now cuda_graphs='recorded' (the programs recorded and run again under "
            "capture's rules; 'replay' is a CUDA graph's); the old name goes in 0.6.",
            DeprecationWarning,
            stacklevel=4,
        )
        execution = Execution.RECORDED
    elif cuda_graphs in ("uncaptured", "recorded"):
        execution = Execution(cuda_graphs)
    else:
        raise ValueError(f"cuda_graphs must be True, False, 'uncaptured' or 'recorded', got {cuda_graphs!r}.")
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


def _check_options(options: TrainingOptions) -> None:
    for name in ("prepare_batch", "model_fn", "output_transform", "target_count_fn", "reset_hidden"):
        callable_or_none(name, options.get(name))
    # Each as the trainer calls it: a function of y alone, as a metric's batch_size, would be given y_pred as y.
    called_as("target_count_fn", options.get("target_count_fn"), "y_pred", "y", example="count_targets")
    called_as("model_fn", options.get("model_fn"), "model", "x", "hidden", example="lambda model, x, hidden: ...")
    called_as("reset_hidden", options.get("reset_hidden"), "hidden", "starts", example="default_reset_hidden")
    called_as(
        "output_transform",
        options.get("output_transform"),
        *("x", "y", "y_pred", "loss"),
        example="lambda x, y, y_pred, loss: loss.item()",
    )
    autocast_dtype = options.get("autocast_dtype")
    if autocast_dtype is not None and not isinstance(autocast_dtype, torch.dtype):
        raise TypeError(f"autocast_dtype must be a torch.dtype such as torch.bfloat16, got {autocast_dtype!r}.")


def _burn_in(steps: Any, gradient: Any, execution: Execution) -> BurnIn | None:
    # The burn-in the options ask for (None for burn_in=0), or the error naming the option and the fix.
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"burn_in must be an int, the burn-in's steps (0 for none), got {steps!r}.")
    if steps < 0:
        raise ValueError(f"burn_in must be 0 (no burn-in) or more steps, got {steps}.")
    if not isinstance(gradient, bool):
        raise TypeError(f"burn_in_gradient must be True or False, got {gradient!r}.")
    if steps == 0:
        return None
    if not gradient and execution is not Execution.EAGER:
        raise ValueError(
            "burn_in_gradient=False stops each column's gradient where its burn-in ends, which window programs do "
            "not carry out yet: leave cuda_graphs out, or keep the gradient through the burn-in."
        )
    return BurnIn(steps, gradient)


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
    deterministic: bool = False,
    **options: Unpack[TrainingOptions],
) -> Engine:
    """Create an ignite trainer that runs truncated backpropagation through time, TBPTT(k1, k2).

    Every ``k1`` steps of a stream, and at its end, the losses of the steps since the last backward pass are
    backpropagated through up to ``k2`` steps back: Williams & Peng (1990), BPTT(h; h') with h' = k1, h = k2;
    Sutskever (2013), PhD thesis, section 2.8.6. Every step's loss counts, and an optimizer step divides the summed
    gradient by its windows' target count: the exact mean per-target loss (docs/concepts.md). ``k1 = k2`` is
    ignite's ``create_supervised_tbptt_trainer`` (docs/howto/migrating.md). Shapes: ``T`` steps, ``B`` columns.

    Args:
        model (torch.nn.Module): called through ``model_fn``, ``model(x)`` at a stream's start and
            ``model(x, hidden)`` after, returning ``(y_pred, hidden)``; ``hidden`` a tensor or a tree of them.
        optimizer (torch.optim.Optimizer): or any object with ``param_groups``, ``zero_grad`` and ``step``,
            holding some of ``model``'s parameters.
        loss_fn (Callable): ``loss_fn(y_pred, y)``, a 0-dim tensor: the mean over the segment's targets.
        k1 (int or WindowSource): steps between backward passes (the window); or a window source such as
            :class:`~ignite_tbptt.RandomWindows` or :class:`~ignite_tbptt.ARTBP`, then without ``k2``.
        k2 (int, optional): steps a window's backward pass reaches back from its end. Default: ``k1``.
        deterministic (bool): an ignite ``DeterministicEngine``, which resumes mid-epoch. Default: False.
        time_dim (int): the time axis of ``x``, ``y`` and ``y_pred``: 0 for ``(T, B, *)``, 1 for ``(B, T, *)``,
            -1 for ``(B, C, T)``; the batch axis is 1 where time comes first, else 0. Default: 0.
        carry_hidden (bool): True: an epoch's batches are consecutive pieces of one stream of ``B`` columns, the
            state carried across them (docs/howto/streaming.md). Default: False, each batch a stream of its own.
        gradient_accumulation_steps (int): windows per optimizer step. Default: 1.
        scaler (bool or torch.amp.GradScaler): a gradient scaler, or True for one on the model's device; it is also
            ``engine.state.scaler`` (docs/howto/amp.md). Default: False.
        autocast_dtype (torch.dtype, optional): ``torch.autocast``'s dtype for the model and loss. Default: None.
        device (str or torch.device, optional): where batches go; the model is not moved. Default: None.
        non_blocking (bool): passed to ``prepare_batch``. Default: False.
        prepare_batch (Callable): ``prepare_batch(batch, device, non_blocking) -> (x, y)`` or ``(x, y, starts)``,
            ``starts`` a bool tensor ``(T, B)`` marking where a column's sequence starts (docs/howto/sequences.md).
            Default: :func:`~ignite_tbptt.data.prepare_batch`, which moves them to ``device``.
        model_fn (Callable): ``model_fn(model, x, hidden) -> (y_pred, hidden)``, ``hidden`` None at a stream's
            start. Default: :func:`~ignite_tbptt.default_model_fn`, as above.
        output_transform (Callable, optional): ``output_transform(x, y, y_pred, loss)``, ``y_pred`` the batch's
            detached predictions, ``loss`` its mean per-target loss (0-dim tensor). Default: None, ``loss.item()``.
        target_count_fn (Callable, optional): ``target_count_fn(y_pred, y) -> int`` (or a 0-dim tensor), the
            targets in a segment, for padding: :func:`~ignite_tbptt.count_targets` as it is, which counts ``y``'s
            elements that are not ``-100`` or NaN. Default: None, ``y.numel()``, padding included.
        recompute (int, optional): segments of at most this many steps are recomputed in the backward pass
            instead of keeping their activations; same gradients (docs/howto/recompute.md). Default: None, off.
        reset_hidden (Callable): ``reset_hidden(hidden, starts) -> hidden``, ``starts`` ``(B,)`` bool, the starting
            columns' state reset. Default: :func:`~ignite_tbptt.default_reset_hidden`.
        module_state (Sequence[str], optional): attribute paths where the model keeps its state, e.g.
            ``["lif1.mem"]``; the model is then called as ``model(x)`` (docs/howto/stateful-models.md). Default: None.
        initial_state (Callable, optional): ``initial_state(batch_size) -> hidden``, the state at every start,
            learned if it has parameters (docs/howto/stateful-models.md). Default: None.
        cuda_graphs (bool or str): True captures windows of k2 = k1 and optimizer steps in CUDA graphs (model on
            CUDA, k2 >= k1; windows of k2 > k1 or ``recompute`` run eagerly, counted in ``state.programs.eager``);
            ``"uncaptured"`` and ``"recorded"`` run the same programs on any device (docs/howto/cuda-graphs.md).
            Default: False.
        burn_in (int): the first ``burn_in`` steps after each fresh start (a stream's start, every batch's without
            ``carry_hidden``, and each sequence start) run the model and carry its state on, but their targets are
            marked as padding (NaN, or -100 for class indices), so ``loss_fn`` must leave padding out
            (:func:`~ignite_tbptt.masked_loss`, ``ignore_index``) and the counted targets (``target_count_fn``,
            :func:`~ignite_tbptt.count_targets` when not given) are those after the burn-in; a burn-in may span
            batches (docs/howto/burn-in.md; Schiller et al., ICLR 2026). Default: 0, none.
        burn_in_gradient (bool): True: later losses backpropagate through the burn-in steps within k2. False: each
            column's gradient stops at the state where its burn-in ends, as R2D2's burn-in (Kapturowski et al., ICLR
            2019, section 3), and steps where every column's burn-in runs, ending together, run without a graph;
            not with ``cuda_graphs``. Default: True.

    Returns:
        A :class:`~ignite_tbptt.TBPTTEngine` (:class:`~ignite_tbptt.DeterministicTBPTTEngine` if ``deterministic``);
        ``state.output`` is ``output_transform``'s value. It fires :class:`~ignite_tbptt.TBPTTEvents` and ignite's
        ``Tbptt_Events``, counts ``state.window``, ``state.optimizer_step`` and ``state.targets_seen``, and its
        ``state_dict()`` holds the stream, so ignite's ``Checkpoint`` resumes it (docs/howto/checkpoint.md). With
        ``torch.compile`` and ``ignite.distributed``: docs/howto/recompute.md, docs/howto/distributed.md.

    Raises:
        TypeError: an argument of the wrong type or name, named, or a function that cannot take what it is
            given (``target_count_fn(y_pred, y)``, ...); a ``model`` whose ``forward`` needs the state at a stream's
            start, without ``initial_state`` or ``model_fn``; during a run, a batch, ``model_fn``'s or
            ``loss_fn``'s result, or a hidden state the trainer cannot read, named by its path.
        ValueError: ``k1``, ``k2``, ``gradient_accumulation_steps`` or ``recompute`` not positive; ``burn_in``
            negative, or ``burn_in_gradient=False`` with ``cuda_graphs``; ``optimizer``
            without ``model``'s parameters; ``cuda_graphs`` unknown or what it needs missing, or ``cuda_graphs=True``
            with a recurrent module whose dropout between layers cuDNN draws from its own state
            (docs/howto/cuda-graphs.md); during a run, a batch that does not fit, before it changes anything;
            from ``load_state_dict``, a checkpoint of another configuration where that is unsafe.
        RuntimeError: ``StateWrittenInPlace`` if the model writes into the state it was given
            (docs/howto/stateful-models.md); ``GraphCaptureError``, ``RecordingError`` under ``cuda_graphs``.
        FloatingPointError: without a ``scaler``, after an optimizer step whose gradients are not finite; the step
            is not taken and the output is NaN, for ignite's ``TerminateOnNan`` (docs/howto/amp.md).

    Warns:
        UserWarning: a scaler with an ``autocast_dtype`` other than float16; a recurrent layer of ``model`` with
            ``batch_first=True`` while ``time_dim=0``; during a run, a first state none of whose leaves has the
            batch's number of columns (batch-first data read with ``time_dim=0``, most likely); targets with
            padding (-100, NaN) and no ``target_count_fn``, in the first batch or a batch whose loss is NaN.

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
        >>> optimizer = torch.optim.Adam(model.parameters())
        >>> trainer = create_tbptt_trainer(model, optimizer, loss_fn, k1=5, k2=10, carry_hidden=True)
        >>> stream = torch.randint(0, 10, (61, 4))  # (T, B): 4 parallel streams of 61 steps
        >>> batches = [(stream[i : i + 20], stream[i + 1 : i + 21]) for i in range(0, 60, 20)]
        >>> state = trainer.run(batches, max_epochs=2)
        >>> state.window, state.optimizer_step  # 12 windows of 5 steps per epoch
        (24, 24)
    """
    step = tbptt_training_step(model, optimizer, loss_fn, k1, k2, **_with_defaults("create_tbptt_trainer", options))
    engine = DeterministicTBPTTEngine(step) if deterministic else TBPTTEngine(step)
    if step.scaler is not None:
        tbptt_state(engine).scaler = step.scaler
    return engine
