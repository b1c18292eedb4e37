"""Hugging Face's Mamba2 trained with TBPTT(k1, k2): its state carried as tensors, a fresh cache for every call.

Mamba2 (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured State
Space Duality", ICML; arXiv:2405.21060) computes a chunk of a sequence from the state the chunk starts from: the
block decomposition of section 6 passes the state from chunk to chunk (6.2, "Low-Rank Blocks", the centre factors:
the inter-chunk recurrence), and its Listing 1, ``ssd(X, A, B, C, block_len, initial_states)``, takes that state in
and returns the final one. Hugging Face's ``Mamba2ForCausalLM`` (transformers 5.24, the pure-PyTorch path) does the same
in ``mamba2_chunk_scan(..., initial_states=...)``, and its causal convolution reads the last inputs of the chunk
before. So the state of a layer is two tensors, and a model call over a chunk with them in equals, as arithmetic, the
call over the whole sequence: the gradient of TBPTT flows through them as through an LSTM's ``(h, c)``.

The model keeps them in a ``Cache`` that it writes in place (``copy_`` into the cache's tensors), which the trainer
refuses for a state it hands out (it keeps it, for the retained history, recomputation and checkpoints).
:func:`mamba2_model_fn` builds a fresh cache for every call, copies the carried state into it, and returns the cache's
new tensors as the state: the tensors the trainer gave are only read, and the copies pass the gradient back to them.
:func:`mamba2_reset_hidden` zeroes the columns where a sequence starts, and :func:`check_mamba2_schedule` refuses,
when the trainer is built, the schedules that would give a model call of one step (below).

The state is a tuple with one ``(conv, ssm)`` pair per layer:

- ``conv``: ``(B, conv_dim, conv_kernel)``, the last ``conv_kernel`` inputs of the layer's causal convolution, in the
  model's dtype, ``conv_dim = expand * hidden_size + 2 * n_groups * state_size``;
- ``ssm``: ``(B, num_heads, head_dim, state_size)``, the state of the SSM, always ``float32``: the scan casts its
  inputs to ``float32`` and computes in it whatever the model's dtype (``mamba2_chunk_scan`` calls ``.float()``), so a
  ``float64`` model agrees with a brute-force reference to ``float32``'s rounding (its gradients to about 1e-7 of
  their size in ``tests/models/test_mamba2.py``), not to 1e-12.

A one-step call that starts from a state runs Hugging Face's single-step path (``mamba2_selective_state_update``),
which writes the new SSM state into the tensor its own backward pass needs: no gradient can flow through it (autograd
reports ``one of the variables needed for gradient computation has been modified by an inplace operation``).
:func:`mamba2_model_fn` refuses such a call while gradients are recorded (evaluation, under ``torch.no_grad()``, runs
it). Under the trainer every call but a stream's first starts from a state, so every model call must cover two steps
or more: ``k1 >= 2``; ``k2 >= k1`` (at ``k2 < k1`` each step before the cut is a call of its own); ``(k2 - k1) % k1``
neither 1 nor ``k1 - 1`` (the cuts of later windows split a window there); batches a multiple of ``k1`` steps long
with ``carry_hidden=True`` (or at least not ending one step from a window's end or cut), an epoch's stream not one
step longer than a multiple of ``k1``; ``recompute`` None or a length that leaves no one-step piece; and sequence
starts not one step from a window's start, end or cut, which ``pack_sequences(..., align=k1)`` guarantees.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..planning import Schedule, SegmentPlan, walk
from .columns import zero_columns

__all__ = ["mamba2_model_fn", "mamba2_reset_hidden", "check_mamba2_schedule"]

#: What the one-step error tells the user to change.
_ONE_STEP_FIX = (
    "every model call after a stream's first must cover two steps or more: k1 >= 2, k2 >= k1 with (k2 - k1) % k1 "
    "neither 1 nor k1 - 1, batches a multiple of k1 steps long, recompute=None, and sequence starts on window starts "
    "(pack_sequences(..., align=k1)); check_mamba2_schedule(k1, k2, batch_length=...) checks the schedule when the "
    "trainer is built"
)


def mamba2_model_fn(model: torch.nn.Module, x: torch.Tensor, state: Any) -> tuple[torch.Tensor, tuple]:
    """Hugging Face Mamba2's forward over a chunk, from a carried state to a new one; a ``model_fn`` for the trainer.

    Pass it with ``time_dim=1`` and :func:`mamba2_reset_hidden`::

        trainer = create_tbptt_trainer(model, optimizer, loss_fn, k1=16, k2=32, time_dim=1, carry_hidden=True,
                                       model_fn=mamba2_model_fn, reset_hidden=mamba2_reset_hidden)

    Every call builds a fresh ``DynamicCache``, copies ``state`` into it (``update_conv_state`` and
    ``update_recurrent_state``, the cache's own methods, which copy into new tensors) and runs the model's own forward
    with it; the model then writes into the cache, never into ``state``. The cache's tensors after the call are the
    new state, with their graph back to ``state``. With ``state`` None the model starts from zeros, as its own forward
    does. Chunked so, the logits and the final state equal those of one call over the whole sequence.

    Args:
        model: a ``transformers`` ``Mamba2ForCausalLM`` (logits out) or ``Mamba2Model`` (its last hidden states out).
        x: token ids ``(B, T)`` (int64), or input embeddings ``(B, T, hidden_size)`` (floating point); time is
            dimension 1.
        state: None at a stream's start, else the state this function returned: a tuple with one ``(conv, ssm)``
            pair per layer, ``conv`` of shape ``(B, conv_dim, conv_kernel)`` and ``ssm`` of shape
            ``(B, num_heads, head_dim, state_size)`` (float32), as the module's docstring describes.

    Returns:
        The logits ``(B, T, vocab_size)`` (``Mamba2Model``: hidden states ``(B, T, hidden_size)``) and the new state,
        a tuple of ``(conv, ssm)`` pairs with the shapes above.

    Raises:
        TypeError: if ``model`` is not a Mamba2 of ``transformers``, or ``state`` is a ``Cache`` or another object
            than a tuple of ``(conv, ssm)`` tensor pairs (a cache is written in place by every call: carry the
            tensors this function returns).
        ValueError: if ``x`` has one step, ``state`` is given and gradients are recorded (Hugging Face's single-step
            path writes in place into what its backward pass needs; the message says what to change); if
            ``state`` has another number of layers, or a tensor of another shape than the model and ``x`` give
            (naming it, ``state[i][j]``). Both before anything is computed or written.
        RuntimeError: if the model left its cache empty (a transformers older than 5.24, whose Mamba2 takes its
            cache under another name).
    """
    from transformers import DynamicCache

    config = _mamba2_config(model)
    batch, steps = x.shape[0], x.shape[1]
    if state is not None:
        _check_state(state, config, batch)
        if steps == 1 and torch.is_grad_enabled():
            raise ValueError(
                f"mamba2_model_fn was given a segment of one step (x of shape {tuple(x.shape)}) with a carried state. "
                "Hugging Face's Mamba2 runs it through its single-step path (mamba2_selective_state_update), which "
                "writes the new SSM state into the tensor its own backward pass needs, so no gradient can flow "
                f"through it; {_ONE_STEP_FIX}."
            )
    cache = DynamicCache(config=config)
    if state is not None:
        for i, (conv, ssm) in enumerate(state):
            cache.update_conv_state(conv, i, conv_kernel_size=config.conv_kernel)
            cache.update_recurrent_state(ssm, i)
    inputs = {"inputs_embeds": x} if x.is_floating_point() else {"input_ids": x}
    out = model(**inputs, cache=cache, use_cache=True)
    new_state = tuple((cache.get_conv_state(i), cache.get_recurrent_state(i)) for i in range(config.num_hidden_layers))
    if any(t is None for pair in new_state for t in pair):  # a transformers whose Mamba2 takes no `cache=`
        raise RuntimeError(
            "the Mamba2 model left its cache empty: mamba2_model_fn needs transformers >= 5.24, whose Mamba2 "
            "takes the cache as `cache=` and keeps its state with get_conv_state and get_recurrent_state."
        )
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state), new_state


def _mamba2_config(model: torch.nn.Module) -> Any:
    from transformers import Mamba2ForCausalLM, Mamba2Model

    if not isinstance(model, (Mamba2ForCausalLM, Mamba2Model)):
        raise TypeError(
            f"mamba2_model_fn runs a transformers Mamba2ForCausalLM or Mamba2Model, got {type(model).__name__}."
        )
    return model.config


def _state_shapes(config: Any, batch: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of one layer's ``(conv, ssm)`` state for ``batch`` columns of a model of ``config``."""
    conv_dim = int(config.expand * config.hidden_size) + 2 * config.n_groups * config.state_size
    return (batch, conv_dim, config.conv_kernel), (batch, config.num_heads, config.head_dim, config.state_size)


def _check_state(state: Any, config: Any, batch: int) -> None:
    from transformers import Cache

    if isinstance(state, Cache):
        raise TypeError(
            "mamba2_model_fn was given a transformers Cache as the state. The model writes into its cache in place "
            "at every call, which would change the state the trainer keeps (retained history, recomputation, "
            "checkpoints): carry the tuple of (conv, ssm) tensors mamba2_model_fn returns, and it builds a fresh "
            "cache for every call."
        )
    layers = config.num_hidden_layers
    if not isinstance(state, (tuple, list)) or len(state) != layers:
        raise TypeError(
            f"the Mamba2 state must be a tuple of {layers} (conv, ssm) pairs, one per layer, as mamba2_model_fn "
            f"returns it; got {type(state).__name__}"
            + (f" of {len(state)}" if isinstance(state, (tuple, list)) else "")
            + "."
        )
    expected = _state_shapes(config, batch)
    for i, pair in enumerate(state):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"state[{i}] must be a (conv, ssm) pair of tensors, got {type(pair).__name__}.")
        for j, (tensor, shape) in enumerate(zip(pair, expected)):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"state[{i}][{j}] must be a tensor, got {type(tensor).__name__}.")
            if tuple(tensor.shape) != shape:
                what = ("conv", "ssm")[j]
                raise ValueError(
                    f"state[{i}][{j}] (the {what} state of layer {i}) has shape {tuple(tensor.shape)}, but this model "
                    f"and a batch of {batch} columns need {shape}: pass the state mamba2_model_fn returned for the "
                    "same columns."
                )


