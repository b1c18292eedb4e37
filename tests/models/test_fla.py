"""flash-linear-attention's models through ``fla_model_fn``: chunked equals whole, TBPTT exact, refusals, resume.

The tests that run a model run twice, once per set of kernels:

- ``reference``: every Triton kernel the layers call replaced by plain PyTorch (fla's naive references,
  ``fla_reference.py``). The layers' own code (which kernel they pick, how they read and fill their cache, how they lay
  out the state) runs as it is, so the adapter is tested against it on any device, the CPU included.
- ``triton``: fla's own kernels, which run on a CUDA device only: ``python -m pytest tests/models/test_fla.py --device
  cuda``. These are the proof that the kernels' backward passes carry the state's gradient (``dh0`` from ``dht``);
  elsewhere they skip, saying so. Their float32 matrix products are IEEE (``TRITON_F32_DEFAULT=ieee``), not TF32.

The references run the model's own forward (``model(input_ids, past_key_values=cache)``) on each document alone,
from zeros or from the cache of its prefix run without gradients: nothing of the adapter is shared. fla's recurrences
compute in float32 (its references as its kernels), so the models are float32, and the gradients agree to float32's
rounding relative to their largest entry (``TOLERANCE``).
"""

import copy
import functools
import subprocess
import sys

import pytest
import torch
from ignite.engine import Events
from torch import nn

from ignite_tbptt import TBPTTEvents, create_tbptt_evaluator, create_tbptt_trainer
from ignite_tbptt.models import fla_model_fn, fla_reset_hidden

from ..helpers import assert_resume_is_bit_identical
from .fla_reference import reference_short_convolution, use_reference_kernels


@functools.cache
def fla_models():
    """fla's models, imported at the first test that runs one: not as the suite is collected (fla takes seconds)."""
    import fla.models

    return fla.models


def Cache():  # noqa: N802 - fla's cache class, made where a test needs one
    from fla.models.utils import Cache as FlaCache

    return FlaCache()


@pytest.fixture
def fla_importable():
    try:
        fla_models()
    except ImportError as error:  # not installed, or installed without triton (its modules import triton)
        pytest.skip(f"flash-linear-attention cannot be imported ({error}): pip install flash-linear-attention triton")


needs_fla = pytest.mark.usefixtures("fla_importable")
ON_CUDA = "fla's Triton kernels run on a CUDA device only: python -m pytest tests/models/test_fla.py --device cuda"
on_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=f"no CUDA device here; {ON_CUDA}")

VOCAB = 11
# Column 0 holds the documents [0, 6) and [6, 24); column 1 one document; column 2 [0, 10), [10, 18), [18, 24).
STARTS = {0: (6,), 1: (), 2: (10, 18)}
STEPS = 24
# Largest difference allowed between two outputs, states or gradients, relative to the largest entry of the reference's
# (float32: the reference runs each document alone, whose products round otherwise than the trainer's batch).
TOLERANCE = {"reference": 3e-5, "triton": 1e-4}
# name: (config class, model class, sizes); hidden size 32 and two layers for all.
MODELS = {
    "gated_deltanet": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", {"num_heads": 2, "head_dim": 8}),
    "gla": ("GLAConfig", "GLAForCausalLM", {"num_heads": 2, "use_short_conv": True}),
    "delta_net": ("DeltaNetConfig", "DeltaNetForCausalLM", {"num_heads": 2}),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", {"head_dim": 16, "state_size": 8, "expand": 2, "chunk_size": 4}),
}


def build_model(name, seed=0, **options):
    """A tiny fla model (hidden size 32, two layers), its projections drawn large enough that the state matters."""
    config_class, model_class, sizes = MODELS[name]
    torch.manual_seed(seed)
    config = getattr(fla_models(), config_class)(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        fuse_norm=False,
        fuse_swiglu=False,
        fuse_cross_entropy=False,
        tie_word_embeddings=False,
        **{**sizes, **options},
    )
    model = getattr(fla_models(), model_class)(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0, 0.5)
    return model


