import copy
import itertools

import pytest
import torch
from ignite.contrib.engines.tbptt import Tbptt_Events, create_supervised_tbptt_trainer
from ignite.engine import Events

from ignite_tbptt import TBPTTEvents, create_tbptt_trainer

from ..helpers import (
    NoLength,
    RecordingNet,
    assert_same_parameters,
    assert_trained,
    compare_with_reference,
    make_batches,
    sgd,
)
from ..reference import DictNet, Net, cross_entropy

K_PAIRS = [(4, 4), (3, 7), (4, 6), (2, 8), (1, 3), (5, 2), (6, 1)]


@pytest.mark.parametrize("k1,k2", K_PAIRS, ids=[f"k1={a}-k2={b}" for a, b in K_PAIRS])
@pytest.mark.parametrize("carry_hidden", [False, True], ids=["fresh", "carry"])
@pytest.mark.parametrize("accumulation", [1, 3], ids=["acc1", "acc3"])
def test_lstm_matches_brute_force_reference(k1, k2, carry_hidden, accumulation):
    compare_with_reference(k1, k2, carry_hidden=carry_hidden, accumulation=accumulation)


@pytest.mark.parametrize("cell", ["gru", "rnn"])
@pytest.mark.parametrize("k1,k2", [(3, 7), (5, 2), (3, 3)])
@pytest.mark.parametrize("carry_hidden", [False, True], ids=["fresh", "carry"])
def test_tensor_hidden_cells_match_reference(cell, k1, k2, carry_hidden):
    compare_with_reference(k1, k2, carry_hidden=carry_hidden, cell=cell, accumulation=2)


@pytest.mark.parametrize("k1,k2", [(4, 6), (6, 2)])
def test_time_dim_1_matches_reference(k1, k2):
    compare_with_reference(k1, k2, carry_hidden=True, time_dim=1, accumulation=2)


def test_dict_hidden_state_matches_reference():
    compare_with_reference(3, 5, carry_hidden=True, net=DictNet)


@pytest.mark.parametrize("k1,k2", [(3, 7), (5, 2), (4, 4)])
def test_unknown_epoch_length_matches_reference(k1, k2):
    # 7 + 12 + 5 = 24 steps: the last window is short, and is only known to end when the data runs out.
    compare_with_reference(k1, k2, carry_hidden=True, accumulation=2, epochs=3, data=NoLength)


def test_cutting_the_stream_into_other_batches_gives_the_same_parameters():
    (stream,) = make_batches([30])
    results = []
    for lengths in ([10, 10, 10], [7, 13, 10], [1, 28, 1]):
        torch.manual_seed(0)
        model = Net().double()
        bounds = list(itertools.accumulate([0, *lengths]))
        batches = [tuple(t[a:b] for t in stream) for a, b in zip(bounds, bounds[1:])]
        trainer = create_tbptt_trainer(
            model, sgd(model), cross_entropy, 3, 7, carry_hidden=True, gradient_accumulation_steps=2
        )
        trainer.run(batches, max_epochs=2)
        results.append(model)
    assert_same_parameters(results[0], results[1], atol=1e-12)
    assert_same_parameters(results[0], results[2], atol=1e-12)


def test_drop_in_for_ignite_create_supervised_tbptt_trainer():
    batches = make_batches([9, 12, 8, 9])
    torch.manual_seed(0)
    ours = RecordingNet().double()
    theirs = copy.deepcopy(ours)
    initial = copy.deepcopy(ours)
    create_tbptt_trainer(ours, sgd(ours), cross_entropy, 4).run(batches, max_epochs=3)
    create_supervised_tbptt_trainer(theirs, sgd(theirs), cross_entropy, tbtt_step=4).run(batches, max_epochs=3)
    assert_trained(ours, initial)
    assert_same_parameters(ours, theirs, atol=1e-12)
    assert ours.calls == theirs.calls
    assert ours.calls[:4] == [(4, True), (4, False), (1, False), (4, True)]


