"""``cuda_graphs=True``: windows run as programs over static buffers, captured in CUDA graphs on a GPU.

On the CPU the same programs run without capture (``cuda_graphs="uncaptured"``), and must give the eager trainer's
parameters bit for bit; under ``--device cuda`` they are captured and replayed (``cuda_graphs=True``), and must
agree with the eager trainer to float64 rounding.
"""

import contextlib
import functools
from unittest import mock

import pytest
import torch
from ignite.engine import Events
from torch import nn

from ignite_tbptt import (
    ARTBP,
    AdaptiveTruncation,
    GradientClipping,
    RandomWindows,
    TBPTTEvents,
    count_targets,
    create_tbptt_trainer,
)
from ignite_tbptt.runtime import model_call
from ignite_tbptt.runtime.programs import window as window_programs

from .program_mode import assert_replayed, mode, programs

pytestmark = pytest.mark.usefixtures("program_mode")  # each test uncaptured and recorded on the CPU


class CharModel(nn.Module):
    def __init__(self, vocab=10, hidden=8, cell=nn.GRU):
        super().__init__()
        self.embedding, self.rnn, self.out = nn.Embedding(vocab, 6), cell(6, hidden), nn.Linear(hidden, vocab)

    def forward(self, x, hidden=None):
        h, hidden = self.rnn(self.embedding(x), hidden)
        return self.out(h), hidden


def loss_fn(y_pred, y):
    return nn.functional.cross_entropy(y_pred.flatten(0, 1).float(), y.flatten())


def batches(length=25, count=4, columns=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 10, (length * count + 1, columns), generator=g, device="cpu").to(torch.get_default_device())
    return [(data[i : i + length], data[i + 1 : i + 1 + length]) for i in range(0, length * count, length)]


def train(
    cuda_graphs,
    data,
    epochs=2,
    optimizer=None,
    handlers=(),
    cell=nn.GRU,
    dtype=torch.float64,
    model=None,
    loss=loss_fn,
    replayed=("window",),
    **options,
):
    torch.manual_seed(0)
    model = (model() if model else CharModel(cell=cell)).to(dtype)
    make = optimizer or (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))
    opt = make(model.parameters())
    trainer = create_tbptt_trainer(model, opt, loss, cuda_graphs=programs(cuda_graphs), **{"k1": 5, **options})
    for attach in handlers:
        attach(trainer)
    with counting_programs() as runs:
        trainer.run(data, max_epochs=epochs)
    if cuda_graphs is True:
        assert_replayed(trainer, *replayed)
    return model, trainer, len(runs)


@contextlib.contextmanager
def counting_programs():
    """The windows programs ran in the block, one entry per window (one program each), in order."""
    runs = []
    run = window_programs.WindowProgram.__call__

    def counted(self, *args):
        runs.append(self)
        return run(self, *args)

    with mock.patch.object(window_programs.WindowProgram, "__call__", counted):
        yield runs


def assert_same_parameters(ps, qs, device, rtol=1e-12, atol=1e-12):
    """Equal on the CPU (the same operations on the same values); captured kernels: within the tolerances."""
    for p, q in zip(ps, qs, strict=True):
        if device.type == "cpu":
            assert torch.equal(p, q)
        else:
            torch.testing.assert_close(p, q, rtol=rtol, atol=atol)


def assert_same(a, b, device):
    assert_same_parameters(a.parameters(), b.parameters(), device)


@pytest.mark.parametrize("carry_hidden", [False, True])
@pytest.mark.parametrize("accumulation", [1, 3])
def test_programs_give_the_eager_parameters(device, carry_hidden, accumulation):
    data = batches()
    options = {"carry_hidden": carry_hidden, "gradient_accumulation_steps": accumulation}
    eager, eager_trainer, _ = train(False, data, **options)
    graphed_model, trainer, runs = train(True, data, **options)
    assert_same(eager, graphed_model, device)
    assert trainer.state.output == pytest.approx(eager_trainer.state.output, rel=1e-12)
    # 5 windows a batch, 8 batches: each stream's first window runs eagerly (no state yet; a stream is an epoch or a
    # batch), and so does the run's second, whose state the model call checks it read; the others as programs.
    assert runs == (40 - 2 - 1 if carry_hidden else 40 - 8 - 1)