@pytest.fixture(params=["reference", "triton"])
def kernels(request, monkeypatch):
    """Which kernels the layers run: ``"reference"`` (plain PyTorch, any device) or ``"triton"`` (fla's, CUDA)."""
    if request.param == "triton":
        if not torch.cuda.is_available():
            pytest.skip(f"no CUDA device here; {ON_CUDA}")
        if torch.device(request.config.getoption("--device")).type != "cuda":
            pytest.skip(ON_CUDA)
        monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    else:
        use_reference_kernels(monkeypatch)
    return request.param


def tokens(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, shape, generator=g, device="cpu").to(torch.get_default_device())


def make_batches(lengths=(12, 12), columns=3, seed=0):
    """``(x, y, starts)`` batches of ``(B, T)`` token ids, time in dimension 1, with the starts of ``STARTS``."""
    stream = tokens((columns, sum(lengths) + 1), seed)
    starts = torch.zeros(columns, sum(lengths), dtype=torch.bool)
    for column, steps in STARTS.items():
        if column < columns:
            starts[column, [t for t in steps if t < sum(lengths)]] = True
    batches, at = [], 0
    for length in lengths:
        piece = slice(at, at + length)
        batches.append((stream[:, :-1][:, piece], stream[:, 1:][:, piece], starts[:, piece]))
        at += length
    return batches


def documents(batches):
    """``(column, start, end)`` of every document of the joined batches."""
    starts = torch.cat([s for _, _, s in batches], 1)
    found = []
    for column in range(starts.shape[0]):
        edges = [0, *(int(t) for t in starts[column].nonzero().flatten() if t > 0), starts.shape[1]]
        found += [(column, a, b) for a, b in zip(edges, edges[1:])]
    return found


def own_forward(model, x, cache=None):
    """The model's own forward over ``x`` ``(1, T)``, continuing ``cache`` (None: from zeros); the logits.

    fla's Mamba2 takes a cache into one-step calls only, so from a cache it is called step by step.
    """
    if cache is None:
        return model(x).logits
    if isinstance(model, fla_models().Mamba2ForCausalLM) and len(cache) > 0:
        return torch.cat([own_forward_step(model, x[:, t : t + 1], cache) for t in range(x.shape[1])], 1)
    return model(x, past_key_values=cache, use_cache=True).logits


def own_forward_step(model, x, cache):
    return model(x, past_key_values=cache, use_cache=True).logits


def prefix_cache(model, x):
    """A cache holding the state after the model's own forward over ``x`` ``(1, T)``, without gradients."""
    cache = Cache()
    with torch.no_grad():
        own_forward(model, x, cache)
    return cache


def reference_gradient(model, batches, k1, k2):
    """Mean-loss gradient of TBPTT(k1, k2), k2 >= k1, from the model's own forward on each document alone.

    Window ``[s, e)`` of the stream's grid (``k1`` steps) backpropagates its losses to the cut ``s - (k2 - k1)``: its
    steps in a document are run from the document's state at the cut (or from zeros at the document's start, if that
    lies after the cut), computed without gradients, and only their own losses are summed.
    """
    x = torch.cat([b[0] for b in batches], 1)
    y = torch.cat([b[1] for b in batches], 1)
    model.zero_grad()
    for column, start, end in documents(batches):
        for s in range(0, x.shape[1], k1):
            a, b = max(s, start), min(s + k1, end)
            if a >= b:
                continue
            cut = max(start, s - (k2 - k1))
            cache = prefix_cache(model, x[column : column + 1, start:cut]) if cut > start else None
            logits = own_forward(model, x[column : column + 1, cut:b], cache)[:, a - cut :]
            nn.functional.cross_entropy(logits[0], y[column, a:b], reduction="sum").backward()
    return [p.grad / y.numel() for p in model.parameters()]


def cross_entropy(y_pred, y):
    return nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten())