def test_grad_scaler_scales_every_backward_and_unscales_once_before_the_step_event():
    batches = make_batches([7, 12, 5])
    runs = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0**10)):
        torch.manual_seed(0)
        model = Net().double()
        trainer = create_tbptt_trainer(
            model,
            sgd(model),
            cross_entropy,
            3,
            5,
            carry_hidden=True,
            gradient_accumulation_steps=2,
            scaler=scaler if scaler is not None else False,
        )
        grads, backward_grads = [], []
        trainer.add_event_handler(
            TBPTTEvents.OPTIMIZER_STEP_STARTED,
            lambda _, grads=grads, model=model: grads.append([p.grad.clone() for p in model.parameters()]),
        )
        # What every backward call adds to the recurrent weights, as the backward pass itself sees it.
        model.rnn.weight_hh_l0.register_hook(lambda g, seen=backward_grads: seen.append(g.clone()))
        trainer.run(batches, max_epochs=2)
        runs.append((model, grads, backward_grads))
    (plain, plain_grads, plain_seen), (scaled, scaled_grads, scaled_seen) = runs
    # The backward passes saw the gradients multiplied by the scale...
    assert len(plain_seen) == len(scaled_seen) > 8
    for a, b in zip(plain_seen, scaled_seen):
        torch.testing.assert_close(b, a * 2.0**10, rtol=1e-12, atol=0)
    # ... and the optimizer step the unscaled ones, so training gives the unscaled result.
    assert len(plain_grads) == len(scaled_grads) == 2 * 4  # 24 steps / 3 per window / 2 windows per step
    for a, b in zip(plain_grads, scaled_grads):
        for ga, gb in zip(a, b):
            torch.testing.assert_close(ga, gb, rtol=0, atol=1e-12)
    assert_same_parameters(plain, scaled, atol=1e-12)


def test_grad_scaler_skips_a_step_with_inf_gradients():
    torch.manual_seed(0)
    model = Net().double()
    before = copy.deepcopy(model)
    ((x, y),) = make_batches([6])
    x[2, 0, 0] = float("inf")
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 6, scaler=True)
    trainer.run([(x, y)])
    assert_same_parameters(model, before, atol=0)
    assert trainer.state.scaler.get_scale() == 65536.0 / 2
    assert trainer.state.optimizer_step == 1


def test_mean_over_targets_with_padding_equals_one_step_on_the_joined_batch():
    # k1 = k2 = T with accumulation 2 is one step on the two batches joined; padded targets do not count.
    g = torch.Generator().manual_seed(1)
    x1, x2 = (torch.randn(5, n, 3, generator=g, dtype=torch.float64, device="cpu") for n in (2, 3))
    y1, y2 = (torch.randint(0, 4, (5, n), generator=g, device="cpu") for n in (2, 3))
    y1[3:, 0] = -100  # 2 padded targets in the first batch, 7 in the second
    y2[:, 1] = -100
    y2[4, 2] = -100
    x1, x2, y1, y2 = (t.to(torch.get_default_device()) for t in (x1, x2, y1, y2))
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)

    def ce(y_pred, y):
        return loss_fn(y_pred.reshape(-1, 4), y.reshape(-1))

    torch.manual_seed(0)
    model = Net().double()
    joined = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    trainer = create_tbptt_trainer(
        model, opt, ce, 5, gradient_accumulation_steps=2, target_count_fn=lambda y_pred, y: (y != -100).sum()
    )
    trainer.run([(x1, y1), (x2, y2)])

    joined_opt = torch.optim.SGD(joined.parameters(), lr=1.0)
    ce(joined(torch.cat([x1, x2], 1))[0], torch.cat([y1, y2], 1)).backward()
    joined_opt.step()
    assert_same_parameters(model, joined, atol=1e-12)
    assert trainer.state.optimizer_step == 1


def test_output_and_window_loss_are_mean_per_target_losses():
    torch.manual_seed(0)
    model = Net().double()
    ((x, y),) = make_batches([10])
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.0), cross_entropy, 4, 6)
    window_losses = []
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda e: window_losses.append(e.state.window_loss))
    trainer.run([(x, y)])
    with torch.no_grad():
        y_pred = model(x)[0]
    assert trainer.state.output == pytest.approx(cross_entropy(y_pred, y).item(), rel=1e-12)
    expected = [cross_entropy(y_pred[a:b], y[a:b]).item() for a, b in ((0, 4), (4, 8), (8, 10))]
    assert [w.item() for w in window_losses] == pytest.approx(expected, rel=1e-12)


def test_output_transform_receives_the_batch_predictions():
    torch.manual_seed(0)
    model = Net().double()
    ((x, y),) = make_batches([10])
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        cross_entropy,
        3,
        output_transform=lambda x, y, y_pred, loss: (y_pred, loss),
    )
    trainer.run([(x, y)])
    y_pred, loss = trainer.state.output
    with torch.no_grad():
        torch.testing.assert_close(y_pred, model(x)[0], rtol=0, atol=1e-12)
    assert not y_pred.requires_grad