@pytest.mark.parametrize(
    "make",
    [
        # Rates of powers of two: fused CUDA kernels read a captured step's rate as float32 (float64 eagerly).
        lambda params: torch.optim.SGD(params, lr=0.125, fused=True),
        lambda params: torch.optim.Adam(params, lr=2**-7, fused=True),
        lambda params: torch.optim.AdamW(params, lr=0.01, foreach=True),
    ],
    ids=["fused SGD", "fused Adam", "foreach AdamW"],
)
def test_optimizers_and_the_inf_check_are_unchanged(device, make):
    data = batches()
    eager, _, _ = train(False, data, optimizer=make, carry_hidden=True)
    graphed_model, _, runs = train(True, data, optimizer=make, carry_hidden=True)
    assert_same(eager, graphed_model, device)
    assert runs > 0


@pytest.mark.parametrize(
    "cached", [None, "gru", "lstm"], ids=["state returned", "state cached in an attribute", "(h, c) cached as a tuple"]
)
def test_no_graph_of_an_eager_window_is_alive_when_a_program_runs(cached):
    # An eager window's graph, kept alive by the state it returned, would keep the parameters' AccumulateGrad nodes
    # of the CUDA stream it ran on; a program's backward pass on the warm-up stream would wait for that stream, and
    # under capture CUDA refuses it ("operation would make the legacy stream depend on a capturing blocking stream").
    # Each eager window's nodes get a hook that records its own release, which comes with the node's.
    made, released, alive_at_programs, program_ran = set(), set(), [], [False]

    class Marker:
        def __init__(self, key):
            self.key = key
            made.add(key)

        def __call__(self, grad_outputs):
            return None

        def __del__(self):
            released.add(self.key)

    def mark_eager_windows(trainer):
        @trainer.on(TBPTTEvents.WINDOW_COMPLETED)
        def _(engine):
            if not program_ran[0]:
                model = engine._process_function.loop.executor.model_call.model
                for i, p in enumerate(model.parameters()):
                    node = p.view_as(p).grad_fn.next_functions[0][0]  # its AccumulateGrad node, of the live graph
                    node.register_prehook(Marker((engine.state.window, i)))
            program_ran[0] = False

    def checked(original):
        def run(self, *args):
            alive_at_programs.append(made - released)
            program_ran[0] = True
            return original(self, *args)

        return run

    with mock.patch.object(window_programs.WindowProgram, "__call__", checked(window_programs.WindowProgram.__call__)):
        model = functools.partial(CachesItsState, lstm=cached == "lstm") if cached else None
        _, _, runs = train(True, batches(), handlers=[mark_eager_windows], model=model, carry_hidden=True)
    assert runs > 0 and len(alive_at_programs) == runs and made
    assert all(not alive for alive in alive_at_programs), [(i, a) for i, a in enumerate(alive_at_programs) if a]


def test_sequence_starts_reset_inside_the_program_and_split_windows_run_as_one_program(device):
    data = batches()
    starts_at = {0: [1], 10: [0, 3], 20: [2], 7: [1]}  # steps 0, 10, 20 open windows; step 7 splits one
    with_starts = []
    for x, y in data:
        starts = torch.zeros(x.shape, dtype=torch.bool)
        for step, columns in starts_at.items():
            starts[step, columns] = True
        with_starts.append((x, y, starts))
    eager, _, _ = train(False, with_starts, carry_hidden=True)
    with counting_programs() as programs_run:
        graphed_model, trainer, runs = train(True, with_starts, carry_hidden=True)
    # The split windows' two calls are one backward pass in a window program: float64 rounding (test_calls.py).
    assert_same_parameters(eager.parameters(), graphed_model.parameters(), torch.device("cuda"))
    calls = [key[4] for key in trainer._process_function.loop.executor.cache]  # each program's calls
    whole = [c[0] for c in calls if len(c) == 1]  # the window programs: one call each
    assert any(c.resets for c in whole) and any(not c.resets for c in whole)  # with a reset mask and without
    # The window holding step 7 of each batch is split: a window program, but the run's second window (whose state
    # the trainer checks the model read), and each stream's first window, which run eagerly.
    assert runs == 40 - 3
    assert sum(len(run.calls) > 1 for run in programs_run) == 8 - 1