def fla_trainer(model, optimizer, k1, k2, **options):
    """The trainer as the adapter is used: batch-first, one carried stream, fla's call and reset."""
    return create_tbptt_trainer(
        model,
        optimizer,
        cross_entropy,
        k1,
        k2,
        time_dim=1,
        carry_hidden=True,
        model_fn=fla_model_fn,
        reset_hidden=fla_reset_hidden,
        **options,
    )


def trainer_gradient(model, batches, k1, k2):
    """The gradient of the trainer's one optimizer step (learning rate 0, every window accumulated into it)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = fla_trainer(model, optimizer, k1, k2, gradient_accumulation_steps=100)
    steps = []
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_STARTED, lambda e: steps.append([p.grad.clone() for p in model.parameters()])
    )
    trainer.run(batches)
    assert len(steps) == 1
    return steps[0]


def relative_difference(got, want):
    """The largest difference between two lists of tensors, relative to the largest entry of ``want``."""
    scale = max(w.abs().max().item() for w in want)
    return max((g - w).abs().max().item() for g, w in zip(got, want)) / scale


# -- without fla -----------------------------------------------------------------------------------------------------
def test_importing_the_package_and_its_adapters_does_not_import_fla():
    code = (
        "import sys, ignite_tbptt, ignite_tbptt.models; "
        "assert not any(m == 'fla' or m.startswith('fla.') for m in sys.modules), 'fla imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_reset_zeroes_the_starting_columns_of_every_tensor_and_refuses_other_layouts():
    layer = {"recurrent_state": torch.ones(3, 2, 4, 2), "conv_state": tuple(torch.ones(3, 5, 4) for _ in range(3))}
    reset = fla_reset_hidden((layer, {"recurrent_state": torch.ones(3, 2, 4, 2)}), torch.tensor([True, False, True]))
    leaves = [reset[0]["recurrent_state"], *reset[0]["conv_state"], reset[1]["recurrent_state"]]
    for tensor in leaves:
        assert tensor.flatten(1).sum(1).tolist() == [0.0, tensor[0].numel(), 0.0]
    with pytest.raises(ValueError, match=r"fla_reset_hidden zeroes columns of \(B, \.\.\.\) tensors with B = 3"):
        fla_reset_hidden(({"recurrent_state": torch.ones(2, 3, 4)},), torch.tensor([True, False, True]))


# -- the forward -----------------------------------------------------------------------------------------------------
# Pieces of one step, of up to 64 steps (GLA's and DeltaNet's recurrent kernels) and longer (their chunk kernels);
# fla's Mamba2 takes a state into one-step calls only.
PIECES = {"mamba2": [0, 5, *range(6, 14)], None: [0, 1, 66, 70, 150]}


@needs_fla
@pytest.mark.parametrize("name", MODELS)
def test_chunked_calls_with_the_carried_state_equal_one_call_over_the_whole_sequence(name, kernels):
    model = build_model(name)
    edges = PIECES.get(name, PIECES[None])
    x = tokens((3, edges[-1]), seed=1)
    cache = Cache()
    whole = model(x, past_key_values=cache, use_cache=True).logits  # gradients recorded: the training kernels
    state, pieces = None, []
    for a, b in zip(edges, edges[1:]):
        logits, state = fla_model_fn(model, x[:, a:b], state)
        pieces.append(logits)
    assert relative_difference([torch.cat(pieces, 1)], [whole]) < TOLERANCE[kernels]
    for i, entry in enumerate(state):
        held = cache[i]
        assert set(entry) == {k for k in ("recurrent_state", "conv_state") if held[k] is not None}
        for key, tensor in entry.items():
            want = held[key] if isinstance(held[key], torch.Tensor) else tuple(held[key])
            assert relative_difference(_leaves(tensor), _leaves(want)) < TOLERANCE[kernels], (i, key)


@needs_fla
def test_a_backbone_fed_embeddings_is_chunked_alike(kernels):
    backbone = build_model("gated_deltanet").model  # a GatedDeltaNetModel: hidden states out
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2), device="cpu")
    x = x.to(torch.get_default_device())  # (B, T, H)
    whole = backbone(inputs_embeds=x).last_hidden_state
    first, state = fla_model_fn(backbone, x[:, :6], None)
    second, _ = fla_model_fn(backbone, x[:, 6:], state)
    assert relative_difference([torch.cat([first, second], 1)], [whole]) < TOLERANCE[kernels]


@needs_fla
@pytest.mark.parametrize(
    "name,steps,grad,training,kernel",
    [
        ("gated_deltanet", 1, True, True, "chunk_gated_delta_rule"),
        ("gated_deltanet", 65, True, True, "chunk_gated_delta_rule"),
        ("gated_deltanet", 1, True, False, "chunk_gated_delta_rule"),
        ("gated_deltanet", 8, False, False, "fused_recurrent_gated_delta_rule"),  # no backward pass: evaluation only
        ("gated_deltanet", 8, False, True, "chunk_gated_delta_rule"),
        ("gla", 64, True, True, "fused_recurrent_gla"),
        ("gla", 65, True, True, "chunk_gla"),
        ("delta_net", 64, True, True, "fused_recurrent_delta_rule"),
        ("delta_net", 65, True, True, "chunk_delta_rule"),
    ],
)
def test_the_layers_run_the_kernels_the_adapter_documents(monkeypatch, name, steps, grad, training, kernel):
    # What the module's docstring says of each layer, checked against the layers' own choice (fla 0.6.0): with
    # gradients recorded, every kernel they pick has a backward pass.
    calls = use_reference_kernels(monkeypatch)
    model = build_model(name).train(training)
    with torch.set_grad_enabled(grad):
        fla_model_fn(model, tokens((2, steps), seed=3), None)
    assert calls == [kernel, kernel]  # one per layer


@needs_fla
def test_the_state_given_is_only_read_and_the_new_one_carries_the_gradient_back_to_it(kernels):
    model = build_model("gla")  # recurrent and convolution states
    x = tokens((2, 9), seed=4)
    with torch.no_grad():
        _, state = fla_model_fn(model, x[:, :4], None)
    given = tuple({key: _map(lambda t: t.clone().requires_grad_(), value) for key, value in e.items()} for e in state)
    leaves = [t for entry in given for value in entry.values() for t in _leaves(value)]
    versions = [t._version for t in leaves]
    logits, new = fla_model_fn(model, x[:, 4:], given)
    with torch.no_grad():  # a one-step call without gradients: fla's convolution writes into its cache in place
        fla_model_fn(model, x[:, 8:], given)
    assert [t._version for t in leaves] == versions
    (logits.sum() + sum(t.sum() for entry in new for value in entry.values() for t in _leaves(value))).backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in leaves)


def _leaves(value):
    return (value,) if isinstance(value, torch.Tensor) else tuple(value)


def _map(function, value):
    return function(value) if isinstance(value, torch.Tensor) else tuple(function(t) for t in value)


@needs_fla
def test_the_cache_is_filled_from_the_state_and_the_state_read_back_from_it():
    from ignite_tbptt.models.fla import _cache_from_state, _mixers, _state_from_cache

    layers = _mixers(build_model("gla"))
    state = tuple(
        {"recurrent_state": torch.randn(2, 2, 16, 8), "conv_state": tuple(torch.randn(2, d, 4) for d in (16, 16, 32))}
        for _ in layers
    )
    for copies in (False, True):
        cache = _cache_from_state(state, copies)
        assert len(cache) == 2 and cache.get_seq_length() == 0
        back = _state_from_cache(cache, layers)
        for entry, read in zip(state, back):
            pairs = [(entry["recurrent_state"], read["recurrent_state"]), *zip(entry["conv_state"], read["conv_state"])]
            for given, held in pairs:
                assert torch.equal(given, held) and (given is not held) == copies
    assert len(_cache_from_state(None, False)) == 0


# -- TBPTT against the references ----------------------------------------------------------------------------------
@needs_fla
@pytest.mark.parametrize(
    "name,k1,k2",
    [
        ("gated_deltanet", 4, STEPS),  # k2 reaches the whole stream: full BPTT of each document
        ("gated_deltanet", 4, 4),
        ("gated_deltanet", 4, 6),
        ("gla", 4, STEPS),
        ("gla", 4, 4),
        ("gla", 4, 7),
        ("delta_net", 4, 6),
        ("mamba2", 1, STEPS),  # fla's Mamba2: one step per call
        ("mamba2", 1, 1),
        ("mamba2", 1, 3),
    ],
)
def test_the_trainers_gradient_equals_the_models_own_forward_with_documents_reset_inside_a_batch(name, k1, k2, kernels):
    batches = make_batches()
    model = build_model(name)
    want = reference_gradient(copy.deepcopy(model), batches, k1, k2)
    got = trainer_gradient(model, batches, k1, k2)
    assert relative_difference(got, want) < TOLERANCE[kernels]


@needs_fla
def test_windows_longer_than_64_steps_run_the_chunk_kernels_and_give_the_same_gradient(kernels):
    batches = make_batches((80, 80), columns=2)
    model = build_model("gla")
    want = reference_gradient(copy.deepcopy(model), batches, 80, 100)
    got = trainer_gradient(model, batches, 80, 100)  # calls of 6, 54, 20 steps (fused_recurrent_gla), 80 (chunk_gla)
    assert relative_difference(got, want) < TOLERANCE[kernels]


@needs_fla
def test_the_truncated_gradient_differs_from_full_bptts_by_far_more_than_the_tolerance():
    # The comparisons above can fail: at k1 = k2 the trainer's gradient is not full BPTT's.
    batches = make_batches()
    for name in ("gated_deltanet", "gla"):
        with pytest.MonkeyPatch.context() as monkeypatch:
            use_reference_kernels(monkeypatch)
            model = build_model(name)
            full = reference_gradient(copy.deepcopy(model), batches, 4, STEPS)
            assert relative_difference(trainer_gradient(model, batches, 4, 4), full) > 1e-2


@needs_fla
@pytest.mark.parametrize("name", ["gated_deltanet", "mamba2"])
def test_the_evaluator_resets_documents_as_their_own_forward_from_zeros(name, kernels):
    batches = make_batches()
    model = build_model(name)
    evaluator = create_tbptt_evaluator(
        model, time_dim=1, carry_hidden=True, model_fn=fla_model_fn, reset_hidden=fla_reset_hidden
    )
    outputs = []
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(e.state.output[0]))
    if name == "mamba2":  # one step per call: batches of one step
        batches = [(x[:, t : t + 1], y[:, t : t + 1], s[:, t : t + 1]) for x, y, s in batches for t in range(12)]
    evaluator.run(batches)
    logits = torch.cat(outputs, 1)
    x = torch.cat([b[0] for b in batches], 1)
    model.eval()
    with torch.no_grad():
        for column, start, end in documents(batches):
            alone = model(x[column : column + 1, start:end]).logits[0]
            assert relative_difference([logits[column, start:end]], [alone]) < TOLERANCE[kernels]


# -- refusals ------------------------------------------------------------------------------------------------------
@needs_fla
def test_a_mamba2_call_of_more_than_one_step_from_a_state_is_refused_with_the_fix(monkeypatch):
    use_reference_kernels(monkeypatch)
    model = build_model("mamba2")
    x = tokens((2, 8), seed=5)
    _, state = fla_model_fn(model, x[:, :4], None)  # from no state: any length
    with pytest.raises(ValueError, match=r"a call of 4 steps with a carried state.*k1 = 1.*mamba2_model_fn"):
        fla_model_fn(model, x[:, 4:], state)
    trainer = fla_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 4, 4)
    with pytest.raises(ValueError, match="fla's Mamba2 layer takes a state into one-step calls only"):
        trainer.run(make_batches())


@needs_fla
def test_glas_fused_chunk_mode_is_refused_on_the_calls_that_would_run_it(monkeypatch):
    use_reference_kernels(monkeypatch)
    model = build_model("gla", attn_mode="fused_chunk")
    fla_model_fn(model, tokens((2, 64), seed=6), None)  # up to 64 steps: fused_recurrent_gla
    with pytest.raises(ValueError, match=r"layer 0 is a GatedLinearAttention with attn_mode='fused_chunk'.*65"):
        fla_model_fn(model, tokens((2, 65), seed=6), None)


@needs_fla
def test_models_and_layers_it_does_not_know_are_refused_naming_them(monkeypatch):
    import fla.layers.attn as attn

    use_reference_kernels(monkeypatch)
    monkeypatch.setattr(attn, "flash_attn_func", attn.flash_attn_func or object())  # fla builds it only with flash-attn
    x = tokens((2, 4), seed=7)
    hybrid = build_model("gated_deltanet", attn={"layers": [1], "num_heads": 2})
    with pytest.raises(TypeError, match="layer 1 of this GatedDeltaNetForCausalLM is Attention, an attention layer"):
        fla_model_fn(hybrid, x, None)
    with pytest.raises(TypeError, match="runs a model of flash-linear-attention .fla.models., got Linear"):
        fla_model_fn(nn.Linear(2, 2), x, None)


@needs_fla
def test_a_cache_or_a_state_of_another_shape_is_refused_naming_the_tensor(monkeypatch):
    use_reference_kernels(monkeypatch)
    model = build_model("gated_deltanet")
    x = tokens((2, 4), seed=8)
    _, state = fla_model_fn(model, x, None)
    with pytest.raises(TypeError, match="given a Cache as the state"):
        fla_model_fn(model, x, Cache())
    with pytest.raises(TypeError, match=r"a tuple of 2 dicts, one per layer, .* got tuple of 1"):
        fla_model_fn(model, x, state[:1])
    with pytest.raises(TypeError, match=r"state\[1\] must be a dict with the keys \['conv_state', 'recurrent_state'\]"):
        fla_model_fn(model, x, (state[0], {"recurrent_state": state[1]["recurrent_state"]}))
    wrong = (state[0], {**state[1], "conv_state": state[1]["conv_state"][:2] + (torch.zeros(2, 16, 4),)})
    with pytest.raises(ValueError, match=r"state\[1\]\['conv_state'\]\[2\] has shape \(2, 16, 4\).*need \(2, 32, 4\)"):
        fla_model_fn(model, x, wrong)
    with pytest.raises(ValueError, match=r"state\[0\]\['recurrent_state'\] has shape \(2, 2, 16, 8\).*\(3, 2, 16, 8\)"):
        fla_model_fn(model, tokens((3, 4), seed=8), state)


@needs_fla
def test_a_layer_that_leaves_its_cache_empty_is_named(monkeypatch):
    import fla.layers.gla as gla

    use_reference_kernels(monkeypatch)
    monkeypatch.setattr(gla, "update_layer_cache", lambda *args, **kwargs: None)
    with pytest.raises(RuntimeError, match="layer 0 .GatedLinearAttention. left no recurrent_state in its cache"):
        fla_model_fn(build_model("gla"), tokens((2, 4), seed=9), None)


@needs_fla
@on_cuda
def test_mamba2s_one_step_cuda_kernel_is_refused_while_gradients_are_recorded(monkeypatch, device):
    # mamba_ssm's selective_state_update writes the state in place and has no backward pass: refused before it runs.
    import fla.layers.mamba2 as mamba2

    if device.type != "cuda":
        pytest.skip(ON_CUDA)
    model = build_model("mamba2")
    x = tokens((2, 5), seed=10)
    _, state = fla_model_fn(model, x[:, :4], None)
    monkeypatch.setattr(mamba2, "is_fast_path_available", True)
    with pytest.raises(ValueError, match="runs mamba_ssm's selective_state_update"):
        fla_model_fn(model, x[:, 4:], state)


# -- checkpoints -----------------------------------------------------------------------------------------------------
@needs_fla
def test_a_mid_epoch_resume_continues_bit_identically(tmp_path, kernels):
    batches = make_batches((8, 8, 8))

    def build():
        model = build_model("gated_deltanet")
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        return model, optimizer, fla_trainer(model, optimizer, 4, 6, deterministic=True)

    assert_resume_is_bit_identical(tmp_path, build, batches, stop_at=2, epochs=2)


# -- the kernels' gradients through the state, against fla's references (CUDA only) --------------------------------
def _kernel_cases():
    """name: (fla's kernel, its reference, inputs(B, T, H, K, V) -> (tensors, options)), as the layers call them."""
    from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gla import chunk_gla, fused_recurrent_gla
    from fla.ops.kda import chunk_kda
    from fla.ops.kda.naive import naive_recurrent_kda
    from fla.ops.simple_gla import chunk_simple_gla
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    from .fla_reference import reference_delta_rule, reference_gated_delta_rule, reference_gla

    def randn(*shape):
        return torch.randn(*shape, device="cuda")

    def gdn(b, t, h, k, v):  # GatedDeltaNet's call: raw gate and beta, V-first state
        g_raw, beta = randn(b, t, h), randn(b, t, h)
        tensors = {"q": randn(b, t, h, k), "k": randn(b, t, h, k), "v": randn(b, t, h, v), "g": g_raw, "beta": beta}
        tensors.update(initial_state=randn(b, h, v, k), A_log=randn(h).abs().log(), dt_bias=randn(h))
        options = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True)
        return tensors, dict(options, state_v_first=True)

    def gla(b, t, h, k, v):  # GLA's call: log-space per-key gates, V-first state
        g = nn.functional.logsigmoid(randn(b, t, h, k)) / 16
        return {"q": randn(b, t, h, k), "k": randn(b, t, h, k), "v": randn(b, t, h, v), "g": g,
                "initial_state": randn(b, h, v, k)}, {"state_v_first": True}  # fmt: skip

    def delta(b, t, h, k, v):  # DeltaNet's call: l2-normalised in the kernel, beta in (0, 1)
        beta = torch.rand(b, t, h, device="cuda")
        return {"q": randn(b, t, h, k), "k": randn(b, t, h, k), "v": randn(b, t, h, v), "beta": beta,
                "initial_state": randn(b, h, k, v)}, {"use_qk_l2norm_in_kernel": True}  # fmt: skip

    def simple(b, t, h, k, v):
        g = nn.functional.logsigmoid(randn(b, t, h)) / 16
        return {"q": randn(b, t, h, k), "k": randn(b, t, h, k), "v": randn(b, t, h, v), "g": g,
                "initial_state": randn(b, h, k, v)}, {}  # fmt: skip

    def kda(b, t, h, k, v):
        q, key = (nn.functional.normalize(randn(b, t, h, k), dim=-1) for _ in range(2))
        g = nn.functional.logsigmoid(randn(b, t, h, k)) / 16
        beta = torch.rand(b, t, h, device="cuda")
        return {"q": q, "k": key, "v": randn(b, t, h, v), "g": g, "beta": beta, "initial_state": randn(b, h, k, v)}, {}

    gla_reference = reference_gla([], "gla")
    return {
        "chunk_gated_delta_rule": (chunk_gated_delta_rule, reference_gated_delta_rule([], "gdn"), gdn),
        "chunk_gla": (chunk_gla, gla_reference, gla),
        "fused_recurrent_gla": (lambda g, **rest: fused_recurrent_gla(gk=g, **rest), gla_reference, gla),
        "chunk_delta_rule": (chunk_delta_rule, reference_delta_rule([], "delta"), delta),
        "fused_recurrent_delta_rule": (fused_recurrent_delta_rule, reference_delta_rule([], "delta"), delta),
        "chunk_simple_gla": (chunk_simple_gla, naive_recurrent_simple_gla, simple),
        "chunk_kda": (chunk_kda, naive_recurrent_kda, kda),
    }