def test_events_counters_filters_and_state_dict():
    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 4, gradient_accumulation_steps=2)
    fired = []
    for event in (
        TBPTTEvents.WINDOW_STARTED,
        TBPTTEvents.OPTIMIZER_STEP_STARTED,
        TBPTTEvents.OPTIMIZER_STEP_COMPLETED,
        TBPTTEvents.WINDOW_COMPLETED,
    ):
        trainer.add_event_handler(event, lambda e, name=event.name: fired.append((name, e.state.window)))
    every = []
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED(every=3), lambda e: every.append(e.state.window))
    ignite_events = []
    trainer.add_event_handler(Tbptt_Events.TIME_ITERATION_COMPLETED, lambda e: ignite_events.append(e.state.window))
    # 8 + 8 steps per epoch: 4 windows, 2 optimizer steps; over 2 epochs: 8 windows, 4 steps.
    trainer.run(make_batches([8, 8]), max_epochs=2)
    assert (trainer.state.window, trainer.state.optimizer_step) == (8, 4)
    assert every == [3, 6]
    assert ignite_events == list(range(1, 9))
    assert fired[:6] == [
        ("WINDOW_STARTED", 1),
        ("WINDOW_COMPLETED", 1),
        ("WINDOW_STARTED", 2),
        ("OPTIMIZER_STEP_STARTED", 2),
        ("OPTIMIZER_STEP_COMPLETED", 2),
        ("WINDOW_COMPLETED", 2),
    ]
    state = trainer.state_dict()
    assert (state["window"], state["optimizer_step"]) == (8, 4)
    # A fresh run starts the counters again.
    trainer.state.max_epochs = None
    trainer.run(make_batches([8]), max_epochs=1)
    assert (trainer.state.window, trainer.state.optimizer_step) == (2, 1)


def test_windows_left_at_the_end_of_an_epoch_are_applied():
    # 3 windows per epoch with accumulation 2: the third is applied when the epoch ends, before user handlers.
    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 4, gradient_accumulation_steps=2)
    seen = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: seen.append(e.state.optimizer_step))
    trainer.run(make_batches([8, 4]), max_epochs=2)
    assert seen == [2, 4]


def test_bfloat16_autocast_on_cpu_runs_the_model_in_bfloat16_and_trains_close_to_float32():
    batches = make_batches([12, 12])
    models, dtypes = [], []
    for dtype in (None, torch.bfloat16):
        torch.manual_seed(0)
        model = Net()
        seen = set()
        model.head.register_forward_hook(lambda module, args, out, seen=seen: seen.add(out.dtype))
        trainer = create_tbptt_trainer(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            cross_entropy,
            4,
            6,
            carry_hidden=True,
            autocast_dtype=dtype,
            prepare_batch=lambda b, device, non_blocking: (b[0].float(), b[1]),
        )
        trainer.run(batches, max_epochs=2)
        models.append(model)
        dtypes.append(seen)
    assert dtypes == [{torch.float32}, {torch.bfloat16}]  # autocast acted on the model's calls
    difference = max((p - q).abs().max().item() for p, q in zip(models[0].parameters(), models[1].parameters()))
    assert 1e-4 < difference < 2e-2  # bfloat16's rounding shows, but training stays close
    assert all(p.dtype == torch.float32 for p in models[1].parameters())