def test_clipping_a_handler_setting_gradients_to_none_and_predictions(device):
    data = batches()

    def zero_to_none(trainer):
        params = trainer._process_function.parameters()

        @trainer.on(TBPTTEvents.OPTIMIZER_STEP_COMPLETED)
        def _(engine):
            for p in params:
                p.grad = None

    handlers = [lambda t: GradientClipping(t._process_function.parameters, max_norm=0.05).attach(t), zero_to_none]

    def keep(x, y, y_pred, loss):
        return y_pred

    eager, eager_trainer, _ = train(False, data, handlers=handlers, output_transform=keep, carry_hidden=True)
    graphed_model, trainer, runs = train(True, data, handlers=handlers, output_transform=keep, carry_hidden=True)
    assert_same(eager, graphed_model, device)
    assert runs > 0
    torch.testing.assert_close(trainer.state.output, eager_trainer.state.output, rtol=0, atol=0)


def test_bfloat16_autocast(device):
    data = batches()
    autocast = {"autocast_dtype": torch.bfloat16, "carry_hidden": True}
    # Capture needs autocast without its cache of cast weights, which rounds a GRU's bfloat16 differently on the CPU:
    # the eager reference runs without the cache too.
    uncached = model_call.autocast_for
    with mock.patch.object(model_call, "autocast_for", lambda kind, dtype, cache=True: uncached(kind, dtype, False)):
        eager, _, _ = train(False, data, dtype=torch.float32, **autocast)
    graphed_model, _, runs = train(True, data, dtype=torch.float32, **autocast)
    if device.type == "cpu":
        assert_same(eager, graphed_model, device)
    else:  # bfloat16 rounding, float32 weights
        for p, q in zip(eager.parameters(), graphed_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)
    assert runs > 0


def test_a_grad_scaler_scales_each_program_backward(device):
    data = batches()
    eager, _, _ = train(False, data, dtype=torch.float32, scaler=True, carry_hidden=True)
    graphed_model, _, runs = train(True, data, dtype=torch.float32, scaler=True, carry_hidden=True)
    for p, q in zip(eager.parameters(), graphed_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0) if device.type == "cpu" else torch.testing.assert_close(p, q)
    assert runs > 0


def test_shapes_past_the_limit_run_eagerly(device):
    data = [batches(length=length, count=1, seed=length)[0] for length in (25, 23, 22, 21)]
    eager, _, _ = train(False, data, carry_hidden=False)
    with mock.patch.object(window_programs.ProgramExecutor, "__init__", _limited(2)):
        graphed_model, trainer, runs = train(True, data, carry_hidden=False)
    assert_same(eager, graphed_model, device)
    # Shapes of 5 steps and of 3 steps (25 % 5 = 0, 23 % 5 = 3) are programs; 2 and 1 steps run eagerly.
    assert len(trainer._process_function.loop.executor.cache) == 2


def _limited(limit):
    original = window_programs.ProgramExecutor.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **{**kwargs, "limit": limit})

    return init


