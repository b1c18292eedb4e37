"""The system-identification example: each method trains what it says, and the page's figures hold."""

import pytest
import torch
from ignite.engine import Events

from ignite_tbptt import TBPTTEvents
from ignite_tbptt.data import multisine
from ignite_tbptt.examples import sysid

from .documented import RMSE, figures, within


def test_the_records_are_the_systems_outputs_from_rest_with_their_own_phases():
    (u, y), (u_val, _), (u_test, y_test) = sysid.records("duffing")
    assert [u.shape, u_val.shape, u_test.shape] == [(4000, 1), (1000, 1), (2000, 1)]
    assert u.pow(2).mean().sqrt().item() == pytest.approx(1.0, rel=1e-5)  # the multisine's RMS
    assert not torch.equal(u[:1000], u_val)  # each record its own phases
    simulate, band = sysid.SYSTEMS["duffing"]
    u_test_exact = multisine(2000, band, rms=1.0, seed=2)  # float64, as the records are simulated
    assert torch.equal(u_test_exact.float().unsqueeze(1), u_test)
    assert torch.equal(simulate(u_test_exact).float().unsqueeze(1), y_test)


def test_full_bptt_is_plain_backpropagation_through_the_whole_record():
    record = sysid.records("wiener-hammerstein")[0]
    torch.manual_seed(0)
    model = sysid.Simulator()
    reference = sysid.Simulator()
    reference.load_state_dict(model.state_dict())
    sysid.train(model, record, "full", steps=3)
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    u, y = record
    for _ in range(3):  # the whole record from a zero state, one step per pass
        optimizer.zero_grad()
        y_pred, _ = reference(u.unsqueeze(1))
        torch.nn.functional.mse_loss(y_pred.squeeze(1), y).backward()
        optimizer.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("method", "shape"), [("windows", (50, 16, 1)), ("carried", (50, 16, 1)), ("full", None)])
def test_each_method_takes_the_steps_asked_for_on_batches_of_its_shape(method, shape):
    seen, steps = [], []

    def attach(trainer):
        trainer.add_event_handler(Events.ITERATION_STARTED, lambda e: seen.append(tuple(e.state.batch[0].shape)))
        trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_COMPLETED, lambda e: steps.append(e.state.window))

    # 7 steps: the carried method's record is 5 batches of 50 steps, so the walk stops inside its second pass.
    sysid.train(sysid.Simulator(), sysid.records("duffing")[0], method, steps=7, burn_in=10, attach=attach)
    assert len(steps) == 7
    assert set(seen) == {shape or (4000, 1, 1)}


def test_the_burn_in_defaults_to_the_windows_alone():  # bad options: tests/examples/test_options.py
    assert sysid.parse_args([]).burn_in == 25
    assert sysid.parse_args(["--method", "carried"]).burn_in == sysid.parse_args(["--method", "full"]).burn_in == 0
    assert sysid.parse_args(["--method", "full", "--window", "300", "--batch-size", "100"])  # neither is used


@pytest.mark.slow
@pytest.mark.cpu_only("the documented figures are CPU runs")
def test_the_example_prints_figures_within_the_spread_its_page_gives():
    burn_in, none = figures("sysid")  # test RMSE of windows with a burn-in of 25, then without
    assert within(sysid.main([])["test_rmse"], burn_in, RMSE), burn_in
    assert within(sysid.main(["--burn-in", "0"])["test_rmse"], none, RMSE), none
