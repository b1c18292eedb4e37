"""Sweep programs: windows of several model calls, and windows that reach back (k2 > k1), run whole as one program.

Each test trains eagerly and with programs (uncaptured on the CPU, captured under ``--device cuda``) and compares the
parameters: bit for bit on the CPU where each window is one model call and each step one window (the eager sweep's
order of additions), to float64 rounding (1e-12) otherwise, where the program sums the calls' losses before one
backward pass and adds a step's earlier gradient to the window's sum. Each counts the windows window programs ran, so
that it cannot pass with none.
"""

import pytest
import torch
from torch import nn

from ignite_tbptt import GradientReach, count_targets, create_tbptt_trainer
from ignite_tbptt.runtime.programs import window as window_programs

from .program_mode import assert_replayed
from .test_step import fused_adam
from .test_window import (
    CharModel,
    KeepsItsState,
    assert_same_parameters,
    batches,
    counting_programs,
    loss_fn,
    padded,
    programs,
    summed_over_count,
    train,
    train_with,
    with_window_starts,
)

pytestmark = pytest.mark.usefixtures("recorded_mode")  # each test recorded on the CPU, captured on CUDA


def swept(runs):
    """The runs of window programs of several calls, a reach back or a rebuild (not one call reaching nothing)."""
    return [
        r for r in runs if isinstance(r, window_programs.WindowProgram) and (r.pieces or len(r.calls) > 1 or r.rebuilds)
    ]


def assert_close_parameters(a, b, device, exact=False):
    if exact:
        assert_same_parameters(a, b, device)
    else:
        assert_same_parameters(a, b, torch.device("cuda"))  # within 1e-12: the sums' association differs


@pytest.mark.parametrize(
    "k1, k2", [(5, 10), (1, 8), (5, 20), (5, 7)], ids=["(5, 10)", "per token (1, 8)", "(5, 20)", "(5, 7), split"]
)
@pytest.mark.parametrize("carry_hidden", [False, True], ids=["a stream a batch", "a stream an epoch"])
@pytest.mark.parametrize("accumulation", [1, 3], ids=["a step a window", "3 windows a step"])
def test_windows_reaching_back_give_the_eager_parameters(device, k1, k2, carry_hidden, accumulation):
    data = batches()
    options = {"k1": k1, "k2": k2, "carry_hidden": carry_hidden, "gradient_accumulation_steps": accumulation}
    eager, eager_trainer, _ = train(False, data, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, **options)
    exact = accumulation == 1 and (k2 - k1) % k1 == 0  # one model call a window, one window a step
    assert_close_parameters(eager.parameters(), model.parameters(), device, exact)
    assert trainer.state.output == pytest.approx(eager_trainer.state.output, rel=1e-12)
    assert trainer.state.window == eager_trainer.state.window
    # Each stream's windows whose cut is its start run eagerly, (k2 - k1) // k1 + 1 of them; the others as sweep
    # programs, one program for all (their calls and reach are alike). At (5, 7) each window is two calls, split
    # where the next window's cut falls, and its reach the second call of the window before; a stream's last window,
    # which no window reaches, is one call: a second program.
    windows, streams = 200 // k1, 8 if not carry_hidden else 2
    assert len(swept(runs)) == len(runs) == windows - streams * ((k2 - k1) // k1 + 1)
    assert len({id(r) for r in runs}) == (2 if (k2 - k1) % k1 else 1)
    if device.type == "cuda":  # captured after its warm-up, and replayed since
        assert runs[-1].program.graph is not None


def test_steps_run_as_step_programs_after_reaching_windows(device):
    # A fused optimizer's step after a reaching window is a step program: the weights of the retained segments were
    # copied before it, as the eager step copies them.
    data = batches()
    options = {"k1": 5, "k2": 10, "make": fused_adam}
    from .test_step import train as train_stepping

    eager, eager_trainer, none = train_stepping(False, data, **options)
    with counting_programs() as runs:
        model, trainer, steps = train_stepping(True, data, **options)
    assert_same_parameters(eager.parameters(), model.parameters(), device)
    assert not none and len(steps) == trainer.state.optimizer_step == eager_trainer.state.optimizer_step == 40
    assert len(swept(runs)) == 40 - 2 * 2


def test_a_grad_scaler_scales_each_window_program(device):
    data = batches()
    options = {"k1": 5, "k2": 10, "carry_hidden": True, "dtype": torch.float32, "scaler": True}
    eager, _, _ = train(False, data, **options)
    with counting_programs() as runs:
        model, _, _ = train(True, data, **options)
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0) if device.type == "cpu" else torch.testing.assert_close(p, q)
    assert len(swept(runs)) == 40 - 2 * 2