def test_what_graphs_do_not_take_is_refused_at_construction():
    model = CharModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    on_cpu = CharModel().to("cpu")
    with pytest.raises(ValueError, match=r"on 'cpu': move it to a CUDA device"):
        create_tbptt_trainer(on_cpu, torch.optim.SGD(on_cpu.parameters(), lr=0.1), loss_fn, k1=5, cuda_graphs=True)
    with pytest.raises(ValueError, match=r"cuda_graphs must be True, False, 'uncaptured' or 'recorded', got 'yes'"):
        create_tbptt_trainer(model, optimizer, loss_fn, k1=5, cuda_graphs="yes")
    for options, match in (
        ({"k1": RandomWindows(5, 10, seed=0)}, r"RandomWindows has k1 = 5, k2 = 10: .* varying length"),
        ({"k2": 2}, r"k1 = 5, k2 = 2: steps before a k2 < k1 cut get their own loss only"),
        ({"k1": ARTBP(grid=3, mean_length=8, seed=0)}, r"ARTBP has k1 = None, k2 = None: .* reweighted"),
    ):
        with pytest.raises(ValueError, match=match):
            create_tbptt_trainer(model, optimizer, loss_fn, **{"k1": 5, **options}, cuda_graphs=programs(True))
    trainer = create_tbptt_trainer(model, optimizer, loss_fn, k1=5, cuda_graphs=programs(True))
    with pytest.raises(
        ValueError, match=r"captures fixed windows of TBPTT\(k1, k2\) with k2 >= k1; AdaptiveTruncation"
    ):
        AdaptiveTruncation(0.1, 6, 20).attach(trainer)


class Initial(nn.Module):
    """A learned initial state: its parameter gets a gradient only from windows that reset a column."""

    def __init__(self, hidden=8):
        super().__init__()
        self.h0 = nn.Parameter(torch.full((1, 1, hidden), 0.1))

    def forward(self, columns):
        return self.h0.expand(1, columns, -1).contiguous()  # cuDNN takes a contiguous hx only


class WithUnused(CharModel):
    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(3, 3)  # in the optimizer, never called: no gradient, so no step


class CachesItsState(nn.Module):
    """A cell loop whose layer keeps its last hidden state in an attribute, as snnTorch's do with init_hidden=False
    (an LSTM's ``(h, c)`` as a tuple); the state is returned and carried all the same, so the attribute only caches it.
    """

    def __init__(self, vocab=10, hidden=8, lstm=False):
        super().__init__()
        self.embedding, self.out = nn.Embedding(vocab, 6), nn.Linear(hidden, vocab)
        self.cell, self.lstm = (nn.LSTMCell if lstm else nn.GRUCell)(6, hidden), lstm
        self.last = None

    def forward(self, x, state=None):
        if state is None:
            zeros = x.new_zeros(x.shape[1], self.cell.hidden_size, dtype=self.out.weight.dtype)
            state = (zeros, zeros) if self.lstm else zeros
        outputs = []
        for e in self.embedding(x):
            state = self.last = self.cell(e, state)
            outputs.append(state[0] if self.lstm else state)
        return self.out(torch.stack(outputs)), state


def train_with(cuda_graphs, data, make_model, make_optimizer, handlers=(), **options):
    torch.manual_seed(0)
    model = make_model().double()
    initial = Initial().double() if options.get("initial_state") else None
    if initial is not None:
        options["initial_state"] = initial
    params = list(model.parameters()) + (list(initial.parameters()) if initial is not None else [])
    trainer = create_tbptt_trainer(
        model, make_optimizer(params), loss_fn, k1=5, cuda_graphs=programs(cuda_graphs), **options
    )
    for attach in handlers:
        attach(trainer, model)
    trainer.run(data, max_epochs=2)
    if cuda_graphs is True:
        assert_replayed(trainer)
    return params


def with_window_starts(data):
    out = []
    for x, y in data:
        starts = torch.zeros(x.shape, dtype=torch.bool)
        starts[10, 1] = starts[20, 3] = True  # at windows' first steps: inside programs
        out.append((x, y, starts))
    return out