KERNELS = [
    "chunk_gated_delta_rule",
    "chunk_gla",
    "fused_recurrent_gla",
    "chunk_delta_rule",
    "fused_recurrent_delta_rule",
    "chunk_simple_gla",
    "chunk_kda",
]
# Largest difference of an output or a gradient, relative to the reference's largest entry (float32, IEEE products).
KERNEL_TOLERANCE = 1e-3


def _outputs_and_gradients(function, tensors, options, do, dht):
    leaves = {name: t.detach().clone().requires_grad_() for name, t in tensors.items()}
    o, final = function(**leaves, **options, output_final_state=True)
    ((o * do).sum() + (final * dht).sum()).backward()
    return {"o": o, "final_state": final, **{f"d{name}": t.grad for name, t in leaves.items()}}


@needs_fla
@on_cuda
@pytest.mark.parametrize("steps", [50, 100])  # one chunk of 64 and less; one and a ragged second
@pytest.mark.parametrize("name", KERNELS)
def test_the_kernels_gradient_of_the_initial_state_matches_flas_reference(monkeypatch, name, steps):
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    kernel, reference, inputs = _kernel_cases()[name]
    torch.manual_seed(0)
    tensors, options = inputs(2, steps, 2, 32, 32)
    o, final = reference(**tensors, **options, output_final_state=True)
    do, dht = torch.randn_like(o), torch.randn_like(final)
    want = _outputs_and_gradients(reference, tensors, options, do, dht)
    got = _outputs_and_gradients(kernel, tensors, options, do, dht)
    assert set(got) == set(want) and "dinitial_state" in got
    for key in want:
        scale = want[key].abs().max().item()
        assert (got[key].float() - want[key].float()).abs().max().item() <= KERNEL_TOLERANCE * scale, key


