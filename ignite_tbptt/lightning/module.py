"""Exact TBPTT(k1, k2) in a ``LightningModule``: Lightning's ``Trainer`` runs the batches, this trainer the windows.

PyTorch Lightning removed truncated backpropagation through time in 2.0 (``truncated_bptt_steps``, RFC #8732); its
documentation now gives a recipe under manual optimization that splits each batch into chunks, starts the state at
zeros every batch and steps once per chunk. :class:`TBPTTModule` gives Lightning's ``Trainer`` the trainer of
:func:`~ignite_tbptt.create_tbptt_trainer` instead: the same stream loop (windows, cuts, the retained history for
k2 > k1, normalisation by target counts, accumulation over windows, sequence starts inside a batch), built by
:func:`~ignite_tbptt.tbptt_training_step` from the same options, inside ``training_step`` under Lightning's manual
optimization. Lightning keeps its loop over batches and epochs, its callbacks, loggers and checkpoints; each
optimizer step goes through Lightning's optimizer wrapper, so ``trainer.global_step`` counts optimizer steps.

Sources: Williams and Peng 1990 (TBPTT(k1, k2)); Sutskever 2013, PhD thesis, section 2.8.6; SPEC.md, "Another
framework, the same trainer".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule

from ..checks import positive_int
from ..data import count_targets
from ..data.batch import split_batch
from ..engine import TBPTTProcessFunction, tbptt_training_step
from ..engine.evaluator import StreamEvaluation
from ..engine.optimizer_step import RunPosition
from ..runtime import skips_on_device

__all__ = ["TBPTTModule"]

#: Options of create_tbptt_trainer that Lightning's Trainer owns here, with what replaces each.
_LIGHTNING_OWNS = {
    "device": "Trainer(accelerator=..., devices=...) moves the model and the batches",
    "non_blocking": "Trainer moves the batches",
    "prepare_batch": "LightningModule.transfer_batch_to_device or the DataLoader's collate_fn",
    "output_transform": "training_step returns the batch's mean loss, logged as train_loss",
    "scaler": "Trainer(precision='16-mixed') scales with the GradScaler of Lightning's precision plugin",
    "autocast_dtype": "Trainer(precision='16-mixed') or 'bf16-mixed' runs training_step under torch.autocast",
    "cuda_graphs": "nothing yet: CUDA graphs are the ignite trainer's (create_tbptt_trainer)",
}
#: Trainer precisions trained as create_tbptt_trainer trains them: full precision, or torch.autocast with (for
#: 16-mixed) the plugin's GradScaler scaling each backward pass.
_PRECISIONS = {"32-true", "64-true", "32", "64", "16-mixed", "bf16-mixed"}
_AUTOCAST = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
#: Lightning's hooks around manual_backward, which the trainer's own backward passes do not call.
_BACKWARD_HOOKS = ("backward", "on_before_backward", "on_after_backward")
_BACKWARD_HOOKS_UNRUN = (
    "which TBPTTModule never runs: the trainer makes the backward passes itself (a window's loss, then the sweep "
    "through the retained history), not through manual_backward. Inspect or change the gradients in "
    "on_before_optimizer_step, where they are final (divided by the step's target count, unscaled)."
)


class TBPTTModule(LightningModule):
    """A ``LightningModule`` that trains ``model`` with exact TBPTT(k1, k2) on Lightning's ``Trainer``.

    Subclass it and write ``configure_optimizers`` (one optimizer, and schedulers if any); the base writes
    ``training_step``. Each batch is ``(x, y)`` or ``(x, y, starts)`` with ``x`` and ``y`` of shape ``(T, B, *)``
    along the time dimension (``time_dim`` moves it), ``starts`` a ``(T, B)`` bool tensor of the steps where a column
    starts a new sequence; with ``carry_hidden=True`` the batches of an epoch are pieces of one stream per column, as
    with :func:`~ignite_tbptt.create_tbptt_trainer`, whose parameters this trains bit for bit on the same data.

    Lightning's machinery, where this uses it: every optimizer step through ``self.optimizers()``
    (``trainer.global_step`` counts optimizer steps, ``max_steps`` and ``every_n_train_steps`` with it); gradient
    clipping as ``self.clip_gradients`` clips, once per optimizer step, after the division by the step's target count
    (the ``Trainer`` refuses ``gradient_clip_val`` under manual optimization: pass it here), in Lightning's
    ``on_before_optimizer_step`` of a callback from :meth:`configure_callbacks`, after the unscaling;
    ``precision="16-mixed"`` and ``"bf16-mixed"`` as ``create_tbptt_trainer(..., autocast_dtype=...)`` trains (each
    model call and its loss under autocast; with 16-mixed, each backward pass scaled by the precision plugin's
    ``GradScaler``, whose step skips inf/NaN steps); learning-rate schedulers from ``configure_optimizers`` stepped
    per optimizer step (``"interval": "step"``) or per epoch, every ``"frequency"``; ``self.log`` of the batch's
    mean loss (``train_loss``) and, where clipping by norm computes it, the gradient norm before clipping
    (``grad_norm``); validation through :func:`~ignite_tbptt.create_tbptt_evaluator`'s stream evaluation, the state
    carried along the validation stream, ``val_loss`` the mean over its targets; ``strategy="ddp"``, each process
    on its own columns (``use_distributed_sampler=False`` with ``carry_hidden``), the gradients and target counts
    summed once per optimizer step as :func:`~ignite_tbptt.create_tbptt_trainer` sums them; the stream's state
    (window counters, the hidden state, the retained history, accumulated windows, the window source's state) in
    Lightning's checkpoint, resumed at an epoch's end, or inside one from a loader Lightning resumes (torchdata's
    ``StatefulDataLoader``).

    Args:
        model: ``y_pred, hidden = model(x, hidden)``, as :func:`~ignite_tbptt.create_tbptt_trainer` takes it.
        loss_fn: ``loss_fn(y_pred, y)``, the mean over the window's targets.
        k1: steps between backward passes, or a window source (:class:`~ignite_tbptt.RandomWindows`, ...).
        k2: steps each backward pass reaches back (default ``k1``).
        gradient_clip_val: clip the gradients to this norm (or value) at every optimizer step; ``None``: no clipping.
        gradient_clip_algorithm: ``"norm"`` or ``"value"``, as Lightning's ``clip_gradients`` takes it.
        reach_every: record the gradient reach of every ``reach_every``-th window
            (:class:`~ignite_tbptt.GradientReach`'s profile) and log its value at the cut, the norm of the gradient
            that truncation throws away, as ``reach_at_cut``; ``None``: none recorded.
        **options: :func:`~ignite_tbptt.create_tbptt_trainer`'s keyword arguments (``carry_hidden``,
            ``gradient_accumulation_steps``, ``target_count_fn``, ``time_dim``, ``model_fn``, ``reset_hidden``,
            ``initial_state``, ``module_state``, ``recompute``, ...), but those Lightning's ``Trainer`` owns.

    Raises:
        TypeError: at the class's definition, if a subclass writes ``training_step``, or ``backward``,
            ``on_before_backward`` or ``on_after_backward``, which never run (a callback that writes one of the last
            two is warned of as fit starts); as the module is made, if
            ``reach_every`` is not an int; at a batch that is not ``(x, y)`` or ``(x, y, starts)``.
        ValueError: as the module is made, for ``reach_every`` below 1, or an option Lightning's ``Trainer`` owns
            here (``device``, ``scaler``, ``cuda_graphs``, ...), named with what replaces it; as fit starts, for
            several optimizers, a precision other than 32- or 64-bit, 16-mixed or bf16-mixed, a strategy other than
            one device or DDP, Lightning's ``DistributedSampler`` with ``carry_hidden=True``,
            ``automatic_optimization`` set back to True, ``configure_callbacks`` without the module's callback, a
            checkpoint of another configuration, or one taken inside an epoch where the training loader has no
            ``state_dict``/``load_state_dict`` (Lightning would start its epoch over); and as
            :func:`~ignite_tbptt.create_tbptt_trainer` raises for its options.

    Examples:
        >>> import torch
        >>> from ignite_tbptt.lightning import TBPTTModule
        >>> class CharModule(TBPTTModule):
        ...     def configure_optimizers(self):
        ...         return torch.optim.Adam(self.parameters(), lr=1e-3)
        >>> module = CharModule(torch.nn.LSTM(3, 3), torch.nn.functional.mse_loss, k1=5, k2=10, carry_hidden=True)
        >>> module.automatic_optimization
        False
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # As the class resolves them, so that a mixin listed before TBPTTModule is seen too.
        if cls.training_step is not TBPTTModule.training_step:
            raise TypeError(
                f"{cls.__name__} writes training_step, which TBPTTModule writes itself: it runs the batch's windows "
                "and optimizer steps. Remove it; to change what a window computes, pass model_fn, loss_fn or "
                "target_count_fn, and use Lightning's hooks (on_train_batch_end, ...) for the rest."
            )
        unrun = [name for name in _BACKWARD_HOOKS if getattr(cls, name) is not getattr(LightningModule, name)]
        if unrun:
            raise TypeError(f"{cls.__name__} writes {unrun[0]}, {_BACKWARD_HOOKS_UNRUN}")

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        k1: Any,
        k2: int | None = None,
        *,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        reach_every: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        owned = sorted(set(options) & set(_LIGHTNING_OWNS))
        if owned:
            raise ValueError(
                f"TBPTTModule(..., {owned[0]}=...): Lightning's Trainer owns this here; {_LIGHTNING_OWNS[owned[0]]}."
            )
        if gradient_clip_algorithm not in ("norm", "value"):
            raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {gradient_clip_algorithm!r}.")
        self.model, self.loss_fn, self.k1, self.k2 = model, loss_fn, k1, k2
        self.gradient_clip_val, self.gradient_clip_algorithm = gradient_clip_val, gradient_clip_algorithm
        self.reach_every = None if reach_every is None else positive_int("reach_every", reach_every, "windows")
        self.tbptt_options = options
        self.automatic_optimization = False
        #: The trainer's process function, made as fit starts (its ``loop`` runs the batches).
        self.tbptt: TBPTTProcessFunction | None = None
        self._counts = {"window": 0, "iteration": 0}
        self._loaded: dict | None = None
        self._resumed_mid_epoch = False
        self._stepped: dict[str, Any] = {}  # the batch's last step's gradient norm, last recorded window's reach
        #: Validation: the evaluator's batch, the hidden state carried along the validation stream as in training
        #: (made as each validation epoch starts, under the Trainer's precision).
        self.evaluation: StreamEvaluation | None = None

    # -- fit's start and end, run by _TBPTTCallback (a subclass may write Lightning's hooks without super()) ------
    def _fit_started(self) -> None:
        # Make the trainer over Lightning's optimizer wrapper; refuse what it cannot train.
        _refuse_what_it_cannot_train(self)
        self._counts, self._stepped = {"window": 0, "iteration": 0}, {}  # a checkpoint's are restored at train start
        optimizer = self.optimizers()
        scaler = _scaler(self, optimizer)
        self.tbptt = tbptt_training_step(
            self.model,
            optimizer,
            self.loss_fn,
            self.k1,
            self.k2,
            scaler=scaler or False,
            autocast_dtype=self._autocast_dtype(),
            **self.tbptt_options,
        )
        # Lightning's wrapper steps the optimizer: an inf/NaN decision is read before each step, not handed to it.
        self.tbptt.optimizer_step.skips_on_device = False
        self.tbptt.optimizer_step.scaler_in_step = scaler is not None
        self.tbptt.loop.listener = _LightningListener(self, optimizer)
        if self.reach_every is not None:
            self.tbptt.record_reach(self.reach_every)
        self.tbptt.start_run()
        self.tbptt.loop.reset()

    def _train_started(self) -> None:
        # Restore the stream's state of a checkpoint Lightning resumed from (its counters are restored by now).
        self._refuse_batches_dealt_out()
        loaded, self._loaded = self._loaded, None
        if loaded is None:
            return
        step = self._trainer_step()
        if loaded["state"]["configuration"] != step.configuration():
            raise ValueError(
                "the checkpoint was written by a TBPTTModule of another configuration "
                f"({loaded['state']['configuration']}), this one is {step.configuration()}: resume with the same k1, "
                "k2, window source, carry_hidden, recompute and gradient_accumulation_steps."
            )
        progress = self.trainer.fit_loop.epoch_loop.batch_progress
        # After the epoch's last batch (ModelCheckpoint(every_n_train_steps) landing there), the stream has ended.
        last_done = progress.is_last_batch or progress.current.completed >= self.trainer.num_training_batches
        if self.trainer.fit_loop.restarted_mid_epoch and not last_done:
            self._refuse_a_loader_that_starts_over()
            if self.trainer.world_size > 1:  # the checkpoint holds rank 0's stream only
                raise ValueError(
                    "the checkpoint was taken inside an epoch of a run on several processes, and it holds the stream "
                    "(hidden state, accumulated windows) of the first process only: resume from a checkpoint taken "
                    "at an epoch's end, ModelCheckpoint(save_on_train_epoch_end=True)."
                )
            self._resumed_mid_epoch = True  # the stream restored here goes on in the epoch Lightning restarts
        self._counts = dict(loaded["counts"])
        step.loop.load_state_dict(loaded["state"], self._counts["window"])
        step.optimizer_step.load_state_dict(loaded["state"])

    def _refuse_batches_dealt_out(self) -> None:
        # Lightning's DistributedSampler deals whole batches out to the processes: a stream's batches, which must
        # follow one another on one process, would be split between them.
        if not self.tbptt_options.get("carry_hidden", False) or self.trainer.world_size == 1:
            return
        loader = self.trainer.train_dataloader
        if isinstance(getattr(loader, "sampler", None), torch.utils.data.DistributedSampler):
            raise ValueError(
                "with carry_hidden=True the batches of a stream follow one another on each process, and Lightning's "
                "DistributedSampler deals them out between the processes: pass Trainer(use_distributed_sampler=False) "
                "and give each process its own columns of every batch (the data helpers' rank and world_size, or "
                "ignite_tbptt.data.shard_of().select(x)), so that each process runs as many batches."
            )

    def _refuse_a_loader_that_starts_over(self) -> None:
        # Lightning resumes a loader inside its epoch only if it has state_dict and load_state_dict (torchdata's
        # StatefulDataLoader); a plain DataLoader starts its epoch over, so the stream would see its batches again.
        loader = self.trainer.train_dataloader
        loaders = list(loader.values()) if isinstance(loader, dict) else loader
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        if not all(hasattr(each, "state_dict") and hasattr(each, "load_state_dict") for each in loaders):
            raise ValueError(
                "the checkpoint was taken inside an epoch, and Lightning iterates this training loader again from its "
                "start (it has no state_dict/load_state_dict): train from torchdata's StatefulDataLoader, which "
                "Lightning resumes where it stopped, or resume from a checkpoint taken at an epoch's end, "
                "ModelCheckpoint(save_on_train_epoch_end=True)."
            )

    def _epoch_started(self) -> None:
        # A new stream per epoch (per batch without carry_hidden), but in the epoch a checkpoint resumes.
        resumed, self._resumed_mid_epoch = self._resumed_mid_epoch, False
        if not resumed:
            self._trainer_step().loop.reset_stream()

    def _epoch_ended(self) -> None:
        # Close a stream the epoch left open, and step the epoch's schedulers.
        self._resumed_mid_epoch = False
        loop = self._trainer_step().loop
        if loop.stream.position > 0:
            loop.end_stream()
        self._raise_if_failed()
        for config in self.trainer.lr_scheduler_configs:
            if config.interval == "epoch" and (self.current_epoch + 1) % config.frequency == 0:
                self.lr_scheduler_step(config.scheduler, None)

    # -- the batch ---------------------------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Run the batch's windows and optimizer steps; the batch's mean loss, logged as ``train_loss``."""
        step = self._trainer_step()
        self._counts["iteration"] += 1
        _split(batch)
        batches = self.trainer.num_training_batches
        epoch_ends = (  # a loader without a length: Lightning knows its last batch as it fetches it
            self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
            if math.isinf(batches)
            else batch_idx + 1 == batches
        )
        with self._without_lightnings_autocast():
            _, _, result = step.train_batch(batch, epoch_ends)
        if epoch_ends and step.loop.failed is None:  # inside training_step, where Lightning counts the steps
            step.loop.end_stream()
        self._raise_if_failed()
        loss = result.loss.mean()
        # Weighed by its targets, summed over processes: the epoch's value is the mean over all of them.
        targets = max(result.loss.targets, 1)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=targets, sync_dist=True)
        # Lightning's logger keeps a batch's last value of what is logged on_step: the batch's last step's, logged
        # once rather than at every step (self.log costs tens of microseconds).
        stepped, self._stepped = self._stepped, {}
        for name, value in stepped.items():
            self.log(name, value, on_step=True)
        return loss

    def configure_callbacks(self) -> list[Callback]:
        """The callback that runs the trainer's part of Lightning's hooks: keep it (``super().configure_callbacks()``).

        It builds the trainer as fit starts, starts and ends each epoch's stream, saves and restores the stream with
        checkpoints and clips the gradients inside each optimizer step; a subclass's own hooks then need no
        ``super()`` call.
        """
        return [_TBPTTCallback()]

    def on_validation_model_zero_grad(self) -> None:
        """Keep the gradients: windows accumulated towards the next optimizer step wait in them across validation.

        The trainer clears the gradients itself, at each step's first window.
        """

    def _validation_started(self) -> None:
        # A new validation stream: its first batch starts from the initial state.
        shared = ("time_dim", "carry_hidden", "model_fn", "reset_hidden", "module_state", "initial_state")
        options = {name: self.tbptt_options[name] for name in shared if name in self.tbptt_options}
        self.evaluation = StreamEvaluation(self.model, autocast_dtype=self._autocast_dtype(), **options)

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """The batch's mean loss per target, logged as ``val_loss`` weighted by its target count.

        Over the epoch, ``val_loss`` is the mean over its targets; with ``carry_hidden`` the hidden state is carried
        to the next batch, as in training.
        """
        x, y, starts = _split(batch)
        if self.evaluation is None:  # the callback's epoch start did not run: trainer.validate() without a fit
            self._validation_started()
        assert self.evaluation is not None, "made just above if not before"
        # Lightning validates under inference_mode, whose tensors have no version counter for the model call's
        # check that a model changes no state in place: no_grad instead, as create_tbptt_evaluator runs. The loss
        # outside Lightning's autocast too, as create_tbptt_evaluator's metrics compute it.
        with self._without_lightnings_autocast(), torch.inference_mode(False), torch.no_grad():
            y_pred = self.evaluation(x.clone() if x.is_inference() else x, starts)
            count = self.tbptt_options.get("target_count_fn")
            targets = int(count(y_pred, y) if count is not None else count_targets(y))
            loss = self.loss_fn(y_pred, y)
        if targets:  # a batch of padding only adds nothing, not its NaN mean; summed over processes (DDP)
            self.log("val_loss", loss, prog_bar=True, on_epoch=True, batch_size=targets, sync_dist=True)
        return loss

    def _autocast_dtype(self) -> torch.dtype | None:
        # The mixed-precision plugin's autocast dtype, for the trainer's own autocast: around each model call and
        # its loss, as create_tbptt_trainer(..., autocast_dtype=...) runs them, not around the whole batch.
        return _AUTOCAST.get(str(self.trainer.precision))

    def _without_lightnings_autocast(self) -> Any:
        return torch.autocast(self.device.type, enabled=False)

    def _raise_if_failed(self) -> None:
        loop = self._trainer_step().loop
        loop.collect_failure()
        if loop.failed is not None:
            raise loop.failed

    def _trainer_step(self) -> TBPTTProcessFunction:
        if self.tbptt is None:
            raise RuntimeError(
                "TBPTTModule's trainer is made as Lightning's Trainer.fit starts, by the callback configure_callbacks "
                "returns, which did not run: return super().configure_callbacks() + [yours]."
            )
        return self.tbptt

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _save(self, checkpoint: dict[str, Any]) -> None:
        # The stream's state (window counters, accumulated windows, the window source's) beside Lightning's.
        if self.tbptt is not None:
            checkpoint["ignite_tbptt"] = {"state": self.tbptt.state_dict(), "counts": dict(self._counts)}

    def _load(self, checkpoint: dict[str, Any]) -> None:
        # Kept until training starts (_train_started), after Lightning's own state; only where fit resumes from it
        # (trainer.validate(ckpt_path=...) restores no stream).
        self._loaded = checkpoint.get("ignite_tbptt") if self.trainer.state.fn == "fit" else None