@pytest.mark.parametrize("case", ["learned initial state, Adam", "unused parameter, AdamW", "layer frozen mid-run"])
def test_parameters_without_a_gradient_and_changed_sets_of_trained_parameters(device, case):
    data = batches()

    def adam(params):
        return torch.optim.Adam(params, lr=0.01)

    def adamw(params):
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)

    def freeze(trainer, model):
        @trainer.on(Events.ITERATION_COMPLETED(once=3))
        def _(engine):
            model.embedding.weight.requires_grad_(False)
            model.embedding.weight.grad = None

    setups = {
        "learned initial state, Adam": (CharModel, adam, (), {"initial_state": True}, with_window_starts(data)),
        "unused parameter, AdamW": (WithUnused, adamw, (), {}, data),
        "layer frozen mid-run": (CharModel, adam, (freeze,), {}, data),
    }
    make_model, make_optimizer, handlers, options, run_data = setups[case]
    eager = train_with(False, run_data, make_model, make_optimizer, handlers, carry_hidden=True, **options)
    graphed_params = train_with(True, run_data, make_model, make_optimizer, handlers, carry_hidden=True, **options)
    for p, q in zip(eager, graphed_params):
        if device.type == "cpu":
            assert torch.equal(p, q)
        else:
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lstm", [False, True], ids=["GRU cell", "LSTM cell, (h, c) cached as a tuple"])
def test_a_layer_caching_its_returned_state_in_an_attribute(device, lstm):
    # On a GPU the attribute would keep each eager window's, warm-up's or capture's graph into the next capture; 23
    # steps a batch make two window shapes, so two captures.
    data = batches(length=23)

    def adam(params):
        return torch.optim.Adam(params, lr=0.01)

    model = functools.partial(CachesItsState, lstm=lstm)
    eager = train_with(False, data, model, adam, carry_hidden=True)
    with counting_programs() as runs:
        graphed_params = train_with(True, data, model, adam, carry_hidden=True)
    assert len({id(program) for program in runs}) == 2 and len(runs) > 20
    assert_same_parameters(eager, graphed_params, device)


class KeepsItsState(nn.Module):
    """A GRU cell loop whose state lives in an attribute (``module_state=["h"]``), forward(x) returning logits only."""

    def __init__(self, vocab=10, hidden=8):
        super().__init__()
        self.embedding, self.cell, self.out = nn.Embedding(vocab, 6), nn.GRUCell(6, hidden), nn.Linear(hidden, vocab)
        self.register_buffer("h", torch.zeros(1, hidden), persistent=False)  # broadcast at a stream's start

    def forward(self, x):
        h, outputs = self.h.expand(x.shape[1], -1), []
        for e in self.embedding(x):
            h = self.h = self.cell(e, h)
            outputs.append(h)
        return self.out(torch.stack(outputs))


@pytest.mark.parametrize("fused", [False, True], ids=["Adam", "fused Adam (step programs)"])
@pytest.mark.parametrize("starts", [False, True], ids=["one stream", "sequence starts at windows' first steps"])
def test_state_kept_in_the_models_attributes(device, starts, fused):
    # The attribute is written from the program's static buffers and read back from the model after the call; at
    # a sequence start the trainer's reset zeroes the column's state in the tree the program copies in. With a fused
    # optimizer each step runs as a step program between two window programs.
    data = with_window_starts(batches()) if starts else batches()

    def adam(params):
        return torch.optim.Adam(params, lr=2**-7, fused=fused or None)  # a power of two: float32 on CUDA too

    def reset(state, starts):  # the state's tensors, (B, H) in the attribute's tree: zero the starting columns
        return {"modules": {"h": state["modules"]["h"].masked_fill(starts[:, None], 0.0)}, "returned": None}

    options = {"carry_hidden": True, "module_state": ["h"], **({"reset_hidden": reset} if starts else {})}
    eager = train_with(False, data, KeepsItsState, adam, **options)
    with counting_programs() as runs:
        graphed_params = train_with(True, data, KeepsItsState, adam, **options)
    # 5 windows a batch, 8 batches, a stream an epoch: each stream's first window and the run's second run eagerly,
    # the others as programs (the starts fall at windows' first steps, which a program resets as a mask).
    assert len(runs) == 40 - 2 - 1
    assert all(isinstance(r, window_programs.WindowProgram) for r in runs)
    assert_same_parameters(eager, graphed_params, device)