def mamba2_reset_hidden(state: Any, starts: torch.Tensor) -> Any:
    """Zero the state of the columns where a sequence starts: the ``reset_hidden`` for :func:`mamba2_model_fn`.

    Every tensor of the state is batch-first, ``(B, ...)``, unlike the ``(layers, B, H)`` of ``nn.LSTM`` that the
    trainer's default reset expects. Zeros are the state the model starts from without one. ``masked_fill`` gives
    the replaced entries a zero gradient, so no gradient flows into a column's previous sequence.

    Args:
        state: the Mamba2 state, a tuple of ``(conv, ssm)`` pairs of ``(B, ...)`` tensors.
        starts: bool tensor of shape ``(B,)``, True for the columns to reset.

    Returns:
        The state with the starting columns zeroed, new tensors; the other columns keep their values.

    Raises:
        ValueError: if a tensor of ``state`` does not have ``B`` columns in dimension 0.

    Examples:
        >>> conv, ssm = torch.ones(3, 4, 2), torch.ones(3, 2, 2, 2)  # (B, conv_dim, kernel), (B, heads, dim, N)
        >>> new = mamba2_reset_hidden(((conv, ssm),), torch.tensor([False, True, False]))
        >>> new[0][1][:, 0, 0, 0].tolist()
        [1.0, 0.0, 1.0]
    """
    return zero_columns(state, starts, "mamba2_reset_hidden")


