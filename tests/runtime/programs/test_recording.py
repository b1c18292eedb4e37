"""``cuda_graphs="recorded"``: capture's rules on the CPU, with teeth.

A program recorded once replays its operators without its Python: a Python value read at capture stays as captured,
a host read is refused at capture with the operator and the line named, and an input freed or moved since capture
is named at the replay. The trainer's program tests beside this file run recorded as well; these test the recording
itself.
"""

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

from ignite_tbptt import TBPTTEvents, create_tbptt_trainer
from ignite_tbptt.runtime import GraphCaptureError, Program
from ignite_tbptt.runtime.programs.recording import Recorder, RecordingError

from .test_window import CharModel, batches, loss_fn

pytestmark = pytest.mark.cpu_only("the recording replays on the device it recorded, checked here on the CPU")


def gru_window_program(model, optimizer, x, hidden, capture):
    """A GRU window's forward pass, its gradients by autograd.grad, and a fused SGD step, as one program."""
    params = list(model.parameters())

    def body():
        y, h = model(x, hidden)
        grads = torch.autograd.grad(y.square().mean(), params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.grad = g
            optimizer.step()
        return h.detach()

    return Program(body, capture, "the window")


def test_a_replay_gives_the_eager_parameters_bit_for_bit():
    torch.manual_seed(0)
    first, hidden = torch.randn(7, 3, 4, dtype=torch.float64), torch.zeros(1, 3, 5, dtype=torch.float64)
    x = first.clone()
    runs = {}
    for capture in (None, Recorder(warmup=2)):
        x.copy_(first)
        torch.manual_seed(1)
        model = nn.GRU(4, 5).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
        program = gru_window_program(model, optimizer, x, hidden, capture)
        states = []
        for window in range(10):
            with torch.no_grad():
                x.add_(0.01 * window)  # the input buffer, written in place before each run
            states.append(program()[0].clone())
        runs[capture is None] = ([p.detach().clone() for p in model.parameters()], states)
    assert capture.counts.as_dict() == {
        **{"captures": 1, "replays": 8, "warmups": 2, "eager_windows": 0, "eager_steps": 0, "evictions": 0},
        **{"window/warmups": 2, "window/captures": 1, "window/replays": 8},
    }
    (eager, eager_states), (replayed, replayed_states) = runs[True], runs[False]
    assert all(torch.equal(a, b) for a, b in zip(eager, replayed))
    assert all(torch.equal(a, b) for a, b in zip(eager_states, replayed_states))


def train(cuda_graphs, data, loss=loss_fn, handlers=(), **options):
    torch.manual_seed(0)
    model = CharModel().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    trainer = create_tbptt_trainer(model, optimizer, loss, 5, carry_hidden=True, cuda_graphs=cuda_graphs, **options)
    for attach in handlers:
        attach(trainer)
    trainer.run(data, max_epochs=2)
    return [p.detach().clone() for p in model.parameters()], trainer


def test_a_python_value_that_changes_between_runs_is_refused_at_capture_before_anything_is_trained_on_it():
    # A loss weighted by a Python float that a handler changes after every window: the uncaptured programs read the
    # new value each window, as the eager trainer does; a graph would keep the value it saw at capture. The capture's
    # run is compared with the warm-up run before it, and the float that differs is named with its operator and line.
    def weighted(factor):
        def loss(y_pred, y):
            return loss_fn(y_pred, y) * factor[0]  # the baked value

        def attach(trainer):
            trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda _: factor.__setitem__(0, factor[0] * 0.97))

        return loss, attach

    results = {}
    for mode in (False, "uncaptured"):
        loss, attach = weighted([1.0])
        results[mode], trainer = train(mode, batches(), loss, [attach])
    assert all(torch.equal(a, b) for a, b in zip(results[False], results["uncaptured"]))
    loss, attach = weighted([1.0])
    with pytest.raises(GraphCaptureError, match=r"aten\.mul\.Tensor, called at .*test_recording\.py:\d+ "
                       r"\(return loss_fn\(y_pred, y\) \* factor\[0\].*\), its argument 1 is 0\.8\d+ where the run "
                       r"before gave 0\.8\d+\. A replay runs no Python"):  # fmt: skip
        train("recorded", batches(), loss, [attach])
    # The same float held fixed is captured and replayed: only a value that changes is refused.
    fixed, _ = weighted([0.5])
    eager, _ = train(False, batches(), fixed)
    replayed, trainer = train("recorded", batches(), fixed)
    assert all(torch.equal(a, b) for a, b in zip(eager, replayed))
    assert trainer._process_function.loop.executor.graphs.counts.replays > 0


