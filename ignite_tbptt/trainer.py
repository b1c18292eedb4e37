"""``create_tbptt_trainer``: an ignite ``Engine`` that trains with generalised TBPTT(k1, k2)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from ignite.contrib.engines.tbptt import Tbptt_Events
from ignite.engine import Engine, Events, _prepare_batch

from . import distributed, rng
from . import hidden as hs
from .checkpoint import load_weights, restore, snapshot
from .engine import DeterministicTBPTTEngine, TBPTTEngine
from .events import COUNTERS, TBPTTEvents, register_tbptt_events
from .history import History, Replay, Segment
from .schedule import Schedule
from .versions import ParameterVersions

__all__ = ["create_tbptt_trainer", "tbptt_training_step", "TBPTTStep", "default_model_fn"]


def default_model_fn(model: torch.nn.Module, x: torch.Tensor, hidden: Any) -> tuple[Any, Any]:
    """Call ``model`` the way ignite's ``create_supervised_tbptt_trainer`` does.

    ``model(x)`` for the first segment of a stream (``hidden`` is ``None``), ``model(x, hidden)`` after it.
    """
    return model(x) if hidden is None else model(x, hidden)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}.")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return value


def device_type_of(model: torch.nn.Module, device: str | torch.device | None) -> str:
    """The device type batches go to: ``device``'s, else that of the model's parameters (``"cpu"`` if none)."""
    if device is not None:
        return torch.device(device).type
    return next((p.device.type for p in model.parameters()), "cpu")


def autocast_for(device_type: str, dtype: torch.dtype | None) -> Callable[[], AbstractContextManager]:
    """A factory of ``torch.autocast`` contexts for ``dtype``, or of null contexts when ``dtype`` is None."""

    def autocast() -> AbstractContextManager:
        return torch.autocast(device_type, dtype=dtype) if dtype is not None else nullcontext()

    return autocast


def _callable(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}.")
    return value


class TBPTTStep:
    """Process function of a TBPTT(k1, k2) trainer; build it with :func:`tbptt_training_step`.

    It keeps the stream's state between iterations (position, hidden state, retained history, the open
    window and the accumulated windows), which :meth:`attach` resets at the right ignite events, and which
    :meth:`state_dict` / :meth:`load_state_dict` save and restore for resuming mid-epoch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        schedule: Schedule,
        *,
        time_dim: int,
        carry_hidden: bool,
        gradient_accumulation_steps: int,
        scaler: torch.amp.GradScaler | None,
        autocast: Callable[[], AbstractContextManager],
        device: str | torch.device | None,
        non_blocking: bool,
        prepare_batch: Callable,
        model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]],
        output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] | None,
        target_count_fn: Callable[[Any, Any], int] | None,
        recompute: int | None = None,
    ) -> None:
        self.model, self.optimizer, self.loss_fn, self.schedule = model, optimizer, loss_fn, schedule
        self.time_dim, self.carry_hidden = time_dim, carry_hidden
        self.accumulation, self.scaler, self.autocast = gradient_accumulation_steps, scaler, autocast
        self.device, self.non_blocking, self.prepare_batch = device, non_blocking, prepare_batch
        self.model_fn, self.output_transform, self.target_count_fn = model_fn, output_transform, target_count_fn
        self.recompute = recompute
        self.history = History(schedule, rebuild=self.rebuild if recompute is not None else None)
        # Only k2 > k1 keeps graphs alive across an optimizer step.
        self.versions = ParameterVersions(self.parameters) if schedule.k2 > schedule.k1 else None
        self._loaded: dict | None = None
        self.reset_stream()
        self.reset_accumulation()

    def hparams(self) -> dict[str, Any]:
        """The trainer's hyper-parameters, for logging."""
        return {
            "k1": self.schedule.k1,
            "k2": self.schedule.k2,
            "carry_hidden": self.carry_hidden,
            "gradient_accumulation_steps": self.accumulation,
            "scaler": self.scaler is not None,
            "recompute": self.recompute or 0,
        }

    def parameters(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates, in its order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # -- state -------------------------------------------------------------------------------------------------
    def reset_stream(self) -> None:
        """Forget the stream: position 0, no hidden state, no retained history, no open window."""
        self.position = 0
        self.streams: int | None = None  # parallel streams (batch size) of a carried stream
        self.hidden: Any = None
        self.window: int | None = None  # first step of the open window
        self.window_loss: Any = 0.0
        self.window_targets = 0
        self.history.clear()

    def reset_accumulation(self) -> None:
        """Forget windows whose gradients were accumulated but not applied."""
        self.group_windows = 0
        self.group_targets = 0

    def attach(self, engine: Engine) -> None:
        """Register the events and the handlers that start and end streams and epochs on ``engine``."""
        register_tbptt_events(engine)
        engine.state.window_loss = None
        engine.state.window_targets = 0
        engine.state.targets_seen = 0
        engine.state.step_targets = 0
        engine.state_dict_user_keys.append("targets_seen")
        engine.add_event_handler(Events.STARTED, self._started)
        engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.end_epoch)

    def _started(self, engine: Engine) -> None:
        if distributed.is_distributed():
            distributed.broadcast_parameters(self.parameters())
        if engine.state.iteration == 0:
            for name in (*COUNTERS, "targets_seen"):
                setattr(engine.state, name, 0)
        if self._loaded is not None and engine.state.iteration > 0:
            restore(self, self._loaded)
        else:
            self.reset_stream()
            self.reset_accumulation()
        self._loaded = None

    def _epoch_started(self, engine: Engine) -> None:
        # A run resumed mid-epoch fires EPOCH_STARTED again; the restored stream goes on.
        if engine.state.epoch_length is None or engine.state.iteration % engine.state.epoch_length == 0:
            self.reset_stream()

    def state_dict(self) -> dict[str, Any]:
        """The stream's state: position, hidden state, open window, accumulated gradients, retained history.

        The retained graphs are saved as what rebuilds them (each segment's input, input hidden state,
        random state, and the weights it ran with); :meth:`load_state_dict` rebuilds them when the next run
        starts, so that resuming gives the parameters of an uninterrupted run. ``create_tbptt_trainer``'s
        engine includes this in its own ``state_dict()``, so ignite's ``Checkpoint`` saves it.
        """
        return snapshot(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state when the engine's next run starts (after model and optimizer load)."""
        self._loaded = state

    # -- one iteration ---------------------------------------------------------------------------------------------
    def __call__(self, engine: Engine, batch: Sequence[Any]) -> Any:
        """Run the windows of one batch; returns ``output_transform``'s value for the batch."""
        x, y = self.prepare_batch(batch, device=self.device, non_blocking=self.non_blocking)
        length = self._check_batch(x, y)
        self.model.train()
        if not self.carry_hidden:
            self.reset_stream()
        offset = self.position
        batch_end = offset + length
        epoch_length = engine.state.epoch_length
        last_iteration = epoch_length is not None and engine.state.iteration % epoch_length == 0
        stream_end = batch_end if not self.carry_hidden or last_iteration else None

        loss_sum: Any = 0.0
        targets = 0
        y_preds: list[Any] = []
        step = offset
        while step < batch_end:
            start = self.schedule.window_start(step)
            if step == start:
                self._start_window(engine, start)
            end = min(self.schedule.segment_end(step, stream_end), batch_end)
            if self.recompute is not None:  # segments of at most `recompute` steps bound the rebuilt graph
                end = min(end, step + self.recompute)
            window_end = self._known_window_end(start, batch_end, stream_end)
            x_seg = x.narrow(self.time_dim, step - offset, end - step)
            y_seg = y.narrow(self.time_dim, step - offset, end - step)
            loss, n, y_pred = self._run_segment(x_seg, y_seg, step, end, start, window_end, batch_end, stream_end)
            loss_sum, targets = loss_sum + loss, targets + n
            engine.state.targets_seen += n
            y_preds.append(y_pred)
            step = end
            if end == window_end:
                self._complete_window(engine, start, end, stream_continues=end != stream_end)
        if last_iteration:
            self.end_epoch(engine)

        loss = loss_sum / targets if targets else torch.tensor(float("nan"))
        if self.output_transform is None:
            return loss.item()
        return self.output_transform(x, y, hs.cat(y_preds, self.time_dim), loss)

    def _known_window_end(self, start: int, batch_end: int, stream_end: int | None) -> int | None:
        # The end of the window is known once the stream's end is, or once the batch holds the whole window.
        if stream_end is not None:
            return self.schedule.window_end(start, stream_end)
        return start + self.schedule.k1 if batch_end >= start + self.schedule.k1 else None

    def forward(self, x: torch.Tensor, hidden: Any, kept: bool) -> tuple[Any, Any]:
        """One model call under autocast; ``kept`` runs it under the hooks that keep its weights across steps."""
        with self.autocast(), self.versions.hooks() if kept else nullcontext():
            output = self.model_fn(self.model, x, hidden)
        return self._check_output(output, hidden)

    def _run_segment(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        step: int,
        end: int,
        start: int,
        window_end: int | None,
        batch_end: int,
        stream_end: int | None,
    ) -> tuple[Any, int, Any]:
        """Forward the steps ``[step, end)``, pay or owe their loss gradient, and retain what is needed.

        Returns:
            The segment's summed per-target loss (detached), its target count, and its detached predictions
            when ``output_transform`` needs them.
        """
        # The cut only moves forward as a window grows, so while the window's end is unknown, the cut of the
        # window cut short at the batch's end bounds it from below.
        lowest_cut = self.schedule.cut(start, window_end if window_end is not None else batch_end)
        own_loss_only = step < lowest_cut  # a step before a k2 < k1 cut
        # Recomputation mode runs the forward pass without a graph; the backward sweep rebuilds it.
        deferred = self.recompute is not None and not own_loss_only
        reached_later = end != stream_end and self.schedule.reached_later(step, start)
        kept = not deferred and self.versions is not None and reached_later
        # A segment that closes its window and that no later window reaches is backpropagated whole at once, as a
        # hand-written loop does: nothing of it outlives the window, so no loss gradient is owed or replay kept.
        direct = own_loss_only or (not deferred and end == window_end and not reached_later)
        needs_hidden_grad = step > lowest_cut
        hidden_in, inputs = (None, []) if self.hidden is None else hs.as_leaves(self.hidden, needs_hidden_grad)
        replay = None
        if not direct:
            version = self.versions.current if self.versions is not None else None
            replay = Replay(x, hidden_in, rng.capture(x.device), version, needs_hidden_grad)

        with torch.no_grad() if deferred else nullcontext():
            y_pred, hidden_out = self.forward(x, hidden_in, kept)
        n = y.numel() if self.target_count_fn is None else int(self.target_count_fn(y_pred, y))
        if direct:
            y_owed, loss_input = None, y_pred
        else:
            # Per-token backward: the loss graph (e.g. a large-vocabulary log-softmax) is freed right away;
            # only the gradient of the predictions waits for the window's backward sweep.
            y_owed = [t.detach().requires_grad_(t.requires_grad or deferred) for t in hs.flatten(y_pred)]
            loss_input = hs.unflatten(y_pred, y_owed)
        loss: Any = 0.0
        if n:
            with self.autocast():
                weighted = self.loss_fn(loss_input, y) * n
            (self.scaler.scale(weighted) if self.scaler is not None else weighted).backward()
            loss = weighted.detach()
        if direct and not own_loss_only:
            # Its input leaves hold the gradient for the window's earlier segments, which the sweep carries on.
            self.history.append(Segment(step, end, inputs, []))
        elif not direct:
            y_grad = [t.grad for t in y_owed] if n else None
            if deferred:
                segment = Segment(step, end, [], None, None, y_grad, replay)
            else:
                owed = hs.flatten(y_pred) if n else None
                segment = Segment(step, end, inputs, hs.flatten(hidden_out), owed, y_grad, replay)
            self.history.append(segment)
        self.hidden = hidden_out
        self.position = end
        self.window_loss = self.window_loss + loss
        self.window_targets += n
        self.group_targets += n
        return loss, n, hs.as_leaves(y_pred, False)[0] if self.output_transform is not None else None

    def replay(self, replay: Replay, kept: bool) -> tuple[list[torch.Tensor], Any, Any]:
        """Run a segment's forward pass again from ``replay``, with the weights the model holds now.

        Returns:
            The new input hidden-state leaves, the predictions and the output hidden state.
        """
        hidden_in, inputs = (None, []) if replay.hidden is None else hs.as_leaves(replay.hidden, replay.hidden_grad)
        with rng.replayed(replay.rng, replay.x.device):
            y_pred, hidden_out = self.forward(replay.x, hidden_in, kept)
        return inputs, y_pred, hidden_out

    @contextmanager
    def rebuild(self, segment: Segment) -> Iterator[None]:
        """Recompute ``segment``'s graph, with the weights and random state it first ran with, for one backward.

        Used by the backward sweep in recomputation mode (Chen et al., 2016, "Training deep nets with
        sublinear memory cost", arXiv:1604.06174, section 3; as ``torch.utils.checkpoint``, but with the
        weights of the segment's own optimizer step). The graph is freed when the block ends.
        """
        replay = segment.replay
        params = self.parameters()
        old = replay.version is not None and replay.version.frozen
        current = [p.detach().clone() for p in params] if old else None
        if old:
            load_weights(params, self.versions.values(replay.version))
        inputs, y_pred, hidden_out = self.replay(replay, kept=False)
        segment.inputs, segment.outputs = inputs, hs.flatten(hidden_out)
        if segment.y_grad is not None:
            segment.y_pred = hs.flatten(y_pred)
        try:
            yield
        finally:
            segment.inputs, segment.outputs, segment.y_pred = [], None, None
            if current is not None:
                load_weights(params, current)

    # -- window and step boundaries ------------------------------------------------------------------------------
    def _start_window(self, engine: Engine, start: int) -> None:
        if self.group_windows == 0:
            self.optimizer.zero_grad()
        self.window = start
        self.window_loss, self.window_targets = 0.0, 0
        engine.state.window += 1
        engine.fire_event(TBPTTEvents.WINDOW_STARTED)
        engine.fire_event(Tbptt_Events.TIME_ITERATION_STARTED)

    def _complete_window(self, engine: Engine, start: int, end: int, stream_continues: bool) -> None:
        self.history.backward(start, end, stream_continues)
        self.window = None
        self.group_windows += 1
        if self.group_windows == self.accumulation:
            self._optimizer_step(engine)
        targets = self.window_targets
        engine.state.window_loss = self.window_loss / targets if targets else torch.tensor(float("nan"))
        engine.state.window_targets = targets
        engine.fire_event(TBPTTEvents.WINDOW_COMPLETED)
        engine.fire_event(Tbptt_Events.TIME_ITERATION_COMPLETED)

    def _optimizer_step(self, engine: Engine) -> None:
        targets = self.group_targets
        self.reset_accumulation()
        params = self.parameters()
        if distributed.is_distributed():
            targets = distributed.all_reduce_gradients(params, targets)
        if not targets:  # only padding: nothing to learn, and momentum or weight decay must not move
            return
        if self.history.segments:
            self.versions.freeze()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            # Exact normalisation: the accumulated windows' summed per-target gradients over their target count.
            torch._foreach_div_(grads, targets)
            if self.scaler is None:
                self._check_finite(engine, grads)
        engine.state.step_targets = targets
        engine.state.optimizer_step += 1
        engine.fire_event(TBPTTEvents.OPTIMIZER_STEP_STARTED)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < scale:  # the scaler found inf/NaN and skipped the step
                self._recover()
        else:
            self.optimizer.step()
        engine.fire_event(TBPTTEvents.OPTIMIZER_STEP_COMPLETED)

    def _check_finite(self, engine: Engine, grads: list[torch.Tensor]) -> None:
        # One host synchronisation per step, as GradScaler makes: never step into NaN weights.
        if not torch.isfinite(torch.stack(torch._foreach_norm(grads))).all():
            self.history.clear()
            raise FloatingPointError(
                f"non-finite gradients at optimizer step {engine.state.optimizer_step + 1} (window "
                f"{engine.state.window}, iteration {engine.state.iteration}); the step was not taken and the "
                "parameters are unchanged. Lower the learning rate, clip gradients (GradientClipping), or pass "
                "scaler=True to skip such steps and go on."
            )

    def _recover(self) -> None:
        """After a step skipped for inf/NaN: cut the history there, and restart a non-finite hidden state."""
        self.history.clear()
        if self.hidden is not None and not all(torch.isfinite(t).all() for t in hs.flatten(self.hidden)):
            self.hidden = None

    def end_epoch(self, engine: Engine) -> None:
        """End the stream and apply the windows not yet applied; runs once per epoch, whatever calls it first."""
        if self.window is not None:
            self._complete_window(engine, self.window, self.position, stream_continues=False)
        if self.group_windows:
            self._optimizer_step(engine)
        self.reset_stream()

    # -- checks --------------------------------------------------------------------------------------------------
    def _check_batch(self, x: Any, y: Any) -> int:
        td = self.time_dim
        for name, t in (("x", x), ("y", y)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"prepare_batch must return tensors (x, y); {name} is a {type(t).__name__}.")
            if not -t.dim() <= td < t.dim():
                raise ValueError(
                    f"time_dim={td} is out of range for {name} of shape {tuple(t.shape)}; "
                    f"pass the index of the time dimension (0 for (T, B, *), 1 for (B, T, *))."
                )
        if x.shape[td] != y.shape[td]:
            raise ValueError(
                f"x and y must have the same length along time_dim={td}, got {x.shape[td]} and {y.shape[td]}."
            )
        if x.shape[td] == 0 or x.numel() == 0:
            raise ValueError(f"empty batch: x has shape {tuple(x.shape)}; every batch needs at least one step.")
        if self.carry_hidden and x.dim() > 1:
            streams = x.shape[1 if td == 0 else 0]
            if self.streams is not None and streams != self.streams:
                raise ValueError(
                    f"with carry_hidden=True the batches of an epoch are pieces of the same {self.streams} parallel "
                    f"streams, but this batch has {streams}. Drop the last incomplete batch (stream_batches lays "
                    "out equal columns), or use carry_hidden=False."
                )
            self.streams = streams
        return x.shape[td]

    def _check_output(self, output: Any, hidden_in: Any) -> tuple[Any, Any]:
        if not isinstance(output, (tuple, list)) or len(output) != 2:
            raise TypeError(
                "model_fn must return (y_pred, hidden), e.g. an nn.LSTM-based model whose forward returns "
                f"(output, (h, c)); got {type(output).__name__}. Wrap the model or pass model_fn to adapt it."
            )
        y_pred, hidden_out = output
        if hidden_in is not None and hs.signature(hidden_out) != hs.signature(hidden_in):
            raise ValueError(
                "the hidden state changed structure or shape between segments: "
                f"{hs.signature(hidden_in)} -> {hs.signature(hidden_out)}. With carry_hidden=True all batches "
                "of an epoch must have the same batch size."
            )
        return y_pred, hidden_out


def tbptt_training_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    k1: int,
    k2: int | None = None,
    *,
    time_dim: int = 0,
    carry_hidden: bool = False,
    gradient_accumulation_steps: int = 1,
    scaler: bool | torch.amp.GradScaler = False,
    autocast_dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    non_blocking: bool = False,
    prepare_batch: Callable = _prepare_batch,
    model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]] = default_model_fn,
    output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] | None = None,
    target_count_fn: Callable[[Any, Any], int] | None = None,
    recompute: int | None = None,
) -> TBPTTStep:
    """Factory of the TBPTT(k1, k2) process function; :func:`create_tbptt_trainer` documents the arguments.

    The returned :class:`TBPTTStep` must be attached to the engine that runs it (``step.attach(engine)``),
    which registers :class:`~ignite_tbptt.TBPTTEvents` and the handlers that end streams and epochs.

    Raises:
        TypeError, ValueError: as :func:`create_tbptt_trainer`.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}.")
    k1 = _positive_int("k1", k1)
    k2 = k1 if k2 is None else _positive_int("k2", k2)
    if isinstance(time_dim, bool) or not isinstance(time_dim, int):
        raise TypeError(f"time_dim must be an int (0 for (T, B, *) batches, 1 for (B, T, *)), got {time_dim!r}.")
    accumulation = _positive_int("gradient_accumulation_steps", gradient_accumulation_steps)
    if recompute is not None:
        recompute = _positive_int("recompute", recompute)
    for name, fn in (
        ("prepare_batch", prepare_batch),
        ("model_fn", model_fn),
        ("output_transform", output_transform),
        ("target_count_fn", target_count_fn),
    ):
        _callable(name, fn)
    if autocast_dtype is not None and not isinstance(autocast_dtype, torch.dtype):
        raise TypeError(f"autocast_dtype must be a torch.dtype such as torch.bfloat16, got {autocast_dtype!r}.")

    model_params = {id(p) for p in model.parameters()}
    if not any(id(p) in model_params for group in optimizer.param_groups for p in group["params"]):
        raise ValueError("optimizer holds none of model's parameters; build it from model.parameters().")

    device_type = device_type_of(model, device)
    if scaler is True:
        scaler = torch.amp.GradScaler(device_type)
    elif scaler is False or scaler is None:
        scaler = None
    elif not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler or a bool, got {type(scaler).__name__}.")
    if scaler is not None and autocast_dtype is not None and autocast_dtype != torch.float16:
        warnings.warn(
            f"a GradScaler is only needed with float16; autocast_dtype={autocast_dtype} keeps float32's range. "
            "Pass scaler=False.",
            stacklevel=3,
        )

    return TBPTTStep(
        model,
        optimizer,
        loss_fn,
        Schedule(k1, k2),
        time_dim=time_dim,
        carry_hidden=bool(carry_hidden),
        gradient_accumulation_steps=accumulation,
        scaler=scaler,
        autocast=autocast_for(device_type, autocast_dtype),
        device=device,
        non_blocking=non_blocking,
        prepare_batch=prepare_batch,
        model_fn=model_fn,
        output_transform=output_transform,
        target_count_fn=target_count_fn,
        recompute=recompute,
    )


def create_tbptt_trainer(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    k1: int,
    k2: int | None = None,
    *,
    time_dim: int = 0,
    carry_hidden: bool = False,
    gradient_accumulation_steps: int = 1,
    scaler: bool | torch.amp.GradScaler = False,
    autocast_dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    non_blocking: bool = False,
    prepare_batch: Callable = _prepare_batch,
    model_fn: Callable[[torch.nn.Module, Any, Any], tuple[Any, Any]] = default_model_fn,
    output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] | None = None,
    target_count_fn: Callable[[Any, Any], int] | None = None,
    recompute: int | None = None,
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
        optimizer: the optimizer; it must hold at least one of ``model``'s parameters.
        loss_fn: ``loss_fn(y_pred, y)`` reducing by mean over its targets, e.g. ``nn.CrossEntropyLoss()``.
        k1: steps between backward passes (and window length), a positive int.
        k2: steps a full window's backward pass reaches back from its end; default ``k1``.
        time_dim: index of the time dimension of ``x``, ``y`` and ``y_pred``: 0 for ``(T, B, *)`` batches,
            1 for ``(B, T, *)``.
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
        prepare_batch: ``prepare_batch(batch, device, non_blocking) -> (x, y)``, ignite's signature. ``x`` and
            ``y`` are tensors with the same length along ``time_dim``.
        model_fn: ``model_fn(model, x, hidden) -> (y_pred, hidden)`` with ``hidden`` None for a stream's
            first segment; default ``model(x)`` then, ``model(x, hidden)`` after, as in ignite's trainer.
        output_transform: ``output_transform(x, y, y_pred, loss)``, ignite's signature, where ``y_pred`` is the
            batch's predictions (detached, joined along ``time_dim``) and ``loss`` the mean per-target loss of
            the targets processed in the iteration; default ``loss.item()``.
        target_count_fn: ``target_count_fn(y_pred, y) -> int``, the number of targets in a segment (for padded
            or ``ignore_index`` targets); default ``y.numel()``. A 0-dim tensor is accepted (converting it
            synchronises a GPU). Segments without targets contribute nothing; an optimizer step whose windows
            have none is skipped.
        recompute: recomputation mode, to trade time for memory (Chen et al., 2016, arXiv:1604.06174): run
            the model on segments of at most ``recompute`` steps without keeping their graphs, only their input
            hidden state and random state, and recompute each segment's forward pass in the backward sweep,
            with the weights it first ran with, just before backpropagating through it. The gradients are the
            same (dropout included); activation memory is that of one segment instead of the retained
            history, for one extra forward pass per backward traversal. Default ``None``: off.
        deterministic: use ignite's ``DeterministicEngine``.

    Returns:
        A :class:`~ignite_tbptt.TBPTTEngine` (an ignite ``Engine``; :class:`~ignite_tbptt.DeterministicTBPTTEngine`
        with ``deterministic=True``); ``engine.state.output`` after an iteration is ``output_transform``'s value.
        It fires :class:`~ignite_tbptt.TBPTTEvents` (counters ``engine.state.window`` and
        ``engine.state.optimizer_step``, saved in ``engine.state_dict()``) and ignite's ``Tbptt_Events``; it
        also keeps ``engine.state.targets_seen`` (targets processed in the run), ``window_targets`` (of the last
        window) and ``step_targets`` (of the last optimizer step). Its ``state_dict()`` holds the stream, so
        ignite's ``Checkpoint`` resumes it exactly (mid-epoch with ``deterministic=True``).

    Distributed:
        In an ``ignite.distributed`` group (``idist.Parallel``, any backend: gloo on CPUs, nccl on GPUs, one or
        many nodes), give each process its shard of the batch (the same steps, its own streams) and an
        unwrapped model: rank 0's parameters are broadcast when a run starts, and the accumulated gradients and
        target counts are summed over processes once per optimizer step, which equals single-process training
        on the whole batch. Do not wrap the model in ``DistributedDataParallel``: its reducer expects one
        backward pass per forward pass (see :mod:`ignite_tbptt.distributed`).

    Raises:
        TypeError: if ``model``, ``optimizer``, ``scaler``, ``autocast_dtype`` or a callable argument has the wrong
            type, or ``k1``, ``k2``, ``time_dim`` or ``gradient_accumulation_steps`` is not an int. During a run,
            if ``prepare_batch`` does not return tensors or ``model_fn`` does not return ``(y_pred, hidden)``.
        ValueError: if ``k1``, ``k2``, ``gradient_accumulation_steps`` or ``recompute`` is not positive, or
            ``optimizer`` holds none of ``model``'s parameters. During a run, if ``time_dim`` is out of range,
            ``x`` and ``y`` differ in length along it, a batch is empty, the hidden state changes shape between
            segments, or (with ``carry_hidden=True``) a batch has another number of parallel streams than the
            epoch's first.
            Batch errors are raised before the batch changes anything.
        FloatingPointError: without a ``scaler``, when an optimizer step's gradients hold inf or NaN; the
            step is not taken, so the parameters keep their last finite values. With a ``scaler`` such a step
            is skipped and training goes on: the retained history is dropped (the next window reaches back
            only to the skipped step) and a non-finite carried hidden state is restarted.

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
    )
    engine = DeterministicTBPTTEngine(step) if deterministic else TBPTTEngine(step)
    if step.scaler is not None:
        engine.state.scaler = step.scaler
    return engine