@pytest.mark.parametrize("k1,k2", [(4, 4), (3, 7), (2, 9), (6, 2)])
def test_retained_history_spans_at_most_k2_minus_k1_steps(k1, k2):
    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, k1, k2, carry_hidden=True)
    history = trainer.tbptt.history
    spans = []

    @trainer.on(TBPTTEvents.WINDOW_COMPLETED)
    def measure(_):
        segments = history.segments
        spans.append(segments[-1].end - segments[0].start if segments else 0)
        assert all(s.y_pred is None and s.y_grad is None for s in segments)  # no loss gradient kept

    trainer.run(make_batches([13, 20, 7, 30]), max_epochs=2)
    assert len(spans) == 2 * -(-70 // k1)  # windows per epoch: 70 steps in windows of k1
    assert max(spans) == max(0, k2 - k1) and spans[-1] == 0  # nothing survives the end of the stream


def test_in_place_parameter_change_under_retained_history_raises_a_clear_error():
    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(
        model, sgd(model), cross_entropy, 2, 6, carry_hidden=True, gradient_accumulation_steps=2
    )

    # Window 1 ends without an optimizer step; window 2's backward pass reaches into it.
    @trainer.on(TBPTTEvents.WINDOW_COMPLETED(once=1))
    def meddle(_):
        with torch.no_grad():
            model.rnn.weight_hh_l0.mul_(0.5)  # on the path later windows backpropagate through

    with pytest.raises(RuntimeError, match="a parameter saved for the retained backward history was modified in place"):
        trainer.run(make_batches([12]))


@pytest.mark.parametrize("k1,k2,recompute", [(4, 4, 2), (3, 7, 2), (2, 8, 1), (6, 2, 3), (5, 5, 5)])
@pytest.mark.parametrize("carry_hidden", [False, True], ids=["fresh", "carry"])
def test_recomputation_mode_matches_the_reference(k1, k2, recompute, carry_hidden):
    trainer = compare_with_reference(k1, k2, carry_hidden=carry_hidden, accumulation=2, recompute=recompute)
    assert all(s.outputs is None for s in trainer.tbptt.history.segments)  # no graph outlives the sweep


@pytest.mark.parametrize("k1,k2", [(4, 4), (3, 6)])
def test_recomputation_mode_replays_dropout(k1, k2):
    # recompute = the natural segment length, so both modes draw the same dropout masks in the same order.
    batches = make_batches([12, 12])
    results = []
    for recompute in (None, 3 if k1 == 3 else 4):
        torch.manual_seed(0)
        model = Net(dropout=0.4).double()
        trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, k1, k2, carry_hidden=True, recompute=recompute)
        trainer.run(batches, max_epochs=2)
        results.append(model)
    assert_same_parameters(results[0], results[1], atol=1e-12)


def test_an_ignite_engine_runs_the_training_step_as_create_tbptt_trainer_does():
    from ignite.engine import Engine

    from ignite_tbptt import tbptt_training_step

    batches = make_batches([7, 12, 5])
    torch.manual_seed(0)
    ours = Net().double()
    plain = copy.deepcopy(ours)
    trainer = create_tbptt_trainer(ours, sgd(ours), cross_entropy, 3, 7, carry_hidden=True)
    trainer.run(batches, max_epochs=2)
    engine = Engine(tbptt_training_step(plain, sgd(plain), cross_entropy, 3, 7, carry_hidden=True))
    windows = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: windows.append(e.state.window))
    engine.run(batches, max_epochs=2)
    assert_same_parameters(ours, plain, atol=0)
    assert windows == [8, 16] and engine.state.optimizer_step == trainer.state.optimizer_step == 16


@pytest.mark.parametrize("k1,k2,per_window", [(2, 4, 2), (3, 5, 4), (4, 4, 1)])
def test_a_windows_last_segment_pays_its_loss_in_the_sweeps_first_backward_call(monkeypatch, k1, k2, per_window):
    # Backward calls per window inside the stream: at 2/4 one for the window's segment and its loss together and
    # one for the retained segment before it (three before the last segment's loss joined its traversal); at
    # 3/5 the first segment (up to the next window's cut) pays its loss at once, then the sweep traverses three
    # segments; at k1 = k2 one. The stream's first and last windows have nothing before or after them.
    calls = []
    engine_run_backward = torch.autograd._engine_run_backward

    def counted(*args, **kwargs):
        calls.append(1)
        return engine_run_backward(*args, **kwargs)

    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, k1, k2)
    ends = [0]
    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda _: ends.append(len(calls)))
    monkeypatch.setattr(torch.autograd, "_engine_run_backward", counted)
    trainer.run(make_batches([12 * k1]))
    per_window_calls = [b - a for a, b in zip(ends, ends[1:])]
    assert len(per_window_calls) == 12 and set(per_window_calls[2:-1]) == {per_window}


def test_the_factory_and_the_training_step_share_their_options_and_refuse_unknown_ones():
    from typing import get_type_hints

    from ignite_tbptt import tbptt_training_step
    from ignite_tbptt.engine import TrainingOptions
    from ignite_tbptt.engine.trainer import _DEFAULTS

    assert set(_DEFAULTS) == set(get_type_hints(TrainingOptions))  # every option has its one default
    model = Net().double()
    for factory in (create_tbptt_trainer, tbptt_training_step):
        with pytest.raises(TypeError, match=rf"{factory.__name__}\(\) got an unexpected keyword argument 'tbtt_step'"):
            factory(model, sgd(model), cross_entropy, 3, tbtt_step=5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'deterministic'"):
        tbptt_training_step(model, sgd(model), cross_entropy, 3, deterministic=True)  # the engine's, not the step's
