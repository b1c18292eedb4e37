"""``create_tbptt_evaluator``: evaluate a recurrent model over streams, carrying the hidden state."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from ignite.engine import Engine, Events
from ignite.metrics import Metric

from ..checks import positive_int
from ..data.batch import prepare_batch as default_prepare_batch
from ..data.batch import resets_by_step, split_batch
from ..layout import Layout
from ..planning import Schedule, SegmentPlan, walk
from ..runtime import build_model_call, default_model_fn, default_reset_hidden, join_along

__all__ = ["create_tbptt_evaluator", "StreamEvaluation"]


class StreamEvaluation:
    """The model over one batch of a stream, without gradients, the hidden state carried to the next batch.

    What :func:`create_tbptt_evaluator` runs for each batch, and Lightning's ``validation_step`` of
    :class:`~ignite_tbptt.lightning.TBPTTModule`: the trainer's model call (the same reset at sequence starts, under
    the same autocast, with the same checks), over the segments of TBPTT(L, L), ``L = segment_length``. Arguments
    as :func:`create_tbptt_evaluator`'s.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        time_dim: int = 0,
        carry_hidden: bool = False,
        segment_length: int | None = None,
        device: str | torch.device | None = None,
        model_fn: Callable[[Any, Any, Any], tuple[Any, Any]] = default_model_fn,
        autocast_dtype: torch.dtype | None = None,
        reset_hidden: Callable[[Any, torch.Tensor], Any] = default_reset_hidden,
        module_state: Sequence[str] | None = None,
        initial_state: Callable[[int], Any] | None = None,
    ) -> None:
        if segment_length is not None:
            positive_int("segment_length", segment_length, "steps per model call")
        self.model, self.carry_hidden, self.segment_length = model, carry_hidden, segment_length
        self.layout = layout = Layout.of(time_dim)
        self.model_call = build_model_call(
            model,
            model_fn,
            device=device,
            autocast_dtype=autocast_dtype,
            reset_hidden=reset_hidden,
            module_state=module_state,
            initial_state=initial_state,
            layout=layout,
        )
        #: The hidden state at the end of the last batch (``None`` at a stream's start).
        self.hidden: Any = None

    def reset(self) -> None:
        """Start a new stream: the next batch starts from the initial state."""
        self.hidden = None

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, starts: Any = None) -> Any:
        """``y_pred`` of the batch ``x`` (``(T, B, *)`` along ``time_dim``), joined along the time dimension.

        The model runs in ``eval()`` mode and is left in the mode it was found in (a trainer's handler may evaluate
        mid-batch). ``starts``: a ``(T, B)`` bool tensor of the steps where a column starts a sequence, or ``None``.
        """
        training = self.model.training
        self.model.eval()
        try:
            y_preds = self._run_pieces(x, starts)
        finally:
            self.model.train(training)
        return join_along(y_preds, self.layout.time_dim)

    def _run_pieces(self, x: torch.Tensor, starts: Any) -> list[Any]:
        layout = self.layout
        hidden = self.hidden if self.carry_hidden else None
        length = layout.length(x)
        resets = {} if starts is None else resets_by_step(starts, x, layout)
        # The segments of the trainer's TBPTT(L, L) over the batch: pieces end every L steps and where some column
        # starts a sequence.
        windows = Schedule(self.segment_length or length, self.segment_length or length)
        walked = walk(windows, length, sequence_starts=resets)
        pieces = [(p.plan.start, p.plan.end) for p in walked if isinstance(p.plan, SegmentPlan)]
        y_preds = []
        for start, end in pieces:
            y_pred, hidden = self.model_call(layout.steps(x, start, end), hidden, starts=resets.get(start))
            y_preds.append(y_pred)
        self.hidden = hidden
        return y_preds


