"""Windows of several model calls run whole as one program; windows that reach back (k2 > k1), and recomputation
mode, run eagerly, counted with their reason, and their optimizer steps as step programs.

Each test trains eagerly and with programs (uncaptured or recorded on the CPU, captured under ``--device cuda``) and
compares the parameters: bit for bit on the CPU where each window is one model call and each step one window, or
where windows run eagerly (the eager sweep itself), to float64 rounding (1e-12) otherwise, where the program sums the
calls' losses before one backward pass. Each counts the windows window programs ran, so that it cannot pass with none,
or asserts that none ran where none may.
"""

import pytest
import torch
from torch import nn

from ignite_tbptt import GradientClipping, GradientReach, count_targets, create_tbptt_trainer

from .program_mode import assert_replayed, programs
from .test_step import fused_adam
from .test_window import (
    CharModel,
    KeepsItsState,
    assert_same_parameters,
    batches,
    counting_programs,
    loss_fn,
    summed_over_count,
    train,
    train_with,
    with_window_starts,
)

pytestmark = pytest.mark.usefixtures("recorded_mode")  # each test recorded on the CPU, captured on CUDA


def several_calls(runs):
    """The runs of window programs of several calls."""
    return [r for r in runs if len(r.calls) > 1]


@pytest.mark.parametrize("k1, k2", [(5, 10), (1, 8), (5, 7)], ids=["(5, 10)", "per token (1, 8)", "(5, 7), split"])
@pytest.mark.parametrize("accumulation", [1, 3], ids=["a step a window", "3 windows a step"])
def test_windows_reaching_back_run_eagerly_and_their_steps_as_programs(device, k1, k2, accumulation):
    # Their retained segments keep their graphs across windows, which no program carries: every window runs eagerly,
    # counted under reaches_back once the stream's first checks are done, and fused Adam's steps run as step programs
    # (the retained segments' weights copied before each, as eagerly). The eager sweep itself: bit for bit.
    data = batches()
    options = {"k1": k1, "k2": k2, "carry_hidden": True, "gradient_accumulation_steps": accumulation}
    eager, eager_trainer, _ = train(False, data, optimizer=fused_adam, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, optimizer=fused_adam, replayed=("step",), **options)
    assert_same_parameters(eager.parameters(), model.parameters(), device)
    assert trainer.state.output == pytest.approx(eager_trainer.state.output, rel=1e-12)
    counts = trainer.state.programs
    assert not runs and counts.eager_windows == trainer.state.window == eager_trainer.state.window
    assert counts.eager["reaches_back"] > 0 and set(counts.eager) <= {"checks", "reaches_back"}
    assert counts.eager_steps == 0 and trainer.state.optimizer_step == eager_trainer.state.optimizer_step


def test_a_model_drawing_random_numbers_trains_with_windows_reaching_back(device):
    # No forward pass runs again where windows run eagerly: a model with dropout trains as the eager trainer does.
    class Dropping(CharModel):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.1)

        def forward(self, x, hidden=None):
            y, hidden = super().forward(x, hidden)
            return self.drop(y), hidden

    eager, _, _ = train(False, batches(), model=Dropping, k2=10, optimizer=fused_adam)
    model, trainer, _ = train(True, batches(), model=Dropping, k2=10, optimizer=fused_adam, replayed=("step",))
    assert_same_parameters(eager.parameters(), model.parameters(), device)
    assert trainer.state.programs.eager["reaches_back"] > 0


def mid_window_starts(data):
    out = []
    for x, y, starts in with_window_starts(data):
        starts = starts.clone()
        starts[7, 0] = True  # inside a window: it splits it into two model calls
        out.append((x, y, starts))
    return out


@pytest.mark.parametrize(
    "case", ["sequence starts", "batches ending inside windows", "learned initial state", "state in an attribute"]
)
def test_windows_of_several_calls_run_as_one_program(device, case):
    # A sequence start inside a window splits it into two model calls, the second resetting the starting columns as
    # a mask, both inside the program. A window the batch ends inside runs eagerly. A learned initial state's
    # parameters get their gradient inside the program; a state kept in the model's attributes is written by each
    # call.
    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    options: dict = {"carry_hidden": True}
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
    assert_same_parameters(eager, params, torch.device("cuda"))  # within 1e-12: the calls' losses summed first
    if case in ("sequence starts", "learned initial state"):
        assert len(several_calls(runs)) == 8 - 1  # the windows a start splits (one a batch), the first eagerly
    else:
        assert runs and not several_calls(runs)  # one call a window


