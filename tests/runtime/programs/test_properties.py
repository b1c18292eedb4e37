"""Programs against the eager trainer over random schedules, batches and sequence starts (hypothesis).

Whatever k1 <= k2 (k2 up to 4 k1), accumulation, batch lengths (batches ending inside windows), per-column sequence
starts at arbitrary steps, target counts and fused optimizer: programs uncaptured and recorded under capture's rules
give the eager trainer's parameters, within 1e-12 (a window program sums a window's gradient in another order).
"""

import contextlib
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from ignite_tbptt import count_targets, create_tbptt_trainer
from ignite_tbptt.runtime.programs.recording import Recorder

from .test_window import CharModel, loss_fn, summed_over_count

pytestmark = pytest.mark.cpu_only("the property compares the programs run on the CPU, uncaptured and recorded")

COLUMNS = 3


def stream(lengths, start_rate, padding_rate, seed):
    """Batches of ``lengths`` steps of one stream: tokens, next tokens (some -100), and per-column starts."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for length in lengths:
        x = torch.randint(0, 10, (length, COLUMNS), generator=g)
        y = torch.randint(0, 10, (length, COLUMNS), generator=g)
        y[torch.rand(length, COLUMNS, generator=g) < padding_rate] = -100
        starts = torch.rand(length, COLUMNS, generator=g) < start_rate
        out.append((x, y, starts))
    return out


@contextlib.contextmanager
def two_warmups():
    # Two warm-up runs rather than CUDA's three, so that the short runs capture and replay their programs, each capture
    # compared with the run before it.
    init = Recorder.__init__
    with mock.patch.object(Recorder, "__init__", lambda self, warmup=3, names=None: init(self, 2, names)):
        yield


def train(cuda_graphs, data, k1, k2, accumulation, cell, optimizer, counted):
    torch.manual_seed(0)
    model = CharModel(hidden=5, cell=cell).double()
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.125, momentum=0.5, fused=True)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=2**-7, fused=True)
    options = {"target_count_fn": lambda y_pred, y: count_targets(y)} if counted else {}
    trainer = create_tbptt_trainer(
        model,
        opt,
        summed_over_count if counted else loss_fn,
        k1,
        k2,
        carry_hidden=True,
        gradient_accumulation_steps=accumulation,
        cuda_graphs=cuda_graphs,
        **options,
    )
    with two_warmups():
        trainer.run(data, max_epochs=1)
    return [p.detach().clone() for p in model.parameters()], trainer


@pytest.mark.slow  # many trainings, three ways each
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    k1=st.integers(1, 5),
    reach=st.integers(1, 4),
    extra=st.integers(0, 4),
    accumulation=st.integers(1, 3),
    lengths=st.lists(st.integers(5, 30), min_size=3, max_size=5),
    start_rate=st.sampled_from([0.0, 0.05, 0.15]),
    counted=st.booleans(),
    cell=st.sampled_from([nn.LSTM, nn.GRU]),
    optimizer=st.sampled_from(["sgd", "adam"]),
    seed=st.integers(0, 2**16),
)
def test_programs_give_the_eager_parameters_over_random_schedules_and_starts(
    k1, reach, extra, accumulation, lengths, start_rate, counted, cell, optimizer, seed
):
    k2 = min(k1 * reach + extra, 4 * k1)
    data = stream(lengths, start_rate, 0.1 if counted else 0.0, seed)
    eager, _ = train(False, data, k1, k2, accumulation, cell, optimizer, counted)
    for mode in ("uncaptured", "recorded"):
        params, _ = train(mode, data, k1, k2, accumulation, cell, optimizer, counted)
        for p, q in zip(eager, params, strict=True):
            torch.testing.assert_close(q, p, rtol=1e-12, atol=1e-12, msg=lambda m, mode=mode: f"{mode}: {m}")


def test_a_window_reaching_a_swept_segment_keeps_the_live_parameters_of_its_own(device):
    # TBPTT(5, 10) on 3 columns, batches ending inside windows, five sequence starts. A window of two eager calls
    # (a start inside it) reaches segments a window program left as what recomputes them: their rebuild borrowed the
    # parameters for their weights and gave them back, which read as a change to the parameters the window's own
    # segments had saved, and the next window's backward pass stopped ("modified in place (version 9 -> 11)").
    data = stream([23, 30, 17, 26, 21], 0.0, 0.0, seed=0)
    for batch, step, column in [(3, 9, 2), (3, 10, 0), (3, 22, 0), (4, 9, 0), (4, 18, 0)]:
        data[batch][2][step, column] = True
    eager, _ = train(False, data, 5, 10, 1, nn.LSTM, "sgd", False)
    for mode in ("uncaptured", "recorded"):
        params, trainer = train(mode, data, 5, 10, 1, nn.LSTM, "sgd", False)
        for p, q in zip(eager, params, strict=True):
            torch.testing.assert_close(q, p, rtol=1e-12, atol=1e-12)