@pytest.mark.parametrize("accumulation", [1, 3])
def test_a_target_count_on_the_device_in_windows_that_reach_back(device, accumulation):
    data = padded(batches())
    options = {
        "k1": 5,
        "k2": 10,
        "carry_hidden": True,
        "gradient_accumulation_steps": accumulation,
        "target_count_fn": lambda y_pred, y: count_targets(y),
        "loss": summed_over_count,
    }
    eager, eager_trainer, _ = train(False, data, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, **options)
    assert_close_parameters(eager.parameters(), model.parameters(), device, exact=accumulation == 1)
    assert trainer.state.output == pytest.approx(eager_trainer.state.output, rel=1e-12)
    assert len(swept(runs)) == 40 - 2 * 2


def mid_window_starts(data):
    out = []
    for x, y, starts in with_window_starts(data):
        starts = starts.clone()
        starts[7, 0] = True  # inside a window: it splits it into two model calls
        out.append((x, y, starts))
    return out


@pytest.mark.parametrize("k2", [5, 10], ids=["k1 = k2", "k2 > k1"])
@pytest.mark.parametrize(
    "case", ["sequence starts", "batches ending inside windows", "learned initial state", "state in an attribute"]
)
def test_windows_of_several_calls_run_as_one_program(device, case, k2):
    # A sequence start inside a window splits it into two model calls, the second resetting the starting columns as
    # a mask, both inside the program; the retained segments a window reaches run again with their own resets. A
    # window the batch ends inside runs eagerly, and the programs after it run its parts again. A learned initial
    # state's parameters are swapped too; a state kept in the model's attributes is written by each call.
    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    options = {"carry_hidden": True, "k2": k2}
    data, model = mid_window_starts(batches()), CharModel
    if case == "batches ending inside windows":
        data = batches(length=23)
    elif case == "learned initial state":
        options["initial_state"] = True
    elif case == "state in an attribute":
        data, model = batches(), KeepsItsState
        options["module_state"] = ["h"]
    eager = train_with(False, data, model, sgd, **options)
    with counting_programs() as runs:
        params = train_with(True, data, model, sgd, **options)
    assert_close_parameters(eager, params, device)
    if k2 == 5 and case in ("sequence starts", "learned initial state"):
        assert len(swept(runs)) == 8 - 1  # the windows a start splits (one a batch), the first eagerly
    elif k2 == 10:
        assert len(swept(runs)) >= 25  # all but the windows a stream starts with, or the batch ends inside
    else:
        assert not swept(runs)  # one call a window: window programs


def with_a_call_of_padding(data):
    """Sequence starts inside windows, the call before each start of padding only."""
    out = []
    for x, y, starts in mid_window_starts(data):
        y = y.clone()
        y[5:7] = -100  # the window [5, 10)'s first call, [5, 7): no targets
        out.append((x, y, starts))
    return out


@pytest.mark.parametrize("recompute", [None, 2], ids=["kept", "recomputed"])
@pytest.mark.parametrize("k2", [5, 10], ids=["k1 = k2", "k2 > k1"])
def test_a_call_without_targets_adds_no_gradient_of_its_own(device, k2, recompute):
    # With target_count_fn the calls' counts stay on the device: a call of padding only (its loss and gradient NaN
    # here) backpropagates apart, its gradient masked, as an eager segment without targets runs no backward pass;
    # the gradient of the call after it still flows through it.
    options = {
        "k2": k2,
        "recompute": recompute,  # each call's loss backpropagated apart, through calls rebuilt for each
        "carry_hidden": True,
        "target_count_fn": lambda y_pred, y: count_targets(y),
        "loss": summed_over_count,
    }
    data = with_a_call_of_padding(batches())
    eager, eager_trainer, _ = train(False, data, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, **options)
    assert_close_parameters(eager.parameters(), model.parameters(), device)
    assert trainer.state.output == pytest.approx(eager_trainer.state.output, rel=1e-12)
    assert len(swept(runs)) >= 7