def check_mamba2_schedule(
    k1: int, k2: int | None = None, *, batch_length: int | None = None, recompute: int | None = None
) -> None:
    """Refuse a fixed TBPTT(k1, k2) schedule under which the trainer would call Mamba2 on one step with a state.

    Call it before building the trainer. The trainer's own segment planning is walked
    (:func:`~ignite_tbptt.planning.walk`) over a stream of batches of ``batch_length`` steps (``carry_hidden=True``;
    with ``carry_hidden=False`` a batch is a stream, whose last window is ``batch_length % k1`` long), long enough to
    repeat. What the schedule does not decide is left to :func:`mamba2_model_fn`'s own check: an epoch's stream one
    step longer than a multiple of ``k1``, sequence starts one step from a window's start, end or cut, and a gradient
    reach recorded with a stride of one step.

    Args:
        k1: steps between backward passes.
        k2: steps a window's backward pass reaches back; default ``k1``.
        batch_length: steps per batch of a ``carry_hidden=True`` stream; default: batches that never end a model
            call (one long batch).
        recompute: the trainer's ``recompute``, if any.

    Raises:
        ValueError: if some model call after the stream's first would cover one step, naming the first such call
            and the fix.

    Examples:
        >>> check_mamba2_schedule(16, 32, batch_length=64)  # calls of 16 steps
        >>> check_mamba2_schedule(4, 5)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        ValueError: TBPTT(k1=4, k2=5) would call Mamba2 on the one step [3, 4) of the window [0, 4) ...
    """
    source = Schedule(k1, k1 if k2 is None else k2)
    period = math.lcm(source.k1, batch_length or 1, recompute or 1)
    horizon = 2 * period + source.k2 + source.k1
    # A stream that outlasts the window of the horizon's last step: no window walked is cut short by its end.
    planned = walk(source, horizon + source.k1, batch_length=batch_length, recompute=recompute)
    for plan in (p.plan for p in planned if isinstance(p.plan, SegmentPlan)):
        if plan.start >= horizon:
            return
        if plan.end - plan.start == 1 and plan.start > 0:
            window = plan.window
            raise ValueError(
                f"TBPTT(k1={source.k1}, k2={source.k2}) would call Mamba2 on the one step [{plan.start}, {plan.end}) "
                f"of the window [{window.start}, {window.end}) (batches of {batch_length or 'any'} steps, recompute="
                f"{recompute}), which Hugging Face's single-step path cannot backpropagate: {_ONE_STEP_FIX}."
            )
