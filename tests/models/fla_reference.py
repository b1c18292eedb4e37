"""flash-linear-attention's models without Triton: every kernel their layers call replaced by plain PyTorch.

fla's layers call Triton kernels (the recurrences, the short convolutions, the norms, SwiGLU, SiLU), which run on a
CUDA device only. :func:`use_reference_kernels` swaps each, in the namespaces the layers import them into, for a
plain-PyTorch function of the same arguments: fla's own references where fla has one (``naive_recurrent_gla``,
``naive_recurrent_gated_delta_rule``, ``delta_rule_recurrence``, ``naive_gdn_gate``, ``rms_norm_ref``), a few lines
here where it has none (the short convolution with its cache, the gated RMS norm, SwiGLU). The layers' own code (how
they choose a kernel, read and fill their cache, lay out the state) runs as it is, so the adapter is tested against it
on any device; the recurrences then compute in float32 whatever the model's dtype, as fla's references do.

``calls`` records the name of every recurrence a layer called, so a test can check which kernel a layer chose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "use_reference_kernels",
    "reference_gated_delta_rule",
    "reference_gla",
    "reference_delta_rule",
    "reference_short_convolution",
]


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """fla's ``l2norm``: ``x / sqrt(sum(x^2) + 1e-6)`` over the last dimension."""
    return x / torch.sqrt(x.float().square().sum(-1, keepdim=True) + 1e-6).to(x.dtype)


def _to_kv(state: torch.Tensor | None, v_first: bool) -> torch.Tensor | None:
    """A recurrent state in the ``[K, V]`` layout of fla's references, from the layer's (``[V, K]`` if v_first)."""
    return state.transpose(-1, -2) if state is not None and v_first else state