def test_an_rnn_given_other_weights_keeps_its_own_where_they_are():
    # Given the weights of a retained segment, torch's RNN modules would flatten them into a new buffer (on CUDA), and
    # their own again at the next call: the parameters' storage would move every window. The swap keeps them.
    from unittest import mock

    with mock.patch.object(nn.GRU, "flatten_parameters", autospec=True) as flatten, counting_programs() as runs:
        model, _, _ = train(True, batches(), k2=10, carry_hidden=True)
    assert len(swept(runs)) == 40 - 2 * 2
    assert flatten.call_count <= 2  # at construction and at .to(dtype): none per segment run again
    rnn = model.rnn
    assert all(ref() is getattr(rnn, name) for ref, name in zip(rnn._flat_weight_refs, rnn._flat_weights_names))
    assert all(w is getattr(rnn, name) for w, name in zip(rnn._flat_weights, rnn._flat_weights_names))


def test_parameters_that_cannot_be_swapped_are_refused_at_construction():
    # A learned initial state given as a function holds its parameter where the swap cannot reach: the retained
    # segments would run again with its value now. Refused, naming the fix; at k1 = k2 nothing runs again.
    h0 = nn.Parameter(torch.full((1, 1, 8), 0.1, dtype=torch.float64))

    def initial(columns):
        return h0.expand(1, columns, -1).contiguous()

    def trainer(k2):
        torch.manual_seed(0)
        model = CharModel().double()
        optimizer = torch.optim.SGD([*model.parameters(), h0], lr=0.1)
        return create_tbptt_trainer(
            model, optimizer, loss_fn, k1=5, k2=k2, initial_state=initial, carry_hidden=True, cuda_graphs=programs(True)
        )

    data = mid_window_starts(batches())
    with pytest.raises(ValueError, match=r"shapes \[\(1, 1, 8\)\] that are neither's .* pass initial_state as a"):
        trainer(10)  # before anything runs
    with counting_programs() as runs:
        trainer(5).run(data, max_epochs=1)
    assert swept(runs)  # the windows a start splits: nothing runs again


class Dropping(CharModel):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x, hidden=None):
        y, hidden = super().forward(x, hidden)
        return self.drop(y), hidden


def test_a_model_drawing_random_numbers_is_refused_before_its_window_changes_anything():
    torch.manual_seed(0)
    model = Dropping().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = create_tbptt_trainer(model, optimizer, loss_fn, k1=5, k2=10, cuda_graphs=programs(True))
    with pytest.raises(ValueError, match=r"model drew random numbers .* \(dropout=0\), or cuda_graphs=False"):
        trainer.run(batches(), max_epochs=1)
    # Recomputation mode runs every call's forward pass again: refused at k1 = k2 as well.
    recomputing = create_tbptt_trainer(model, optimizer, loss_fn, k1=5, recompute=5, cuda_graphs=programs(True))
    with pytest.raises(ValueError, match=r"model drew random numbers"):
        recomputing.run(batches(), max_epochs=1)
    step = trainer._process_function.loop
    # The stream's first two windows ran eagerly; the third, the first window program, was refused, before it added
    # a gradient: the parameters are the second step's.
    assert trainer.state.window == 3 and step.stream.position == 10 and trainer.state.optimizer_step == 2
    assert all(p.grad is None for p in model.parameters())
    # The program checks again at its next run: a refused run does not count as checked.
    refused = [p for p in step.executor.cache.values() if isinstance(p, window_programs.WindowProgram)]
    assert len(refused) == 1 and not refused[0].checked


class StackedWithDropout(CharModel):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(6, 8, num_layers=2, dropout=0.25)