class _LightningListener:
    # What the stream loop reports, turned into Lightning's: counters, clipping, schedulers (a LoopListener).

    def __init__(self, module: TBPTTModule, optimizer: Any) -> None:
        self.module, self.optimizer = module, optimizer

    def window_started(self) -> int:
        self.module._counts["window"] += 1
        return self.module._counts["window"]

    def window_closed(self, reach: dict[int, float] | None) -> None:
        if reach:  # a recorded window's profile, by lag: the longest lag is the cut
            self.module._stepped["reach_at_cut"] = reach[max(reach)]

    def targets_processed(self, targets: int) -> None:
        pass

    def position(self) -> RunPosition:
        module = self.module
        batches = module.trainer.num_training_batches
        length = -1 if math.isinf(batches) else int(batches)
        counts = module._counts
        return RunPosition(
            length, module.current_epoch + 1, counts["iteration"], counts["window"], module.global_step + 1
        )

    def step_handlers(self) -> Any:
        raise AssertionError("TBPTTModule runs no step programs")

    def step_started(self, targets: int, in_program: bool = False) -> None:
        pass  # clipping waits for the gradients unscaled, inside the step: _TBPTTCallback

    def step_completed(self) -> None:
        module = self.module
        # Inside Lightning's autocast (mixed precision) the trainer's own never is the outermost, so the weights it
        # cast stay cached until training_step ends: the step changed them.
        torch.clear_autocast_cache()
        for config in module.trainer.lr_scheduler_configs:
            if config.interval == "step" and module.global_step % config.frequency == 0:
                module.lr_scheduler_step(config.scheduler, None)

    def window_completed(self, window: Any) -> None:
        pass