def counter_program(body_of_run, warmup=2):
    """A program whose body is ``body_of_run(run)``, the run counted from 0 in Python: what a graph would bake."""
    runs = iter(range(100))
    return Program(lambda: body_of_run(next(runs)), Recorder(warmup=warmup), "the window")


@pytest.mark.parametrize(
    "body_of_run,message",
    [
        (lambda run: torch.ones(3) * (1.0 + run), r"aten\.mul\.Tensor.*its argument 1 is 3\.0 where the run before "
         r"gave 2\.0"),
        (lambda run: torch.ones(2 + run).sum(), r"aten\.ones\.default.*its argument 0 is \(4,\) where the run before "
         r"gave \(3,\)"),
        (lambda run: torch.ones(3).add(torch.tensor([float(run)])), r"aten\.lift_fresh\.default.*torch\.tensor"),
        (lambda run: torch.ones(3).exp() if run < 2 else torch.ones(3).sin(), r"aten\.sin\.default.*differs from the "
         r"run before's operator there, aten\.exp\.default"),
        (lambda run: torch.ones(3).exp().sin() if run < 2 else torch.ones(3).exp(), r"ended after 2 operators, where "
         r"the run before went on with aten\.sin\.default"),
    ],
    ids=["a Python float", "a shape", "a tensor made from host data", "another operator", "fewer operators"],
)  # fmt: skip
def test_a_capture_that_differs_from_the_run_before_names_what_would_be_baked(body_of_run, message):
    program = counter_program(body_of_run)
    program()  # the first run, not compared: it may make what later runs find
    program()  # outlined
    with pytest.raises(GraphCaptureError, match=message):
        program()


def test_a_programs_first_run_is_not_compared_so_state_it_makes_is_no_fault():
    # An optimizer's state, made at its first step: the first run has operators the later ones do not.
    state = {}

    def step(run):
        if "momentum" not in state:
            state["momentum"] = torch.zeros(3)
        return state["momentum"].add_(1.0).clone()

    program = counter_program(step)
    outputs = [program()[0].clone() for _ in range(5)]  # two warm-ups, the capture, two replays
    assert [o.tolist() for o in outputs] == [[float(i)] * 3 for i in range(1, 6)]
    # With a single warm-up run, its first, nothing is compared.
    program = counter_program(lambda run: torch.ones(3) * (1.0 + run), warmup=1)
    program(), program()


@pytest.mark.parametrize(
    "read",
    [lambda t: torch.tensor(t.tolist()), lambda t: torch.from_numpy(t.numpy()), lambda t: t.cpu() * 2],
    ids=[".tolist()", ".numpy()", ".cpu()"],
)
def test_values_handed_to_the_host_are_refused_at_capture_as_a_cuda_capture_refuses_them(read):
    t = torch.randn(3)
    program = Program(lambda: read(t), Recorder(warmup=1), "the window")
    program()
    with pytest.raises(GraphCaptureError, match=r"the window could not be captured: \w+ (hands|copies)"):
        program()


def test_a_copy_between_devices_is_refused_at_capture():
    program = Program(lambda: torch.ones(3).to("meta"), Recorder(warmup=1), "the window")
    program()
    with pytest.raises(GraphCaptureError, match=r"aten\._to_copy\.default copies a tensor from cpu to meta"):
        program()