def test_recurrent_dropout_between_layers_is_refused_by_name_where_forward_passes_run_again():
    # cuDNN draws nn.LSTM's dropout between layers from a state of its own, which no generator check sees on CUDA:
    # refused by the module, before the generators are compared (which on the CPU would refuse it too, unnamed).
    torch.manual_seed(0)
    model = StackedWithDropout().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.125)
    if programs(True) is True:  # captured: refused as the trainer is built (test_..._captured_at_any_k2 below)
        with pytest.raises(ValueError, match=r"would capture cuDNN's own dropout state of 'rnn'"):
            create_tbptt_trainer(model, optimizer, loss_fn, k1=5, k2=10, cuda_graphs=True)
        return
    trainer = create_tbptt_trainer(model, optimizer, loss_fn, k1=5, k2=10, cuda_graphs=programs(True))
    with pytest.raises(ValueError, match=r"between their layers \('rnn'\) draw it from cuDNN's own random state"):
        trainer.run(batches(), max_epochs=1)
    assert trainer.state.optimizer_step == 2 and all(p.grad is None for p in model.parameters())
    # Eager recomputation replays the generators, not cuDNN's state: refused on CUDA as the trainer is built.
    with pytest.raises(ValueError, match=r"recompute runs forward passes again.*\('rnn'\).* or recompute=None"):
        create_tbptt_trainer(model, optimizer, loss_fn, k1=5, recompute=5, device="cuda")


@pytest.mark.parametrize("k2", [5, 10], ids=["k1 = k2", "k2 > k1"])
def test_recurrent_dropout_between_layers_is_refused_where_graphs_are_captured_at_any_k2(k2):
    # A CUDA graph captures cuDNN's dropout state by address, at k1 = k2 too; a reseed (deterministic=True reseeds
    # every epoch) makes cuDNN allocate a new one, and older graphs would write into freed memory. Refused as the
    # trainer is built, before anything runs (device="cuda" stands for a model on CUDA: nothing here touches CUDA).
    model = StackedWithDropout().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.125)
    with pytest.raises(ValueError, match=r"would capture cuDNN's own dropout state of 'rnn'.*deterministic=True"):
        create_tbptt_trainer(model, optimizer, loss_fn, k1=5, k2=k2, cuda_graphs=True, device="cuda")
    model.rnn.dropout = 0.0
    create_tbptt_trainer(model, optimizer, loss_fn, k1=5, k2=k2, cuda_graphs=True, device="cuda")


@pytest.mark.parametrize(
    "k1, k2, recompute", [(5, 5, 2), (5, 10, 2), (5, 7, 3), (1, 8, 1)], ids=["(5, 5)", "(5, 10)", "(5, 7)", "(1, 8)"]
)
def test_recomputation_mode_runs_as_window_programs_that_keep_no_activation(device, k1, k2, recompute):
    # With recompute, every window is a window program whose calls (of at most `recompute` steps) and retained
    # segments keep no activation: the backward pass runs each forward pass again, as the eager sweep rebuilds them.
    data = batches()
    options = {"k1": k1, "k2": k2, "recompute": recompute, "carry_hidden": True}
    eager, eager_trainer, _ = train(False, data, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, **options)
    assert_close_parameters(eager.parameters(), model.parameters(), device)
    assert trainer.state.output == pytest.approx(eager_trainer.state.output, rel=1e-12)
    windows = 200 // k1
    assert len(swept(runs)) == len(runs) == windows - 2 * ((k2 - k1) // k1 + 1)

    calls = []

    class Counted(CharModel):
        def forward(self, x, hidden=None):
            calls.append(x.shape[0])
            return super().forward(x, hidden)

    def forward_steps(**more):
        calls.clear()  # the programs' Python, run every window: a replay calls no forward
        train("uncaptured", data, model=Counted, **{**options, **more})
        return sum(calls)

    # Each step runs forward twice in every program (once, and again in the backward pass), its reach as often.
    kept, rebuilt = forward_steps(recompute=None), forward_steps()
    assert rebuilt > kept * 1.5


def test_a_recorded_gradient_reach_runs_its_windows_eagerly(device):
    data = batches()
    eager, _, _ = train(False, data, k2=10, carry_hidden=True, handlers=[GradientReach(every=2).attach])
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, k2=10, carry_hidden=True, handlers=[GradientReach(every=2).attach])
    assert_same_parameters(eager.parameters(), model.parameters(), device)
    assert 0 < len(swept(runs)) < 40 - 2 * 2  # every other window is recorded, and runs eagerly