def with_a_call_of_padding(data):
    """Sequence starts inside windows, the call before each start of padding only."""
    out = []
    for x, y, starts in mid_window_starts(data):
        y = y.clone()
        y[5:7] = -100  # the window [5, 10)'s first call, [5, 7): no targets
        out.append((x, y, starts))
    return out


def test_a_call_without_targets_adds_no_gradient_of_its_own(device):
    # With target_count_fn the calls' counts stay on the device: a call of padding only (its loss and gradient NaN
    # here) backpropagates apart, its gradient masked, as an eager segment without targets runs no backward pass;
    # the gradient of the call after it still flows through it.
    options = {
        "carry_hidden": True,
        "target_count_fn": lambda y_pred, y: count_targets(y),
        "loss": summed_over_count,
    }
    data = with_a_call_of_padding(batches())
    eager, eager_trainer, _ = train(False, data, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, **options)
    assert_same_parameters(eager.parameters(), model.parameters(), torch.device("cuda"))
    assert trainer.state.output == pytest.approx(eager_trainer.state.output, rel=1e-12)
    assert len(several_calls(runs)) >= 7


class StackedWithDropout(CharModel):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(6, 8, num_layers=2, dropout=0.25)


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


@pytest.mark.parametrize("k2", [5, 10], ids=["k1 = k2", "k2 > k1"])
def test_recomputation_mode_runs_its_windows_eagerly(device, k2):
    # The sweep rebuilds each segment's graph as it reaches it, which no program does: every window runs eagerly,
    # counted under recompute (or reaches_back, which planning weighs first); the steps still run as programs.
    data = batches()
    options = {"k2": k2, "recompute": 2, "carry_hidden": True}
    eager, eager_trainer, _ = train(False, data, optimizer=fused_adam, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, optimizer=fused_adam, replayed=("step",), **options)
    assert_same_parameters(eager.parameters(), model.parameters(), device)
    counts = trainer.state.programs
    assert not runs and counts.eager_windows == trainer.state.window
    assert counts.eager["reaches_back" if k2 > 5 else "recompute"] == trainer.state.window - counts.eager["checks"]


def test_a_recorded_gradient_reach_runs_its_windows_eagerly(device):
    data = batches()
    eager, _, _ = train(False, data, carry_hidden=True, handlers=[GradientReach(every=2).attach])
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, carry_hidden=True, handlers=[GradientReach(every=2).attach])
    assert_same_parameters(eager.parameters(), model.parameters(), device)
    assert 0 < len(runs) < 40 - 2  # every other window is recorded, and runs eagerly
    # Windows 4, 6, ..., 40 recorded; the first two and the second epoch's first (a stream each) ran for the checks.
    assert trainer.state.programs.eager == {"checks": 3, "recorded": 19, "step/optimizer": 40}


def test_predictions_of_every_call_reach_output_transform(device):
    # output_transform gets the batch's predictions, each window program's calls' among them, in order.
    def keep(x, y, y_pred, loss):
        return y_pred

    data = mid_window_starts(batches())
    options = {"carry_hidden": True, "output_transform": keep}
    eager, eager_trainer, _ = train(False, data, **options)
    with counting_programs() as runs:
        model, trainer, _ = train(True, data, **options)
    assert_same_parameters(eager.parameters(), model.parameters(), torch.device("cuda"))
    assert len(several_calls(runs)) >= 7
    torch.testing.assert_close(trainer.state.output, eager_trainer.state.output, rtol=1e-12, atol=1e-12)
    assert trainer.state.output.shape == data[-1][1].shape + (10,)  # every step of the last batch


@pytest.mark.parametrize("k2", [50, 100], ids=["k1 = k2", "k2 = 2 k1"])
def test_the_main_jobs_lstm(device, k2):
    # The main job's model and data under --cuda-graphs: an LSTM whose state is an (h, c) pair, Adam fused, clipping
    # inside the step program. At k1 = k2 windows and steps run as programs; at k2 > k1 the steps.
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
            assert_replayed(trainer, *(("window", "step") if k2 == 50 else ("step",)))
        return list(model.parameters()), trainer.state.output, runs

    eager, eager_output, _ = trained(False)
    params, output, runs = trained(True)
    assert_same_parameters(eager, params, device)
    assert output == pytest.approx(eager_output, rel=1e-12)
    assert len(runs) == (len(data) * 4 - 2 if k2 == 50 else 0)
