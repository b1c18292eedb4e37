"""Hugging Face's Mamba2 through ``mamba2_model_fn``: chunked equals whole, TBPTT exact, refusals, resume.

The references run the model's own forward (``model(input_ids)``, from zeros, or seeded from its own cache after a
prefix run without gradients) on each document of each column alone: nothing of the adapter is shared. The SSM scan
computes in float32 whatever the model's dtype, so gradients agree to float32's rounding (about 1e-7 of their size
here, float64 elsewhere), not to float64's.
"""

import copy

import pytest
import torch
from ignite.engine import Events
from torch import nn

from ignite_tbptt import TBPTTEvents, create_tbptt_evaluator, create_tbptt_trainer
from ignite_tbptt.models import check_mamba2_schedule, mamba2_model_fn, mamba2_reset_hidden
from ignite_tbptt.runtime import StateWrittenInPlace

from ..helpers import assert_resume_is_bit_identical

transformers = pytest.importorskip("transformers")

VOCAB = 11
# Column 0 holds the documents [0, 6) and [6, 24); column 1 one document; column 2 [0, 10), [10, 18), [18, 24). Every
# piece of a document between window boundaries (k1 = 4) is two steps or more.
STARTS = {0: (6,), 1: (), 2: (10, 18)}
STEPS = 24


def build_model(dtype=torch.float64, seed=0):
    """A tiny Mamba2 (2 layers, 2 heads of 16, state 8), its projections drawn large enough that the state matters."""
    torch.manual_seed(seed)
    config = transformers.Mamba2Config(
        vocab_size=VOCAB,
        hidden_size=16,
        num_heads=2,
        head_dim=16,
        expand=2,
        state_size=8,
        n_groups=1,
        num_hidden_layers=2,
        chunk_size=4,
        conv_kernel=4,
        tie_word_embeddings=False,
    )
    model = transformers.Mamba2ForCausalLM(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0, 0.5)
    return model.to(dtype)


def cross_entropy(y_pred, y):
    return nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten())


def make_batches(lengths=(12, 12), columns=3, seed=0):
    """``(x, y, starts)`` batches of ``(B, T)`` token ids, time in dimension 1, with the starts of ``STARTS``."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (columns, sum(lengths) + 1), generator=g, device="cpu").to(
        torch.get_default_device()
    )
    starts = torch.zeros(columns, sum(lengths), dtype=torch.bool)
    for column, steps in STARTS.items():
        if column < columns:
            starts[column, list(steps)] = True
    batches, at = [], 0
    for length in lengths:
        piece = slice(at, at + length)
        batches.append((tokens[:, :-1][:, piece], tokens[:, 1:][:, piece], starts[:, piece]))
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


def summed_loss(model, x, y, cache=None):
    """The model's own forward (no adapter): the summed cross-entropy of ``x`` ``(1, T)`` against ``y``."""
    logits = model(x, cache=cache, use_cache=cache is not None).logits
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")


def reference_gradient(model, batches, k1=None):
    """Mean-loss gradient of the whole stream, each document alone from zeros: full BPTT, or TBPTT(k1, k1).

    For TBPTT(k1, k1) each piece of a document between window boundaries starts from the state of the document's
    prefix, computed without gradients by the model's own forward and handed over in its own cache.
    """
    x = torch.cat([b[0] for b in batches], 1)
    y = torch.cat([b[1] for b in batches], 1)
    model.zero_grad()
    for column, start, end in documents(batches):
        edges = [start, end] if k1 is None else sorted({start, end, *range(0, end, k1)} - set(range(0, start)))
        for a, b in zip(edges, edges[1:]):
            cache = None
            if a > start:
                cache = transformers.DynamicCache(config=model.config)
                with torch.no_grad():
                    model(x[column : column + 1, start:a], cache=cache, use_cache=True)
            summed_loss(model, x[column : column + 1, a:b], y[column : column + 1, a:b], cache).backward()
    return [p.grad / y.numel() for p in model.parameters()]


def mamba2_trainer(model, optimizer, k1, k2, model_fn=mamba2_model_fn, **options):
    """The trainer as the adapter is used: batch-first, one carried stream, Mamba2's call and reset."""
    return create_tbptt_trainer(
        model,
        optimizer,
        cross_entropy,
        k1,
        k2,
        time_dim=1,
        carry_hidden=True,
        model_fn=model_fn,
        reset_hidden=mamba2_reset_hidden,
        **options,
    )