@pytest.mark.parametrize("k1, k2", [(1, 4), (2, 6)])
def test_resuming_mid_epoch_rebuilds_the_history_window_programs_recompute_from(tmp_path, k1, k2):
    # The history that programs leave (inputs, states, weight versions, no graph) is saved and rebuilt as the eager
    # trainer's; the resumed run's programs reach into it. Batches of 7, 12, 5, 9 and 11 steps: windows split at
    # batch ends run eagerly, and the programs after them recompute their parts.
    from ...helpers import assert_resume_is_bit_identical, make_batches
    from ...reference import Net, cross_entropy

    def build():
        torch.manual_seed(0)
        model = Net(n_hidden=8).double()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        trainer = create_tbptt_trainer(
            model, optimizer, cross_entropy, k1, k2, carry_hidden=True, deterministic=True, cuda_graphs=programs(True)
        )
        return model, optimizer, trainer

    def stopped(trainer):
        assert any(s.outputs is None for s in trainer.tbptt.history.segments)  # a program's, to rebuild

    with counting_programs() as runs:
        trainer = assert_resume_is_bit_identical(tmp_path, build, make_batches([7, 12, 5, 9, 11]), 7, stopped=stopped)
    assert trainer.state.iteration == 15 and len(swept(runs)) > 40
    assert_replayed(trainer, "window")  # the resumed run's programs replayed, reaching into the rebuilt history


def test_predictions_of_every_call_reach_output_transform(device):
    # output_transform gets the batch's predictions, each window program's calls' among them, in order.
    def keep(x, y, y_pred, loss):
        return y_pred

    data = mid_window_starts(batches())
    options = {"k2": 10, "carry_hidden": True, "output_transform": keep}
    eager, eager_trainer, _ = train(False, data, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, **options)
    assert_close_parameters(eager.parameters(), model.parameters(), device)
    assert len(swept(runs)) >= 30
    torch.testing.assert_close(trainer.state.output, eager_trainer.state.output, rtol=1e-12, atol=1e-12)
    assert trainer.state.output.shape == data[-1][1].shape + (10,)  # every step of the last batch


@pytest.mark.parametrize("k2", [100, 75], ids=["k2 = 2 k1", "k2 - k1 not a multiple of k1"])
def test_the_main_jobs_lstm_with_k2_above_k1(device, k2):
    # The main job's model and data (its --cuda-graphs now takes --k2 above --k1): an LSTM whose state is an (h, c)
    # pair, its weights swapped into nn.LSTM for the retained segments, Adam fused as under --cuda-graphs.
    from ignite_tbptt import GradientClipping
    from ignite_tbptt.data import stream_batches
    from ignite_tbptt.examples import _char_lm as char_lm

    text = char_lm.stdlib_corpus()[:6_000]
    vocab = char_lm.Vocabulary(text)
    tokens = vocab.encode(text).to(torch.get_default_device())
    data = [(x, y) for x, y in stream_batches(tokens, 4, 200) if x.shape[0] == 200]

    def trained(cuda_graphs):
        torch.manual_seed(0)
        model = char_lm.CharLSTM(len(vocab), 16, 32).double().to(torch.get_default_device())
        optimizer = torch.optim.Adam(model.parameters(), lr=2**-8, fused=True)  # a power of two: float32 on CUDA too
        trainer = create_tbptt_trainer(
            model,
            optimizer,
            char_lm.cross_entropy,
            50,
            k2,
            carry_hidden=True,
            target_count_fn=lambda y_pred, y: count_targets(y),
            cuda_graphs=programs(cuda_graphs),
        )
        GradientClipping(model, max_norm=1.0).attach(trainer)  # inside the step program
        with counting_programs() as runs:
            trainer.run(data, max_epochs=1)
        if cuda_graphs:
            assert_replayed(trainer, "window", "step")
        return list(model.parameters()), trainer.state.output, runs

    eager, eager_output, _ = trained(False)
    params, output, runs = trained(True)
    assert_close_parameters(eager, params, device)
    assert output == pytest.approx(eager_output, rel=1e-12)
    assert len(swept(runs)) == len(data) * 4 - (k2 - 50) // 50 - 1
