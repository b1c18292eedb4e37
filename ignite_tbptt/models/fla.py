"""flash-linear-attention's models trained with TBPTT(k1, k2): their state carried as tensors, a fresh cache per call.

flash-linear-attention (``fla``, the packages ``fla-core`` and ``flash-linear-attention``; read and run at 0.6.0)
computes linear-attention and state-space layers chunk by chunk. Its ``chunk_*`` kernels take the state a chunk starts
from (``initial_state``) and give out the one it ends in (``output_final_state=True``), and their backward passes
take the gradient of the final state (``dht``) and return that of the initial one (``dh0``): a call over a chunk from
the carried state is, as arithmetic, the call over the whole sequence, and TBPTT's gradient flows through the state as
through an LSTM's ``(h, c)``. The layers keep that state, with the last inputs of their short convolutions, in a
``fla.models.utils.Cache``, one dict per layer (``recurrent_state``, ``conv_state``), as Hugging Face's models keep
theirs.

:func:`fla_model_fn` builds a fresh cache for every call, fills it from the carried state and returns the cache's
tensors after the call as the new state: a tuple with one dict per layer, a plain tree of tensors that the trainer
carries, cuts, resets and saves (checkpoints read it back with ``weights_only=True``). The state it is given is only
read: fla's cache replaces a layer's entries rather than writing into them, and where fla writes in place (a
one-step call without gradients, through the short convolution's or Mamba2's decoding kernel) the cache holds copies.
:func:`fla_reset_hidden` zeroes the columns where a sequence starts.

The layers it knows, and their state (``B`` columns):

- ``GatedDeltaNet`` (``GatedDeltaNetForCausalLM``): ``recurrent_state`` ``(B, num_v_heads, head_v_dim, head_k_dim)``,
  float32, values first (the layer asks its kernels for ``state_v_first=True``); ``conv_state`` a tuple of the q, k
  and v convolutions' last inputs, ``(B, key_dim, conv_size)`` twice and ``(B, value_dim, conv_size)``, if
  ``use_short_conv`` (the default). With gradients recorded the layer always runs ``chunk_gated_delta_rule``; its
  recurrent kernel, which has no backward pass (``NotImplementedError``), runs only without gradients.
- ``GatedLinearAttention`` (``GLAForCausalLM``): ``recurrent_state`` ``(B, num_heads, head_v_dim, head_k_dim)``, values
  first; ``conv_state`` as above if ``use_short_conv`` (not the default), the k and v convolutions of
  ``key_dim_per_group`` and ``value_dim_per_group`` channels. The layer runs ``fused_recurrent_gla`` on calls of up
  to 64 steps, with gradients or without, and its ``attn_mode`` on longer ones; both ``fused_recurrent_gla`` and
  ``chunk_gla`` have backward passes with ``dh0``. ``attn_mode='fused_chunk'`` is refused on calls of more than 64
  steps (fla 0.6.0 raises ``NotImplementedError``: deprecated).
- ``DeltaNet`` (``DeltaNetForCausalLM``): ``recurrent_state`` ``(B, num_heads, head_k_dim, head_v_dim)``, keys first;
  ``conv_state`` as for GatedDeltaNet. ``fused_recurrent_delta_rule`` (up to 64 steps) and ``chunk_delta_rule``
  both have backward passes.
- ``Mamba2`` (fla's ``Mamba2ForCausalLM``): ``recurrent_state`` ``(B, num_heads, head_dim, state_size)``, float32;
  ``conv_state`` ``(B, conv_dim, conv_kernel)``, one tensor. fla 0.6.0's Mamba2 layer takes no state into a call of
  more than one step: it raises ``Mamba2 cached decoding only supports a single new token per step`` when its cache
  holds one, and its sequence path starts from zeros. Such a call is refused here with the fix; a stream trains
  only at k1 = 1 (every call one step), through the layer's PyTorch path, and not where ``mamba_ssm`` is installed
  and the model is on a GPU (its one-step kernel ``selective_state_update`` writes the state in place and has no
  backward pass). Hugging Face's ``Mamba2ForCausalLM`` takes the state into its chunked scan:
  :func:`~ignite_tbptt.models.mamba2_model_fn`.

Attention layers of a hybrid model (``config.attn``) keep the keys and values of every step so far, a cache that
grows with the stream rather than a state, and are refused, as are the layers not listed (named in the error).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .columns import zero_columns

__all__ = ["fla_model_fn", "fla_reset_hidden"]

#: Calls longer than this many steps run a layer's ``mode``; shorter ones may run its recurrent kernel (fla 0.6.0).
_RECURRENT_UP_TO = 64


def fla_model_fn(model: torch.nn.Module, x: torch.Tensor, state: Any) -> tuple[torch.Tensor, tuple]:
    """An fla model's forward over a chunk, from a carried state to a new one; a ``model_fn`` for the trainer.

    Pass it with ``time_dim=1`` and :func:`fla_reset_hidden`::

        trainer = create_tbptt_trainer(model, optimizer, loss_fn, k1=64, k2=128, time_dim=1, carry_hidden=True,
                                       model_fn=fla_model_fn, reset_hidden=fla_reset_hidden)

    Every call builds a fresh ``fla.models.utils.Cache``, puts ``state`` into it (``Cache.update``, layer by layer)
    and runs the model's own forward with ``use_cache=True``; the layers replace the cache's entries with new
    tensors, which are the new state, with their graph back to ``state``. With ``state`` None the model starts from
    zeros, as its own forward does. Chunked so, the outputs and the final state equal those of one call over the
    whole sequence (to the kernels' rounding).

    Args:
        model: an fla model (``fla.models``) whose layers are GatedDeltaNet, GatedLinearAttention, DeltaNet or
            Mamba2: a ``...ForCausalLM`` (logits out) or its ``...Model`` (last hidden states out).
        x: token ids ``(B, T)`` (int64), or input embeddings ``(B, T, hidden_size)`` (floating point); time is
            dimension 1.
        state: None at a stream's start, else the state this function returned: a tuple with one dict per layer,
            ``{"recurrent_state": tensor, "conv_state": ...}`` (``conv_state`` a tuple of three tensors, one tensor
            for Mamba2, absent without short convolutions), the shapes of the module's docstring.

    Returns:
        The logits ``(B, T, vocab_size)`` (a base model: hidden states ``(B, T, hidden_size)``) and the new state.

    Raises:
        TypeError: if ``model`` is not an fla model, has a layer this adapter does not know (an attention layer of a
            hybrid, say), or ``state`` is a cache or not a tuple of one dict of tensors per layer.
        ValueError: if ``state`` holds a tensor of another shape than the model and ``x`` give (naming it,
            ``state[i]['conv_state'][j]``); if the call would run a path that fla cannot run or backpropagate
            (a Mamba2 call of more than one step from a state, one step of Mamba2's CUDA path with gradients,
            GatedLinearAttention's ``fused_chunk`` mode), with what to change. All before anything is computed.
        RuntimeError: if the model left its cache without a state it should hold (an fla whose layers keep their
            state elsewhere than 0.6.0's).
    """
    layers = _mixers(model)
    batch, steps = x.shape[0], x.shape[1]
    if state is not None:
        _check_state(state, layers, batch)
    for i, layer in enumerate(layers):
        refusal = _refusal(layer, i, steps, state is not None)
        if refusal is not None:
            raise ValueError(refusal)
    cache = _cache_from_state(state, copies=not torch.is_grad_enabled())
    inputs = {"inputs_embeds": x} if x.is_floating_point() else {"input_ids": x}
    out = model(**inputs, past_key_values=cache, use_cache=True)
    new_state = _state_from_cache(cache, layers)
    return (out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state), new_state


def fla_reset_hidden(state: Any, starts: torch.Tensor) -> Any:
    """Zero the state of the columns where a sequence starts: the ``reset_hidden`` for :func:`fla_model_fn`.

    Every tensor of the state is batch-first, ``(B, ...)``, unlike the ``(layers, B, H)`` of ``nn.LSTM`` that the
    trainer's default reset expects. Zeros are the state an fla layer starts from without a cache (its recurrent
    state, and its convolutions' zero padding). ``masked_fill`` gives the replaced entries a zero gradient, so no
    gradient flows into a column's previous sequence.

    Args:
        state: the state :func:`fla_model_fn` returned.
        starts: bool tensor of shape ``(B,)``, True for the columns to reset.

    Returns:
        The state with the starting columns zeroed, new tensors; the other columns keep their values.

    Raises:
        ValueError: if a tensor of ``state`` does not have ``B`` columns in dimension 0.

    Examples:
        >>> layer = {"recurrent_state": torch.ones(3, 2, 4, 4), "conv_state": (torch.ones(3, 8, 4),) * 3}
        >>> new = fla_reset_hidden((layer,), torch.tensor([False, True, False]))
        >>> new[0]["recurrent_state"][:, 0, 0, 0].tolist(), new[0]["conv_state"][2][:, 0, 0].tolist()
        ([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
    """
    return zero_columns(state, starts, "fla_reset_hidden")


# -- the layers ------------------------------------------------------------------------------------------------------
def _fla() -> Any:
    try:
        import fla.layers as layers
        import fla.models.utils as models
    except ImportError as error:
        raise ImportError(
            "fla_model_fn needs flash-linear-attention (pip install flash-linear-attention; its kernels need triton "
            f"and a CUDA device): {error}"
        ) from error
    return layers, models


def _mixers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The state-holding layer of each block of an fla ``model``, each checked to be one this adapter knows."""
    layers, models = _fla()
    from fla.models.modeling_utils import FLAPreTrainedModel

    if not isinstance(model, FLAPreTrainedModel):
        raise TypeError(
            f"fla_model_fn runs a model of flash-linear-attention (fla.models), got {type(model).__name__}."
        )
    known = (layers.GatedDeltaNet, layers.GatedLinearAttention, layers.DeltaNet, layers.Mamba2)
    mixers = []
    for i, block in enumerate(model.base_model.layers):
        mixer = getattr(block, "attn", None)
        mixer = getattr(block, "mixer", None) if mixer is None else mixer
        if not isinstance(mixer, known):
            why = (
                ", an attention layer, whose cache holds the keys and values of every step so far: it grows with the "
                "stream rather than carrying a state of fixed size"
                if isinstance(mixer, layers.Attention)
                else ""
            )
            raise TypeError(
                f"fla_model_fn carries the state of fla's GatedDeltaNet, GatedLinearAttention, DeltaNet and Mamba2 "
                f"layers; layer {i} of this {type(model).__name__} is {type(mixer).__name__}{why}."
            )
        mixers.append(mixer)
    return mixers


def _state_shapes(layer: Any, batch: int) -> dict[str, Any]:  # an fla layer: fla has no type information
    """The shape of each entry of ``layer``'s state for ``batch`` columns: a shape, or a tuple of the convolutions'."""
    kind = type(layer).__name__
    if kind == "Mamba2":
        return {
            "recurrent_state": (batch, layer.num_heads, layer.head_dim, layer.ssm_state_size),
            "conv_state": (batch, layer.conv_dim, layer.conv_kernel_size),
        }
    heads = layer.num_v_heads if kind == "GatedDeltaNet" else layer.num_heads
    k, v = layer.head_k_dim, layer.head_v_dim
    shapes: dict[str, Any] = {"recurrent_state": (batch, heads, k, v) if kind == "DeltaNet" else (batch, heads, v, k)}
    if layer.use_short_conv:
        convs = (layer.q_conv1d, layer.k_conv1d, layer.v_conv1d)
        shapes["conv_state"] = tuple((batch, conv.hidden_size, conv.kernel_size[0]) for conv in convs)
    return shapes


def _refusal(layer: Any, index: int, steps: int, has_state: bool) -> str | None:  # an fla layer, as above
    """Why fla cannot run, or cannot backpropagate, ``layer`` over a call of ``steps`` steps; None if it can."""
    kind = type(layer).__name__
    if kind == "GatedLinearAttention" and steps > _RECURRENT_UP_TO and layer.mode == "fused_chunk":
        return (
            f"layer {index} is a GatedLinearAttention with attn_mode='fused_chunk', which fla runs on calls of more "
            f"than {_RECURRENT_UP_TO} steps (this one has {steps}) and which fla 0.6.0 no longer has "
            "(fused_chunk_gla raises NotImplementedError): build the model with attn_mode='chunk'."
        )
    if kind != "Mamba2" or not has_state:
        return None
    if steps > 1:
        return (
            f"fla_model_fn was given a call of {steps} steps with a carried state, but fla's Mamba2 layer takes a "
            "state into one-step calls only (fla 0.6.0 raises 'Mamba2 cached decoding only supports a single new "
            "token per step', and its sequence path starts from zeros). Train it with k1 = 1, every call one step; "
            "or train Hugging Face's transformers Mamba2ForCausalLM with mamba2_model_fn, whose chunked scan takes "
            "the state in."
        )
    from fla.layers.mamba2 import is_fast_path_available

    if torch.is_grad_enabled() and is_fast_path_available and layer.in_proj.weight.device.type == "cuda":
        return (
            "fla_model_fn was given a one-step call of fla's Mamba2 with a carried state while gradients are "
            "recorded, on a CUDA device with mamba_ssm installed: the layer then runs mamba_ssm's "
            "selective_state_update, which writes the new state into the given one and has no backward pass. "
            "Uninstall mamba_ssm to train it through the layer's PyTorch path, or train Hugging Face's transformers "
            "Mamba2ForCausalLM with mamba2_model_fn."
        )
    return None


# -- the state and the cache -----------------------------------------------------------------------------------------
def _check_state(state: Any, layers: list[torch.nn.Module], batch: int) -> None:
    """Refuse a ``state`` that is not one dict of tensors per layer of the shapes ``layers`` and ``batch`` give."""
    from transformers.cache_utils import Cache

    if isinstance(state, Cache):
        raise TypeError(
            "fla_model_fn was given a Cache as the state. fla's layers update their cache at every call (and write "
            "into it in place on one-step calls without gradients), which would change the state the trainer keeps "
            "(retained history, recomputation, checkpoints): carry the tuple of dicts of tensors fla_model_fn "
            "returns, and it builds a fresh cache for every call."
        )
    if not isinstance(state, (tuple, list)) or len(state) != len(layers):
        got = type(state).__name__ + (f" of {len(state)}" if isinstance(state, (tuple, list)) else "")
        raise TypeError(
            f"the fla state must be a tuple of {len(layers)} dicts, one per layer, as fla_model_fn returns it; got "
            f"{got}."
        )
    for i, (entry, layer) in enumerate(zip(state, layers)):
        expected = _state_shapes(layer, batch)
        if not isinstance(entry, Mapping) or set(entry) != set(expected):
            keys = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
            raise TypeError(f"state[{i}] must be a dict with the keys {sorted(expected)} (layer {i}), got {keys}.")
        for key, shape in expected.items():
            if isinstance(shape[0], tuple):
                if not isinstance(entry[key], (tuple, list)) or len(entry[key]) != len(shape):
                    raise TypeError(f"state[{i}][{key!r}] must be a tuple of {len(shape)} tensors (q, k, v).")
                pairs = [(f"state[{i}][{key!r}][{j}]", t, s) for j, (t, s) in enumerate(zip(entry[key], shape))]
            else:
                pairs = [(f"state[{i}][{key!r}]", entry[key], shape)]
            for path, tensor, want in pairs:
                _check_tensor(path, tensor, want, batch)


def _check_tensor(path: str, tensor: Any, shape: tuple[int, ...], batch: int) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{path} must be a tensor, got {type(tensor).__name__}.")
    if tuple(tensor.shape) != shape:
        raise ValueError(
            f"{path} has shape {tuple(tensor.shape)}, but this model and a batch of {batch} columns need {shape}: "
            "pass the state fla_model_fn returned for the same model and columns."
        )


def _cache_from_state(state: Any, copies: bool) -> Any:
    """A fresh fla ``Cache`` holding ``state`` (None: an empty one); copies of its tensors if ``copies``."""
    _, models = _fla()
    cache = models.Cache()
    copy: Callable[[torch.Tensor], torch.Tensor] = (lambda t: t.clone()) if copies else (lambda t: t)
    for i, entry in enumerate(state or ()):
        conv = entry.get("conv_state")
        if conv is not None:
            conv = copy(conv) if isinstance(conv, torch.Tensor) else tuple(copy(t) for t in conv)
        cache.update(recurrent_state=copy(entry["recurrent_state"]), conv_state=conv, layer_idx=i, offset=0)
    return cache


def _state_from_cache(cache: Any, layers: list[torch.nn.Module]) -> tuple[dict[str, Any], ...]:
    """The state ``layers`` left in ``cache``: one dict per layer, the entries ``_state_shapes`` names."""
    state = []
    for i, layer in enumerate(layers):
        held = cache[i] if i < len(cache) else {}
        entry = {}
        for key in _state_shapes(layer, 1):
            value = held.get(key)
            if value is None or not isinstance(value, torch.Tensor) and any(t is None for t in value):
                raise RuntimeError(
                    f"layer {i} ({type(layer).__name__}) left no {key} in its cache: fla_model_fn reads the state "
                    "where flash-linear-attention 0.6.0 keeps it (Cache.update(recurrent_state=..., conv_state=...))."
                )
            entry[key] = value if isinstance(value, torch.Tensor) else tuple(value)
        state.append(entry)
    return tuple(state)
