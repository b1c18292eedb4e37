"""``cuda_graphs="replayed"``: capture's rules on the CPU, with teeth.

A program recorded once replays its operators without its Python: a Python value read at capture stays as captured,
a host read is refused at capture with the operator and the line named, and an input freed or moved since capture
is named at the replay. The trainer's program tests beside this file run replayed as well; these test the recording
itself.
"""

import pytest
import torch
from torch import nn

from ignite_tbptt import TBPTTEvents, create_tbptt_trainer
from ignite_tbptt.runtime import GraphCaptureError, Program
from ignite_tbptt.runtime.programs.replayed_capture import GraphReplayError, ReplayedCapture

from .test_executor import CharModel, batches, loss_fn

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
    for capture in (None, ReplayedCapture(warmup=2)):
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
    assert capture.counts.as_dict() == {"captures": 1, "replays": 8, "warmups": 2, "eager_windows": 0, "evictions": 0}
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


def test_a_python_value_read_at_capture_stays_as_captured():
    # A loss weighted by a Python float that a handler changes after every window: the uncaptured programs read the
    # new value each window, as the eager trainer does; a graph keeps the value it saw at capture.
    def weighted(factor):
        def loss(y_pred, y):
            return loss_fn(y_pred, y) * factor[0]

        def attach(trainer):
            trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, lambda _: factor.__setitem__(0, factor[0] * 0.97))

        return loss, attach

    results = {}
    for mode in (False, "uncaptured", "replayed"):
        loss, attach = weighted([1.0])
        results[mode], trainer = train(mode, batches(), loss, [attach])
    assert all(torch.equal(a, b) for a, b in zip(results[False], results["uncaptured"]))
    assert max((a - b).abs().max().item() for a, b in zip(results[False], results["replayed"])) > 1e-4
    assert trainer._process_function.loop.executor.graphs.counts.replays > 0


def test_a_host_read_is_refused_at_capture_with_the_operator_and_the_line():
    def reads_back(y_pred, y):
        loss = loss_fn(y_pred, y)
        if loss.item() > 100:  # a host read: a capture refuses it
            raise AssertionError("diverged")
        return loss

    with pytest.raises(GraphCaptureError, match=r"aten\._local_scalar_dense\.default reads a value back.*"):
        train("replayed", batches(), reads_back)
    # The error names the line that read.
    with pytest.raises(GraphCaptureError, match=r"test_replayed_capture\.py:\d+ \(if loss\.item\(\) > 100:"):
        train("replayed", batches(), reads_back)
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
    program = Program(lambda: read(t), ReplayedCapture(warmup=1), "the window")
    program()  # the warm-up runs eagerly
    with pytest.raises(GraphCaptureError, match=r"the window could not be captured: aten\.\w+"):
        program()


def test_an_input_freed_or_moved_since_capture_is_named_at_the_replay():
    model = nn.Linear(3, 2)
    buffers = {"x": torch.randn(4, 3)}
    capture = ReplayedCapture(warmup=0, names=lambda: {model.weight.untyped_storage().data_ptr(): "model.weight"})
    program = Program(lambda: model(buffers["x"]).detach(), capture, "the window")
    program()
    program()
    del buffers["x"]  # the owner lets the input go; the graph would read its memory
    with pytest.raises(GraphReplayError, match=r"the window reads a 4x3 float32 tensor \(argument \d of aten\.\w+"):
        program()

    buffers["x"] = torch.randn(4, 3)
    program = Program(lambda: model(buffers["x"]).detach(), capture, "the window")
    program()
    with torch.no_grad():
        model.weight.data = torch.randn(2, 3)  # new storage: the graph reads the old one
    with pytest.raises(GraphReplayError, match=r"reads model\.weight, .* moved or resized since the program was"):
        program()