@needs_fla
@on_cuda
@pytest.mark.parametrize("steps", [1, 3, 50])  # shorter than the kernel width too: the state keeps old inputs
def test_the_short_convolutions_gradient_of_its_cache_matches_the_reference(monkeypatch, steps):
    from fla.modules import ShortConvolution

    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    torch.manual_seed(0)
    conv = ShortConvolution(hidden_size=16, kernel_size=4, bias=True, activation="silu").cuda()
    x, cache = torch.randn(2, steps, 16, device="cuda"), torch.randn(2, 16, 4, device="cuda")
    results = []
    for forward in (ShortConvolution.forward, reference_short_convolution):
        conv.zero_grad()
        leaves = [x.clone().requires_grad_(), cache.clone().requires_grad_()]
        y, final = forward(conv, leaves[0], cache=leaves[1], output_final_state=True)
        torch.manual_seed(1)
        ((y * torch.randn_like(y)).sum() + (final * torch.randn_like(final)).sum()).backward()
        results.append([y, final, leaves[0].grad, leaves[1].grad, conv.weight.grad.clone(), conv.bias.grad.clone()])
    for got, want in zip(*results):
        assert (got - want).abs().max().item() <= KERNEL_TOLERANCE * want.abs().max().item()


@needs_fla
@pytest.mark.parametrize("name", MODELS)
def test_check_model_finds_the_adapted_models_carrying_their_state(name, kernels):
    from ignite_tbptt import check_model

    model = build_model(name)
    x = tokens((3, 12), seed=1)
    check = check_model(model, x, model_fn=fla_model_fn, reset_hidden=fla_reset_hidden, time_dim=1)
    if name != "mamba2":
        assert check.ok, str(check)
        return
    # fla's Mamba2 takes a state into one-step calls only: measured a step at a time, its training refused at k1 > 1.
    assert [v.name for v in check.verdicts if not v.passed] == ["trains"], str(check)
    assert "chunks of 3 steps refused by the model" in check["carried"].detail
    assert "Train it with k1 = 1" in check["trains"].detail