def reference_gated_delta_rule(calls, name):
    from fla.ops.gated_delta_rule import naive_recurrent_gated_delta_rule
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **options):
        calls.append(name)
        assert options.get("cu_seqlens") is None
        if options.get("use_qk_l2norm_in_kernel"):
            q, k = _l2norm(q), _l2norm(k)
        if options.get("use_beta_sigmoid_in_kernel"):
            beta = beta.sigmoid() * (2.0 if options.get("allow_neg_eigval") else 1.0)
        if options.get("use_gate_in_kernel"):
            g = naive_gdn_gate(g, options["A_log"], options.get("dt_bias"))
        if v.shape[2] > q.shape[2]:  # grouped value heads
            q, k = (t.repeat_interleave(v.shape[2] // q.shape[2], dim=2) for t in (q, k))
        v_first = options.get("state_v_first", False)
        o, final = naive_recurrent_gated_delta_rule(
            q, k, v, beta, g, scale, _to_kv(initial_state, v_first), output_final_state
        )
        return o.to(v.dtype), _to_kv(final, v_first)

    return kernel


def reference_gla(calls, name):
    from fla.ops.gla.naive import naive_recurrent_gla

    def kernel(q, k, v, gk=None, g=None, scale=None, initial_state=None, output_final_state=False, **options):
        calls.append(name)
        assert options.get("cu_seqlens") is None and scale is None
        v_first = options.get("state_v_first", False)
        gate = gk if gk is not None else g
        o, final = naive_recurrent_gla(q, k, v, gate, _to_kv(initial_state, v_first), output_final_state)
        return o, _to_kv(final, v_first)

    return kernel


def reference_delta_rule(calls, name):
    from fla.ops.delta_rule.naive import delta_rule_recurrence

    def kernel(q, k, v, beta=None, scale=None, initial_state=None, output_final_state=False, **options):
        calls.append(name)
        assert options.get("cu_seqlens") is None and scale is None
        if options.get("use_qk_l2norm_in_kernel"):
            q, k = _l2norm(q), _l2norm(k)
        heads_first = [t.transpose(1, 2) for t in (q, k, v, beta)]
        o, final = delta_rule_recurrence(*heads_first, initial_state, output_final_state)
        return o.transpose(1, 2), final

    return kernel


def reference_short_convolution(self, x, residual=None, mask=None, cache=None, output_final_state=False, **options):
    """``ShortConvolution.forward``: a depthwise causal convolution over ``x`` ``[B, T, D]`` continuing ``cache``.

    ``cache`` ``[B, D, W]`` holds the last ``W`` inputs before ``x`` (zeros at a sequence's start); the output at
    step t reads the ``W`` inputs up to t, ``weight[:, -1]`` the newest; the final state is the last ``W`` inputs.
    """
    assert residual is None and mask is None and options.get("cu_seqlens") is None
    width = self.kernel_size[0]
    if cache is None:
        cache = x.new_zeros(x.shape[0], x.shape[2], width)
    joined = torch.cat([cache.to(x.dtype), x.transpose(1, 2)], -1)  # [B, D, W + T]
    y = F.conv1d(joined[..., 1:], self.weight, self.bias, groups=self.hidden_size).transpose(1, 2)
    if self.activation is not None:
        y = F.silu(y)
    return y, (joined[..., -width:] if output_final_state else None)


def _causal_conv1d(x, weight=None, bias=None, activation=None, **options):
    """``causal_conv1d`` from no state (the fused q/k/v convolution of a call without a cache)."""
    assert options.get("initial_state") is None and options.get("residual") is None
    y = F.conv1d(F.pad(x.transpose(1, 2), (weight.shape[1] - 1, 0)), weight[:, None], bias, groups=weight.shape[0])
    y = y.transpose(1, 2)
    return (F.silu(y) if activation is not None else y), None


def _rms_norm(self, x, residual=None, prenorm=False, residual_in_fp32=False):
    from fla.modules.norm.layernorm import rms_norm_ref

    return rms_norm_ref(x, self.weight, self.bias, residual=residual, eps=self.eps, prenorm=prenorm, upcast=True)


def _rms_norm_gated(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    """``FusedRMSNormGated``: ``rms_norm(x) * weight * act(g)``, computed in float32."""
    assert residual is None and not prenorm
    y = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps)
    if self.weight is not None:
        y = y * self.weight.float()
    gate = g.float().sigmoid() if self.activation == "sigmoid" else F.silu(g.float())
    return (y * gate).to(x.dtype)


def _rms_norm_grouped(self, x, z=None):
    """Mamba2's ``RMSNormGated`` (``norm_before_gate``, groups), fla's ``rms_norm_ref``."""
    from fla.modules.norm.layernorm_gated import rms_norm_ref

    return rms_norm_ref(x, self.weight, self.bias, z, self.eps, self.group_size, self.norm_before_gate)


def use_reference_kernels(monkeypatch) -> list[str]:
    """Replace, for this test, every Triton kernel the GatedDeltaNet, GLA, DeltaNet and Mamba2 models of fla call.

    Call it before building the model (Mamba2's layers look their activation up when built). Returns the list to
    which the recurrences append their names (``chunk_gla``, ``fused_recurrent_gla``, ...) as the layers call them.
    """
    import fla.layers.delta_net as delta_net
    import fla.layers.gated_deltanet as gated_deltanet
    import fla.layers.gla as gla
    import fla.modules.activations as activations
    import fla.modules.mlp as mlp
    from fla.modules import FusedRMSNormGated, RMSNorm, ShortConvolution
    from fla.modules.layernorm_gated import RMSNormGated

    calls: list[str] = []
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        monkeypatch.setattr(gated_deltanet, name, reference_gated_delta_rule(calls, name))
    for name in ("chunk_gla", "fused_recurrent_gla", "fused_chunk_gla"):
        monkeypatch.setattr(gla, name, reference_gla(calls, name))
    for name in ("chunk_delta_rule", "fused_recurrent_delta_rule"):
        monkeypatch.setattr(delta_net, name, reference_delta_rule(calls, name))
    monkeypatch.setattr(gated_deltanet, "causal_conv1d", _causal_conv1d)
    monkeypatch.setattr(ShortConvolution, "forward", reference_short_convolution)
    monkeypatch.setattr(RMSNorm, "forward", _rms_norm)
    monkeypatch.setattr(FusedRMSNormGated, "forward", _rms_norm_gated)
    monkeypatch.setattr(RMSNormGated, "forward", _rms_norm_grouped)
    monkeypatch.setattr(mlp, "swiglu", lambda x, y: F.silu(x) * y)
    monkeypatch.setattr(
        mlp.SwiGLULinear, "forward", lambda self, x, y, weight, bias: F.linear(F.silu(x) * y, weight, bias)
    )
    for name in ("silu", "swish"):
        monkeypatch.setitem(activations.ACT2FN, name, F.silu)
    monkeypatch.setitem(activations.ACT2FN, "sigmoid", torch.sigmoid)
    monkeypatch.setitem(activations.ACT2FN, "logsigmoid", F.logsigmoid)
    return calls