def trainer_gradient(model, batches, k1, k2):
    """The gradient of the trainer's one optimizer step (learning rate 0, every window accumulated into it)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = mamba2_trainer(model, optimizer, k1, k2, gradient_accumulation_steps=100)
    steps = []
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_STARTED, lambda e: steps.append([p.grad.clone() for p in model.parameters()])
    )
    trainer.run(batches)
    assert len(steps) == 1
    return steps[0]


def largest_difference(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a, b))


# -- the forward -----------------------------------------------------------------------------------------------------
def test_chunked_calls_with_the_carried_state_equal_one_call_over_the_whole_sequence():
    # Equal to float32's rounding: the scan sums its blocks in another order when the sequence is cut.
    model = build_model(torch.float32)
    x = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1), device="cpu").to(
        torch.get_default_device()
    )
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        whole = model(x, cache=cache, use_cache=True).logits
        for edges in ([0, 8, 16, 24], [0, 5, 6, 13, 24]):  # [5, 6): one step, which runs without gradients
            state, pieces = None, []
            for a, b in zip(edges, edges[1:]):
                logits, state = mamba2_model_fn(model, x[:, a:b], state)
                pieces.append(logits)
            torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=0, atol=1e-5)
            for i, (conv, ssm) in enumerate(state):
                torch.testing.assert_close(conv, cache.layers[i].conv_states[0], rtol=0, atol=1e-5)
                torch.testing.assert_close(ssm, cache.layers[i].recurrent_states[0], rtol=0, atol=1e-5)
                assert ssm.dtype == torch.float32 and ssm.shape == (3, 2, 16, 8) and conv.shape == (3, 48, 4)


def test_a_backbone_fed_embeddings_is_chunked_alike():
    backbone = build_model(torch.float32).backbone  # a Mamba2Model: hidden states out
    x = torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(2), device="cpu").to(
        torch.get_default_device()
    )  # (B, T, H)
    with torch.no_grad():
        whole = backbone(inputs_embeds=x).last_hidden_state
        first, state = mamba2_model_fn(backbone, x[:, :6], None)
        second, _ = mamba2_model_fn(backbone, x[:, 6:], state)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, rtol=0, atol=1e-5)


def test_the_reset_zeroes_the_starting_columns_of_every_tensor_and_refuses_other_layouts():
    state = ((torch.ones(3, 5, 4), torch.ones(3, 2, 4, 2)), (torch.ones(3, 5, 4), torch.ones(3, 2, 4, 2)))
    reset = mamba2_reset_hidden(state, torch.tensor([True, False, True]))
    for tensor in (t for pair in reset for t in pair):
        assert tensor.flatten(1).sum(1).tolist() == [0.0, tensor[0].numel(), 0.0]
    with pytest.raises(ValueError, match=r"with B = 3, but the state holds a tensor of shape \(2, 3, 4\)"):
        mamba2_reset_hidden((torch.ones(2, 3, 4),), torch.tensor([True, False, True]))


def test_the_state_given_is_only_read_and_the_new_one_carries_the_gradient_back_to_it():
    model = build_model()
    x = torch.randint(0, VOCAB, (2, 8))
    with torch.no_grad():
        _, state = mamba2_model_fn(model, x[:, :4], None)
    given = tuple(tuple(t.clone().requires_grad_() for t in pair) for pair in state)
    versions = [t._version for pair in given for t in pair]
    logits, new = mamba2_model_fn(model, x[:, 4:], given)
    assert [t._version for pair in given for t in pair] == versions
    (logits.sum() + sum(t.sum() for pair in new for t in pair)).backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for pair in given for t in pair)


# -- TBPTT against the references ----------------------------------------------------------------------------------
def test_k2_reaching_the_whole_stream_gives_full_bptt_with_documents_reset_inside_a_batch():
    batches = make_batches()
    model = build_model()
    want = reference_gradient(copy.deepcopy(model), batches)
    got = trainer_gradient(model, batches, k1=4, k2=STEPS)
    scale = max(g.abs().max().item() for g in want)
    assert largest_difference(got, want) < 2e-6 * scale


def test_k1_equal_k2_gives_the_truncated_gradient_which_is_not_full_bptts():
    batches = make_batches()
    model = build_model()
    truncated = reference_gradient(copy.deepcopy(model), batches, k1=4)
    full = reference_gradient(copy.deepcopy(model), batches)
    got = trainer_gradient(model, batches, k1=4, k2=4)
    scale = max(g.abs().max().item() for g in truncated)
    assert largest_difference(got, truncated) < 2e-6 * scale
    assert largest_difference(got, full) > 1e-2 * scale  # the comparison above can fail


def test_the_evaluator_resets_documents_as_their_own_forward_from_zeros():
    batches = make_batches()
    model = build_model()
    evaluator = create_tbptt_evaluator(
        model, time_dim=1, carry_hidden=True, model_fn=mamba2_model_fn, reset_hidden=mamba2_reset_hidden
    )
    outputs = []
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(e.state.output[0]))
    evaluator.run(batches)
    logits = torch.cat(outputs, 1)
    x = torch.cat([b[0] for b in batches], 1)
    model.eval()
    with torch.no_grad():
        for column, start, end in documents(batches):
            alone = model(x[column : column + 1, start:end]).logits[0]
            torch.testing.assert_close(logits[column, start:end], alone, rtol=0, atol=1e-5)


# -- refusals ------------------------------------------------------------------------------------------------------
def test_a_one_step_segment_with_a_state_is_refused_before_the_model_runs_it():
    model = build_model()
    before = copy.deepcopy(model)
    # k2 = 5: the next window's cut, one step before this one's end, splits [0, 4) into [0, 3) and [3, 4).
    trainer = mamba2_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 4, 5)
    with pytest.raises(ValueError, match=r"a segment of one step \(x of shape \(3, 1\)\).*k1 >= 2"):
        trainer.run(make_batches())
    assert largest_difference(list(model.parameters()), list(before.parameters())) == 0


@pytest.mark.parametrize(
    "k1,k2,options,where",
    [
        (1, 1, {}, r"\[1, 2\)"),
        (4, 3, {}, r"\[4, 5\) of the window \[4, 8\)"),  # k2 < k1: each step before the cut alone
        (4, 5, {}, r"\[3, 4\) of the window \[0, 4\)"),
        (4, 7, {}, r"\[4, 5\) of the window \[4, 8\)"),
        (4, 4, {"batch_length": 5}, r"\[4, 5\)"),
        (4, 4, {"recompute": 3}, r"\[3, 4\)"),
    ],
)
def test_schedules_that_give_a_one_step_call_are_refused_when_checked(k1, k2, options, where):
    with pytest.raises(ValueError, match=rf"would call Mamba2 on the one step {where}"):
        check_mamba2_schedule(k1, k2, **options)


@pytest.mark.parametrize("k1,k2,options", [(4, 4, {}), (4, 6, {}), (4, 8, {"batch_length": 12}), (2, 2, {})])
def test_schedules_of_calls_of_two_steps_or_more_pass(k1, k2, options):
    check_mamba2_schedule(k1, k2, **options)


def test_a_cache_as_the_state_is_refused():
    model = build_model()
    x = torch.randint(0, VOCAB, (2, 4))
    cache = model(x, use_cache=True).cache
    with pytest.raises(TypeError, match="given a transformers Cache as the state"):
        mamba2_model_fn(model, x, cache)


def test_a_state_of_the_wrong_shape_is_refused_naming_the_tensor():
    model = build_model()
    x = torch.randint(0, VOCAB, (2, 4))
    _, state = mamba2_model_fn(model, x, None)
    with pytest.raises(ValueError, match=r"state\[1\]\[1\] \(the ssm state of layer 1\) has shape \(2, 2, 16, 8\)"):
        # Three columns everywhere but in layer 1's ssm state, which keeps the two of the state returned.
        wrong = tuple(
            (conv.repeat(2, 1, 1)[:3], ssm if i else ssm.repeat(2, 1, 1, 1)[:3]) for i, (conv, ssm) in enumerate(state)
        )
        mamba2_model_fn(model, torch.randint(0, VOCAB, (3, 4)), wrong)
    with pytest.raises(TypeError, match="tuple of 2 \\(conv, ssm\\) pairs"):
        mamba2_model_fn(model, x, state[:1])
    with pytest.raises(TypeError, match="runs a transformers Mamba2ForCausalLM or Mamba2Model, got Linear"):
        mamba2_model_fn(nn.Linear(2, 2), x, None)


def test_one_cache_reused_across_calls_is_refused_by_the_trainer():
    # What the adapter avoids: the model writes into its cache, so a cache kept from call to call changes the state
    # the trainer handed out.
    model = build_model()
    cache = transformers.DynamicCache(config=model.config)

    def reusing_model_fn(model, x, state):
        logits = model(x, cache=cache, use_cache=True).logits
        return logits, tuple((layer.conv_states[0], layer.recurrent_states[0]) for layer in cache.layers)

    trainer = mamba2_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), 4, 8, model_fn=reusing_model_fn)
    with pytest.raises(StateWrittenInPlace, match=r"the model wrote in place into state\[0\]\[0\]"):
        trainer.run(make_batches())


# -- checkpoints -----------------------------------------------------------------------------------------------------
def test_a_mid_epoch_resume_continues_bit_identically(tmp_path):
    batches = make_batches((8, 8, 8))

    def build():
        model = build_model(torch.float32)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        return model, optimizer, mamba2_trainer(model, optimizer, 4, 6, deterministic=True)

    assert_resume_is_bit_identical(tmp_path, build, batches, stop_at=2, epochs=2)


def test_check_model_finds_the_adapted_mamba2_carrying_its_state_and_names_the_one_step_calls_it_refuses():
    from ignite_tbptt import check_model

    model = build_model()
    x = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))
    check = check_model(model, x, model_fn=mamba2_model_fn, reset_hidden=mamba2_reset_hidden, time_dim=1)
    assert check.ok, str(check)
    assert check["carried"].figure < 1e-6 and check["gradient"].figure < 1e-6  # its SSM state is float32
    assert "chunks of 1 steps refused by the model" in check["carried"].detail
