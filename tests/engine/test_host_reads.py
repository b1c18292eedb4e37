"""Host reads: none per window unless a handler asks for a value; non-finite steps refused on the device or at once."""

import copy
import math
import warnings

import pytest
import torch
from ignite.engine import Events
from ignite.handlers import TerminateOnNan

from benchmarks.overhead import counting_reads
from ignite_tbptt import TBPTTEvents, create_tbptt_trainer

from ..helpers import make_batches
from ..reference import Net, cross_entropy


def trainer_for(model, fused, k1=5, k2=5, on_device=True, **kwargs):
    """``on_device``: a fused optimizer's decisions stay on the device, as on an accelerator, on the CPU too."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5, fused=fused)
    trainer = create_tbptt_trainer(model, optimizer, cross_entropy, k1, k2, **kwargs)
    trainer.tbptt.optimizer_step.reads_cpu_decisions = not on_device
    return trainer


def on(device, batches):
    return [tuple(t.to(device) for t in batch) for batch in batches]


# Counted without torch's default device (see tests/conftest.py): the model and batches are put on the --device.
counted = pytest.mark.explicit_device


def reads_in_run(batches, fused, handler=None, device="cpu", on_device=True, **kwargs):
    torch.manual_seed(0)
    trainer = trainer_for(Net().double().to(device), fused, on_device=on_device, **kwargs)
    batches = on(device, batches)
    trainer.run(batches[:1])  # the first run's one-off work is not counted
    if handler is not None:
        trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, handler)
    with counting_reads() as counts:
        state = trainer.run(batches)
    return counts["reads"], state


@counted
@pytest.mark.parametrize("k1,k2", [(5, 5), (5, 10), (1, 4)])
def test_a_fused_optimizer_makes_no_host_read_per_window(k1, k2, device):
    # Same 200 steps, in 5 batches of 40 or 20 of 10: only the iterations' reads differ.
    for length in (40, 10):
        batches = make_batches([length] * (200 // length))
        reads, state = reads_in_run(batches, fused=True, device=device, k1=k1, k2=k2)
        assert state.window == 200 // k1
        # One read for the iteration's output (loss.item(), as ignite) and one for the steps' finiteness.
        assert reads == 2 * len(batches)


@counted
def test_on_the_cpu_a_fused_optimizers_decision_is_read_at_each_step(device):
    # Where a read waits for nothing it costs less than keeping the decision on the device.
    batches = make_batches([40] * 5)
    reads, state = reads_in_run(batches, fused=True, device=device, on_device=False)
    assert state.optimizer_step == state.window == 5 * 8
    per_step = 1 if device.type == "cpu" else 0  # an accelerator's decisions stay on it
    assert reads == 2 * len(batches) - (per_step * len(batches)) + per_step * state.optimizer_step


@counted
def test_another_optimizer_reads_once_per_optimizer_step(device):
    batches = make_batches([40] * 5)
    reads, state = reads_in_run(batches, fused=False, device=device, gradient_accumulation_steps=2)
    assert state.optimizer_step == 5 * 4  # 8 windows a batch, one step every 2
    assert reads == len(batches) + state.optimizer_step


@counted
@pytest.mark.parametrize("fused", [True, False])
def test_a_scaler_costs_one_read_per_optimizer_step_to_see_whether_it_skipped(fused, device):
    batches = make_batches([40] * 5)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8)
    reads, state = reads_in_run(batches, fused=fused, device=device, scaler=scaler, gradient_accumulation_steps=2)
    assert state.optimizer_step == 5 * 4
    # An unfused optimizer's GradScaler.step reads the same flags once more before it steps.
    assert reads == len(batches) + state.optimizer_step * (1 if fused else 2)


@counted
def test_the_window_output_is_read_only_for_handlers_of_window_events(device):
    batches = make_batches([40] * 5)
    outputs = []

    def handler(engine):
        outputs.append((engine.state.output, engine.state.window_loss))

    reads, state = reads_in_run(batches, fused=True, device=device, handler=handler)
    assert reads == 2 * len(batches) + state.window  # one more for each window with a listener
    assert len(outputs) == state.window
    for output, window_loss in outputs:
        assert isinstance(output, float) and output == pytest.approx(window_loss.item(), rel=1e-12)


def run_with_nan(fused, terminate=False, on_device=True):
    torch.manual_seed(0)
    model = Net().double()
    batches = make_batches([6, 6, 6])
    batches[1][0][4, 1, 2] = float("nan")  # window 4 (steps 9-11) of the carried stream
    trainer = trainer_for(model, fused, 3, 5, on_device=on_device, carry_hidden=True)
    snapshots, outputs = {}, []
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_COMPLETED, lambda e: snapshots.update({e.state.optimizer_step: copy.deepcopy(model)})
    )
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(e.state.output))
    if terminate:
        trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan())
    return model, trainer, batches, snapshots, outputs


def test_a_fused_optimizer_refuses_a_non_finite_step_on_the_device_and_the_error_follows():
    model, trainer, batches, snapshots, outputs = run_with_nan(fused=True)
    with pytest.raises(FloatingPointError, match="non-finite gradients at optimizer step 4 .*every later step"):
        trainer.run(batches)
    # Step 4 and the later steps of its iteration were refused: the parameters are those after step 3.
    for p, q in zip(model.parameters(), snapshots[3].parameters()):
        assert torch.equal(p, q) and torch.isfinite(p).all()
    assert math.isnan(outputs[-1]) and len(outputs) == 2  # the iteration ended with a NaN output
    assert not trainer.tbptt.history.segments


@pytest.mark.cpu_only("the CPU's own path: an accelerator keeps each decision on the device")
def test_on_the_cpu_a_fused_optimizer_refuses_a_non_finite_step_at_the_step():
    model, trainer, batches, snapshots, outputs = run_with_nan(fused=True, on_device=False)
    with pytest.raises(FloatingPointError, match="non-finite gradients at optimizer step 4 .*the step was not taken"):
        trainer.run(batches)
    for p, q in zip(model.parameters(), snapshots[3].parameters()):
        assert torch.equal(p, q) and torch.isfinite(p).all()
    assert trainer.state.window == 4  # no window ran after the refused one
    assert math.isnan(outputs[-1]) and len(outputs) == 2


def test_terminate_on_nan_ends_a_fused_run_where_it_ends_an_unfused_one():
    ends = {}
    for fused, on_device in ((False, False), (True, True), (True, False)):
        model, trainer, batches, snapshots, _ = run_with_nan(fused, terminate=True, on_device=on_device)
        state = trainer.run(batches)
        ends[fused, on_device] = state.iteration, [p.detach().clone() for p in model.parameters()]
        assert math.isnan(state.output)
    (iteration, parameters), *others = ends.values()
    assert iteration == 2
    for other_iteration, other_parameters in others:
        assert other_iteration == iteration
        for p, q in zip(parameters, other_parameters):
            assert torch.equal(p, q)


@counted
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_no_synchronisation_per_window():
    def synchronisations(length):
        torch.manual_seed(0)
        model = Net().double().cuda()
        batches = [(x.cuda(), y.cuda()) for x, y in make_batches([length] * (200 // length))]
        trainer = trainer_for(model, True, device="cuda")
        trainer.run(batches[:1])
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.run(batches)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        # torch warns "called a synchronizing CUDA operation" at each synchronisation; its one-time notice that the
        # debug mode is a prototype ("Synchronization debug mode is a prototype feature...") is none.
        syncs = [w for w in caught if "called a synchronizing cuda operation" in str(w.message).lower()]
        return [f"{w.filename}:{w.lineno}" for w in syncs], len(batches)

    for length in (40, 10):
        syncs, iterations = synchronisations(length)
        # The iteration's output and the steps' finiteness, not per window; the message names where they were.
        assert len(syncs) <= 2 * iterations, sorted(set(syncs))


def test_divide_and_check_divides_every_dtype_and_flags_non_finite():
    from ignite_tbptt.runtime import divide_and_check

    g32 = torch.tensor([3.0, -6.0])
    g64 = torch.tensor([1.0, 7.0], dtype=torch.float64)
    sparse = torch.sparse_coo_tensor([[0, 2]], [4.0, 8.0], (3,))
    found = divide_and_check([g32, g64, sparse], 3)
    assert found.item() == 0.0
    torch.testing.assert_close(g32, torch.tensor([1.0, -2.0]))
    assert torch.equal(g64, torch.tensor([1.0, 7.0], dtype=torch.float64) / 3)  # exact division in float64
    torch.testing.assert_close(sparse.to_dense(), torch.tensor([4.0, 0.0, 8.0]) / 3)
    assert divide_and_check([torch.tensor([float("nan")])], 2).item() == 1.0
    # Without a division (a scale of one, exact in every dtype) mixed dtypes share the kernel; sparse ones do not.
    h16, h64 = torch.tensor([2.0, 5.0], dtype=torch.float16), torch.tensor([1.0, float("inf")], dtype=torch.float64)
    one_sparse = torch.sparse_coo_tensor([[1]], [3.0], (3,))
    assert divide_and_check([h16, h64, one_sparse], 1).item() == 1.0
    assert torch.equal(h16, torch.tensor([2.0, 5.0], dtype=torch.float16)) and h64[0].item() == 1.0
    assert torch.equal(one_sparse.to_dense(), torch.tensor([0.0, 3.0, 0.0]))
    # A sparse gradient among dense ones of one dtype, divided: each is divided once.
    a, b = torch.tensor([3.0, 6.0]), torch.tensor([9.0])
    one_sparse = torch.sparse_coo_tensor([[0]], [12.0], (2,))
    assert divide_and_check([a, one_sparse, b], 3).item() == 0.0
    assert torch.equal(a, torch.tensor([1.0, 2.0])) and torch.equal(b, torch.tensor([3.0]))
    assert torch.equal(one_sparse.to_dense(), torch.tensor([4.0, 0.0]))
    assert divide_and_check([torch.tensor([float("inf")], dtype=torch.float64)], 2).item() == 1.0
    # A refused step refuses every later one: the earlier decision carries over, and is not changed.
    assert divide_and_check([torch.tensor([1.0])], 1, earlier=torch.ones(())).item() == 1.0
    earlier = torch.zeros(())
    assert divide_and_check([torch.tensor([float("nan")])], 1, earlier=earlier).item() == 1.0
    assert earlier.item() == 0.0
    # A decision read at once is set in place, and kept by the caller while it reads 0.0.
    into = torch.zeros(())
    assert divide_and_check([torch.tensor([1.0]), g64], 2, into=into).item() == 0.0 and into.item() == 0.0
    assert divide_and_check([torch.tensor([float("inf")])], 2, into=into) is into and into.item() == 1.0
    with pytest.raises(ValueError, match="not both"):
        divide_and_check([torch.tensor([1.0])], 1, earlier=earlier, into=into)


@pytest.mark.cpu_only("the CPU's own path: an accelerator keeps each decision on the device")
def test_a_refused_step_read_at_once_does_not_refuse_the_next_finite_one():
    from ignite_tbptt.engine.optimizer_step import OptimizerStep, RunPosition

    weight = torch.nn.Parameter(torch.ones(2))
    step = OptimizerStep(torch.optim.SGD([weight], lr=0.5, fused=True), None, 1)
    for grad, refused in (([float("nan"), 1.0], True), ([2.0, 4.0], False)):
        step.window_started()
        weight.grad = torch.tensor(grad)
        step.accumulate(2, backward_mean=False)
        step.window_completed()
        if refused:
            with pytest.raises(FloatingPointError, match="optimizer step 1 "):
                step.prepare(RunPosition(-1, 1, 1, 1, 1))
        else:
            assert step.prepare(RunPosition(-1, 1, 1, 2, 1)) == 2
            step.apply()
    assert torch.equal(weight.detach(), torch.tensor([0.5, 0.0]))  # the finite step, its gradient divided by 2


def test_a_float64_default_dtype_does_not_change_the_decisions_dtype():
    # The kernel sets a float32 decision whatever torch's default dtype is.
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        trainer = trainer_for(Net(), fused=True, on_device=False)
        state = trainer.run(make_batches([10, 10]))
        assert state.optimizer_step == 4 and math.isfinite(state.output)
    finally:
        torch.set_default_dtype(default)