def padded(data):
    """``data`` with padding targets (-100, cross_entropy's ignore_index): a few steps, and all of one window."""
    out = []
    for i, (x, y) in enumerate(data):
        y = y.clone()
        y[3, 1] = y[17:19, 2] = -100
        if i == 1:
            y[10:15] = -100  # the batch's third window: no targets at all
        out.append((x, y))
    return out


def summed_over_count(y_pred, y):
    """The mean over the real targets, padding masked out: NaN, with NaN gradients, where there are none."""
    real = (y != -100).flatten()
    losses = nn.functional.cross_entropy(y_pred.flatten(0, 1).float(), y.clamp(min=0).flatten(), reduction="none")
    return (losses * real).sum() / real.sum()


@pytest.mark.parametrize("accumulation", [1, 3], ids=["a window a step (its mean)", "3 windows a step (their sum)"])
def test_a_target_count_on_the_device_normalises_as_the_eager_trainer_does(device, accumulation):
    # count_targets stays on the device inside the program and is read once the window has run; a window of padding
    # only adds no gradient (here NaN), as an eager one runs no backward pass, and a step of none is not taken.
    data = padded(batches())
    options = {
        "carry_hidden": True,
        "gradient_accumulation_steps": accumulation,
        "target_count_fn": lambda y_pred, y: count_targets(y),
        "loss": summed_over_count,
    }
    eager, eager_trainer, _ = train(False, data, **options)
    graphed_model, trainer, runs = train(True, data, **options)
    assert runs == 40 - 2 - 1  # the window of padding ran as a program too
    assert_same(eager, graphed_model, device)
    assert trainer.state.output == pytest.approx(eager_trainer.state.output, rel=1e-12)
    # The count matters: normalising by every step instead gives other parameters (cross_entropy's own mean, whose
    # gradient is zero where it has no targets: the window of padding takes a step of zero gradients).
    with pytest.warns(UserWarning, match="target_count_fn is None"):  # the padding named, as it is counted
        uncounted, _, _ = train(True, data, **{**options, "target_count_fn": None, "loss": loss_fn})
    assert not all(torch.equal(p, q) for p, q in zip(eager.parameters(), uncounted.parameters()))


@pytest.mark.parametrize("fused", [False, True], ids=["Adam", "fused Adam (step programs)"])
def test_snntorch_neurons_keeping_their_membranes_in_attributes(device, fused):
    # The spiking example's network: snnTorch's Leaky(init_hidden=True) neurons, their membranes named by
    # module_state. The heaviside spike and its surrogate gradient run in the program as in an eager call. In float32:
    # snnTorch's spikes are float32 whatever the membrane's dtype.
    pytest.importorskip("snntorch")
    from ignite_tbptt.examples._spiking_vowels import STATE, SpikingSpeakerNet

    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 4, 12, generator=g).to(torch.get_default_device())
    y = torch.randint(0, 9, (100, 4), generator=g).to(torch.get_default_device())
    data = [(x[i : i + 25], y[i : i + 25]) for i in range(0, 100, 25)]

    def trained(cuda_graphs):
        torch.manual_seed(0)
        model = SpikingSpeakerNet(hidden=16).to(torch.get_default_device())
        optimizer = torch.optim.Adam(model.parameters(), lr=2**-7, fused=fused or None)
        trainer = create_tbptt_trainer(
            model, optimizer, loss_fn, k1=5, carry_hidden=True, module_state=STATE, cuda_graphs=programs(cuda_graphs)
        )
        trainer.run(data, max_epochs=2)
        if cuda_graphs:
            assert_replayed(trainer, "window", *(["step"] if fused else []))
        return list(model.parameters())

    eager = trained(False)
    with counting_programs() as runs:
        graphed_params = trained(True)
    assert len(runs) == 40 - 2 - 1  # 5 windows a batch, 4 batches, 2 epochs of one stream each
    assert all(isinstance(r, window_programs.WindowProgram) for r in runs)
    assert_same_parameters(eager, graphed_params, device, rtol=1e-5, atol=1e-6)  # captured kernels: float32