class _TBPTTCallback(Callback):
    # TBPTTModule's part in Lightning's hooks, here rather than in the module's own hooks, which a subclass may write
    # without calling super(). Clipping runs at Lightning's point where a step's gradients are final: divided by the
    # step's target count, unscaled (16-mixed), before the scaler decides on the step.

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module._fit_started()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module._train_started()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module._epoch_started()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        pl_module._epoch_ended()

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module._validation_started()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        pl_module._save(checkpoint)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        pl_module._load(checkpoint)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        clip = pl_module.gradient_clip_val
        if clip is None:
            return
        if pl_module.gradient_clip_algorithm == "value":
            pl_module.clip_gradients(optimizer, clip, "value")
            return
        # What Lightning's clip_gradients does by norm (its precision plugins' clip_grad_by_norm, over every parameter
        # of the optimizer), keeping the norm it computes for the log. A fused optimizer that unscales in its own step
        # was refused with 16-mixed as fit started, as Lightning refuses it.
        params = [p for group in optimizer.param_groups for p in group["params"]]
        pl_module._stepped["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, clip)


def _overrides(callback: Any, name: str) -> bool:
    # Whether the callback's class writes the hook, rather than inheriting Callback's, which does nothing.
    return getattr(type(callback), name, None) is not getattr(Callback, name)


def _split(batch: Any) -> tuple[Any, Any, Any]:
    # (x, y, starts) of a batch, or the error naming the layout and where to make it.
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise TypeError(
            f"a TBPTTModule batch is (x, y) or (x, y, starts), each x and y (T, B, *) along time_dim; got "
            f"{type(batch).__name__}{'' if not isinstance(batch, (tuple, list)) else f' of {len(batch)}'}: have "
            "the DataLoader's collate_fn, or transfer_batch_to_device, give that layout."
        )
    return split_batch(batch)


def _refuse_what_it_cannot_train(module: TBPTTModule) -> None:
    # What fit's start refuses, before anything trains; a callback with backward hooks is warned of.
    if module.automatic_optimization:
        raise ValueError("TBPTTModule runs under manual optimization: leave automatic_optimization False.")
    precision = str(module.trainer.precision)
    if precision not in _PRECISIONS:
        raise ValueError(
            f"TBPTTModule trains in 32- or 64-bit precision or under torch.autocast, and the Trainer has "
            f"precision={precision!r}: pass Trainer(precision='32-true'), '16-mixed' or 'bf16-mixed'."
        )
    _refuse_strategy(module.trainer.strategy)
    for callback in module.trainer.callbacks:  # type: ignore[attr-defined]  # a property Lightning adds to Trainer
        unrun = [name for name in _BACKWARD_HOOKS[1:] if _overrides(callback, name)]
        if unrun:
            message = f"the callback {type(callback).__name__} writes {unrun[0]}, {_BACKWARD_HOOKS_UNRUN}"
            warnings.warn(message, UserWarning, stacklevel=2)
    for config in module.trainer.lr_scheduler_configs:
        if isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ValueError(
                "configure_optimizers gave a ReduceLROnPlateau, which steps on a monitored metric that Lightning "
                "drops under manual optimization: step it yourself on val_loss (on_validation_epoch_end), or "
                "use a scheduler that steps by count."
            )


def _scaler(module: TBPTTModule, optimizer: Any) -> torch.amp.GradScaler | None:
    # One optimizer, and the precision plugin's GradScaler (16-mixed) if any, which it can clip under.
    if isinstance(optimizer, list):
        raise ValueError(
            f"configure_optimizers gave {len(optimizer)} optimizers; TBPTTModule steps one. "
            "Return one optimizer (several parameter groups if the parameters need other settings)."
        )
    # 16-mixed: each backward pass is scaled by the plugin's GradScaler, whose step (in the wrapper's) unscales,
    # skips a step of inf/NaN gradients and updates the scale. training_step runs under the plugin's autocast.
    scaler = getattr(module.trainer.precision_plugin, "scaler", None)
    if scaler is not None and module.gradient_clip_val is not None and skips_on_device(optimizer):
        raise ValueError(
            f"{type(optimizer.optimizer).__name__} unscales the gradients inside its own step (fused=True), after "
            "the clipping, which would then clip scaled gradients; Lightning refuses it too: pass fused=False, or "
            "no gradient_clip_val, with precision='16-mixed'."
        )
    return scaler


def _refuse_strategy(strategy: Any) -> None:
    # One device, or DDP: the trainer calls the model itself, window by window, so a strategy whose wrapper's
    # forward gathers sharded parameters (FSDP, DeepSpeed) or compiles for XLA would be bypassed. DDP's wrapper is
    # left idle: its reducer waits for manual_backward, and the trainer sums gradients once per optimizer step.
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy, XLAStrategy

    other = isinstance(strategy, (DeepSpeedStrategy, XLAStrategy)) or type(strategy).__name__.endswith("XLAStrategy")
    if isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) and not other:
        return
    raise ValueError(
        f"TBPTTModule trains on one device or with Trainer(strategy='ddp'), and the Trainer's strategy is "
        f"{type(strategy).__name__}, which shards or places the parameters through its own wrapper or hooks; the "
        "trainer calls the model window by window, past them. Use strategy='ddp'; for parameters sharded with FSDP2 "
        "(fully_shard), train with create_tbptt_trainer, which supports them."
    )