def create_tbptt_evaluator(
    model: torch.nn.Module,
    metrics: Mapping[str, Metric] | None = None,
    *,
    time_dim: int = 0,
    carry_hidden: bool = False,
    segment_length: int | None = None,
    device: str | torch.device | None = None,
    non_blocking: bool = False,
    prepare_batch: Callable = default_prepare_batch,
    model_fn: Callable[[Any, Any, Any], tuple[Any, Any]] = default_model_fn,
    output_transform: Callable[[Any, Any, Any], Any] = lambda x, y, y_pred: (y_pred, y),
    autocast_dtype: torch.dtype | None = None,
    reset_hidden: Callable[[Any, torch.Tensor], Any] = default_reset_hidden,
    module_state: Sequence[str] | None = None,
    initial_state: Callable[[int], Any] | None = None,
) -> Engine:
    """Create an ignite evaluator for models called as ``y_pred, hidden = model(x, hidden)``.

    Like ignite's ``create_supervised_evaluator``, with the hidden state handled the way
    :func:`~ignite_tbptt.create_tbptt_trainer` handles it: with ``carry_hidden=True`` the batches of one run
    are consecutive pieces of one stream (a validation text), the hidden state flowing from batch to batch;
    each ``evaluator.run(...)`` starts a fresh stream. The model runs in ``eval()`` mode without gradients.
    Batches ``(x, y, starts)`` reset the hidden state of a column where a sequence starts, as the trainer does,
    so that evaluating packed sequences gives each target the prediction of its sequence evaluated alone.

    Args:
        model: the model; each batch runs in ``eval()`` mode and leaves the model in the mode it found.
        metrics: ignite metrics to attach by name, e.g. ``{"bpc": BitsPerTarget(loss_fn)}``.
        time_dim: index of the time dimension of ``x``, ``y`` and ``y_pred``, as the trainer's (0 for ``(T, B, *)``,
            1 for ``(B, T, *)``, -1 for the last axis).
        carry_hidden: carry the hidden state across the batches of a run.
        segment_length: run the model on pieces of at most this many steps (bounds activation memory for very
            long batches; the result is the same); default: the whole batch in one call.
        device: device to move batches to.
        non_blocking: passed to ``prepare_batch``.
        prepare_batch: ``prepare_batch(batch, device, non_blocking) -> (x, y)`` or ``(x, y, starts)``.
        model_fn: ``model_fn(model, x, hidden) -> (y_pred, hidden)``, ``hidden`` None at a stream's start.
        output_transform: ``output_transform(x, y, y_pred)``; default ``(y_pred, y)`` for ignite metrics, with
            ``y_pred`` the batch's predictions joined along ``time_dim``.
        autocast_dtype: run the model under ``torch.autocast`` with this dtype.
        reset_hidden: ``reset_hidden(hidden, starts) -> hidden``, as in :func:`~ignite_tbptt.create_tbptt_trainer`.
        module_state: the model's attributes that hold its hidden state, as in
            :func:`~ignite_tbptt.create_tbptt_trainer`.
        initial_state: ``initial_state(batch_size) -> hidden``, as in :func:`~ignite_tbptt.create_tbptt_trainer`.

    Returns:
        An ignite ``Engine``.

    Raises:
        TypeError: if ``segment_length`` or ``time_dim`` is not an int. During a run, if ``starts`` is not a bool
            tensor, or ``model_fn`` does not return ``(y_pred, hidden)``.
        ValueError: if ``segment_length`` is not positive. During a run, if ``starts`` has the wrong shape, the
            default ``reset_hidden`` cannot reset the hidden state, or the hidden state changes shape.

    Examples:
        >>> import torch
        >>> from ignite_tbptt import BitsPerTarget, create_tbptt_evaluator
        >>> gru = torch.nn.GRU(input_size=1, hidden_size=1)  # gru(x, hidden) -> (y_pred, hidden)
        >>> bits = BitsPerTarget(torch.nn.functional.mse_loss)
        >>> evaluator = create_tbptt_evaluator(gru, {"bits": bits}, carry_hidden=True)
        >>> x = torch.randn(6, 2, 1)  # (T, B, 1): one stream of 6 steps in 2 batches
        >>> state = evaluator.run([(x[:3], x[:3]), (x[3:], x[3:])])
        >>> list(state.metrics)
        ['bits']
    """
    evaluation = StreamEvaluation(
        model,
        time_dim=time_dim,
        carry_hidden=carry_hidden,
        segment_length=segment_length,
        device=device,
        model_fn=model_fn,
        autocast_dtype=autocast_dtype,
        reset_hidden=reset_hidden,
        module_state=module_state,
        initial_state=initial_state,
    )

    @torch.no_grad()  # output_transform's too
    def evaluate(engine: Engine, batch: Sequence[Any]) -> Any:
        x, y, starts = split_batch(prepare_batch(batch, device=device, non_blocking=non_blocking))
        return output_transform(x, y, evaluation(x, starts))

    evaluator = Engine(evaluate)
    evaluator.add_event_handler(Events.EPOCH_STARTED, lambda _: evaluation.reset())
    for name, metric in (metrics or {}).items():
        metric.attach(evaluator, name)
    return evaluator