def test_a_host_read_is_refused_at_capture_with_the_operator_and_the_line():
    def reads_back(y_pred, y):
        loss = loss_fn(y_pred, y)
        if loss.item() > 100:  # a host read: a capture refuses it
            raise AssertionError("diverged")
        return loss

    with pytest.raises(GraphCaptureError, match=r"aten\._local_scalar_dense\.default reads a value back.*"):
        train("recorded", batches(), reads_back)
    # The error names the line that read.
    with pytest.raises(GraphCaptureError, match=r"test_recording\.py:\d+ \(if loss\.item\(\) > 100:"):
        train("recorded", batches(), reads_back)
    # Uncaptured, the same programs run: the read is only a capture's fault.
    train("uncaptured", batches(), reads_back)


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t[t > 0].sum(),
        lambda t: t.nonzero().float().sum(),
        lambda t: t.masked_select(t > 0).sum(),
        lambda t: t.sum() if t.sum() > 0 else -t.sum(),
        lambda t: torch.unique(t).sum(),
    ],
    ids=["boolean mask as an index", "nonzero", "masked_select", "if tensor:", "unique"],
)
def test_shapes_from_data_and_host_reads_are_refused(read):
    t = torch.randn(5)
    program = Program(lambda: read(t), Recorder(warmup=1), "the window")
    program()  # the warm-up runs eagerly
    with pytest.raises(GraphCaptureError, match=r"the window could not be captured: aten\.\w+"):
        program()


def test_an_input_freed_or_moved_since_capture_is_named_at_the_replay():
    model = nn.Linear(3, 2)
    buffers = {"x": torch.randn(4, 3)}
    capture = Recorder(warmup=0, names=lambda: {model.weight.untyped_storage().data_ptr(): "model.weight"})
    program = Program(lambda: model(buffers["x"]).detach(), capture, "the window")
    program()
    program()
    del buffers["x"]  # the owner lets the input go; the graph would read its memory
    with pytest.raises(RecordingError, match=r"the window reads a 4x3 float32 tensor \(argument \d of aten\.\w+"):
        program()

    buffers["x"] = torch.randn(4, 3)
    program = Program(lambda: model(buffers["x"]).detach(), capture, "the window")
    program()
    with torch.no_grad():
        model.weight.data = torch.randn(2, 3)  # new storage: the graph reads the old one
    with pytest.raises(RecordingError, match=r"reads model\.weight, .* moved or resized since the program was"):
        program()


def _made_inside(graph):
    # The storages a recorded program's operators wrote their results into: a graph's pool, on CUDA.
    return {t.untyped_storage().data_ptr() for call in graph._calls for t in call.outputs or () if t is not None}


def _held_tensors(model):
    return [t for m in model.modules() for v in vars(m).values() for t in pytree.tree_leaves(v) if torch.is_tensor(t)]


@pytest.mark.parametrize("cached", ["returned state cached in an attribute", "module_state"])
def test_state_a_model_keeps_in_attributes_between_replays_is_outside_the_graphs_memory(cached):
    # torch vouches for graphs sharing a memory pool only replayed in their capture order: an output read after
    # another graph replays may have been a temporary of that graph. The model's attributes that keep the window's
    # state between windows (a cache of the returned state, module_state's attributes) must point outside the pool.
    from .test_window import CachesItsState, KeepsItsState

    torch.manual_seed(0)
    model = (CachesItsState() if cached.startswith("returned") else KeepsItsState()).double()
    options = {"module_state": ["h"]} if cached == "module_state" else {}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    trainer = create_tbptt_trainer(model, optimizer, loss_fn, 5, carry_hidden=True, cuda_graphs="recorded", **options)
    held, replays = set(), [0]

    @trainer.on(TBPTTEvents.WINDOW_COMPLETED)
    def storages():  # after each window a program replayed
        counts = trainer.state.programs.kinds.get("window", {})
        if counts.get("replays", 0) > replays[0]:
            replays[0] = counts["replays"]
            held.update(t.untyped_storage().data_ptr() for t in _held_tensors(model))

    trainer.run(batches(), max_epochs=2)
    programs = trainer._process_function.loop.executor.cache.values()
    inside = set().union(*(_made_inside(p.program.graph) for p in programs if p.program.graph is not None))
    assert inside and held and not held & inside