def test_shapes_past_the_limit_drop_the_least_recently_used_program_and_windows_keep_running_as_programs(device):
    # Sequence starts at random places: each window's calls (split where a column starts a sequence) and resets make
    # a shape of their own, far more than 8. Shapes that stop coming are dropped for new ones, so that windows go on
    # running as programs, as many as with no limit at all; the counts say so.
    g = torch.Generator().manual_seed(3)
    data = []
    for x, y in batches():
        data.append((x, y, (torch.rand(x.shape, generator=g) < 0.04).to(x.device)))
    options = {"carry_hidden": True}
    eager, _, _ = train(False, data, **options)
    model, trainer, _ = train(True, data, **options)
    with mock.patch.dict(window_programs.ProgramExecutor.__init__.__kwdefaults__, {"limit": 1000}):
        _, unlimited, _ = train(True, data, **options)
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-12, atol=1e-12)
    counts, without_limit = trainer.state.programs, unlimited.state.programs
    assert counts.evictions > 0 and without_limit.evictions == 0
    assert counts.eager_windows == without_limit.eager_windows
    assert counts.eager_windows < 40 // 4  # the stream's first windows, and those the batches end inside


def test_each_window_run_eagerly_is_counted_with_its_reason(device):
    # Batches of 23 steps at k1 = 5, one stream per epoch (92 steps, 19 windows): a stream's first window has no state
    # yet and the run's second checks the returned state's cut, eagerly (3 windows); the windows the batches end
    # inside, [20, 25), [45, 50) and [65, 70) in each epoch, run eagerly too (6); every other window runs in a program.
    # The optimizer, SGD without fused=True, cannot skip a step on the device: each of the 38 steps runs eagerly.
    _, trainer, runs = train(True, batches(length=23), carry_hidden=True)
    counts = trainer.state.programs
    assert counts.eager == {"checks": 3, "batch_ends_inside": 6, "step/optimizer": 38}
    assert counts.eager_windows == 9 and runs == 2 * 19 - 9 and counts.eager_steps == 38
    assert counts.as_dict()["eager/batch_ends_inside"] == 6


def test_a_replays_predictions_are_copied_out_only_where_output_transform_asks():
    # A graph's outputs are overwritten by its next replay, so what the host keeps is copied out; the predictions (a
    # window's (T, B, vocabulary) logits) only where output_transform takes them.
    copied = []

    def spying(copied_out):
        def spy(outputs, fresh):
            if not fresh:
                copied.extend(tuple(t.shape) for t in torch.utils._pytree.tree_leaves(outputs) if torch.is_tensor(t))
            return copied_out(outputs, fresh)

        return spy

    for asked in (False, True):
        copied.clear()
        options = {"carry_hidden": True}
        if asked:
            options["output_transform"] = lambda x, y, y_pred, loss: (y_pred, y)
        with mock.patch.object(window_programs, "copied_out", spying(window_programs.copied_out)):
            train(True, batches(), **options)
        predictions = [shape for shape in copied if shape[-1:] == (10,)]  # (5, 4, 10): the logits over 10 tokens
        if mode() == "uncaptured":
            assert not copied  # an uncaptured run's outputs are its own
        else:
            assert copied and bool(predictions) == asked


def test_the_window_programs_old_name_still_imports_with_a_warning():
    import ignite_tbptt.runtime as runtime

    with pytest.warns(DeprecationWarning, match="WindowProgram"):
        assert runtime.SweepProgram is runtime.WindowProgram
