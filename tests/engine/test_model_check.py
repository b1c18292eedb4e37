"""check_model: the properties truncated BPTT relies on, measured on a model, each able to fail and naming the leaf.

Each planted fault gets its verdict and the leaf or attribute named; torch's recurrent layers pass, but a
bidirectional one, which reads the future, does not carry.
"""

import pytest
import torch
from torch import nn

from ignite_tbptt import check_model

X = torch.randn(9, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # (T, B, features)


def verdicts(check):
    return {v.name: v.passed for v in check.verdicts}


@pytest.mark.parametrize(
    "make",
    [lambda: nn.RNN(3, 4), lambda: nn.GRU(3, 4, num_layers=2), lambda: nn.LSTM(3, 4, num_layers=2)],
    ids=["RNN", "GRU of 2 layers", "LSTM of 2 layers"],
)
def test_torchs_recurrent_layers_carry_their_state_and_the_model_is_left_as_it_was(make):
    torch.manual_seed(0)
    model = make().double()
    before = [p.detach().clone() for p in model.parameters()]
    check = check_model(model, X)
    assert check.ok, str(check)
    assert check["carried"].figure <= 1e-12 and check["gradient"].figure <= 1e-12 and check["used"].figure > 1e-3
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # "trains" stepped, then restored


def test_a_bidirectional_layer_reads_the_future_and_does_not_carry():
    check = check_model(nn.GRU(3, 4, bidirectional=True).double(), X)
    assert check["carried"].passed is False and check["carried"].figure > 1e-3
    assert check["trains"].passed  # it trains all the same: the check says what it learns from


class TwoLayers(nn.Module):
    """Two GRUs; ``ignores`` drops the second's carried state, ``detach`` cuts the first's gradient."""

    def __init__(self, ignores=False, detach=False):
        super().__init__()
        self.a, self.b, self.ignores, self.detach = nn.GRU(3, 4), nn.GRU(4, 4), ignores, detach

    def forward(self, x, state=None):
        ha, hb = (None, None) if state is None else state
        if self.detach and ha is not None:
            ha = ha.detach()
        ya, ha = self.a(x, ha)
        yb, hb = self.b(ya, None if self.ignores else hb)
        return yb, (ha, hb)


def test_a_layer_that_ignores_its_carried_state_is_named():
    check = check_model(TwoLayers(ignores=True).double(), X)
    assert verdicts(check)["carried"] is False and verdicts(check)["used"] is False
    assert "state[1] (1, 3, 4)" in check["used"].detail and "state[0]" not in check["used"].detail
    assert "first in chunk 1, steps [1, 2), of the chunks of 1" in check["carried"].detail  # where it first shows


def test_a_detach_inside_the_model_fails_the_gradient_naming_the_leaf():
    check = check_model(TwoLayers(detach=True).double(), X)
    assert verdicts(check)["carried"] and verdicts(check)["used"]  # the forward pass is right
    assert check["gradient"].passed is False and check["gradient"].figure > 1e-3
    assert "state[0] (1, 3, 4)" in check["gradient"].detail and "state[1]" not in check["gradient"].detail


class DetachesAll(nn.GRU):
    def forward(self, x, hidden=None):
        return super().forward(x, None if hidden is None else hidden.detach())


def test_a_state_detached_whole_cuts_the_gradient_to_the_earlier_input():
    check = check_model(DetachesAll(3, 4).double(), X)
    assert check["carried"].passed and check["gradient"].passed is False
    assert "none reaches the first chunk's input" in check["gradient"].detail


def test_a_reset_that_leaks_into_other_columns_fails():
    def everything(hidden, starts):  # resets every column, whichever starts
        return torch.zeros_like(hidden)

    check = check_model(nn.GRU(3, 4).double(), X, reset_hidden=everything)
    assert check["reset"].passed is False and "leaks into the other columns" in check["reset"].detail


class WritesInPlace(nn.GRU):
    def forward(self, x, hidden=None):
        if hidden is not None:
            hidden.mul_(1.0)
        return super().forward(x, hidden)


def test_a_model_writing_into_its_state_fails_clean_and_nothing_else_is_measured():
    check = check_model(WritesInPlace(3, 4).double(), X)
    assert check["clean"].passed is False and "wrote in place into state" in check["clean"].detail
    assert [v.passed for v in check.verdicts if v.name != "clean"] == [None] * 5


class KeepsAGraph(nn.GRU):
    def forward(self, x, hidden=None):
        y, hidden = super().forward(x, hidden)
        self.last = hidden * 2  # a graph the trainer does not see
        return y, hidden


def test_a_graph_kept_in_an_attribute_fails_clean_naming_it():
    check = check_model(KeepsAGraph(3, 4).double(), X)
    assert check["clean"].passed is False and "last" in check["clean"].detail


class Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout, self.rnn = nn.Dropout(0.3), nn.GRU(3, 4)

    def forward(self, x, hidden=None):
        return self.rnn(self.dropout(x), hidden)


def test_random_draws_in_training_mode_fail_clean_unless_declared():
    assert "random=True" in check_model(Dropped().double(), X)["clean"].detail
    assert check_model(Dropped().double(), X, random=True).ok


def test_an_input_too_short_to_chunk_is_refused():
    with pytest.raises(ValueError, match="at least 4 steps and 2 columns"):
        check_model(nn.GRU(3, 4), torch.randn(3, 2, 3))


def test_the_command_checks_a_model_a_factory_makes(tmp_path, monkeypatch, capsys):
    from ignite_tbptt.engine.model_check_command import main

    (tmp_path / "planted_models.py").write_text(
        "import torch\n"
        "def gru():\n"
        "    return torch.nn.GRU(3, 4).double(), torch.randn(9, 3, 3, dtype=torch.float64)\n"
        "def bidirectional():\n"
        "    return torch.nn.GRU(3, 4, bidirectional=True), torch.randn(9, 3, 3), {'random': False}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["planted_models:gru"]) == 0
    assert "| carried | yes |" in capsys.readouterr().out
    assert main(["planted_models:bidirectional"]) == 1
    assert "| carried | NO |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["planted_models"])


class Opaque:
    def __init__(self, h):
        self.h = h


class ReturnsAnObject(nn.GRU):
    def forward(self, x, hidden=None):
        y, h = super().forward(x, None if hidden is None else hidden.h)
        return y, Opaque(h)


def test_a_state_the_trainer_cannot_see_into_is_refused_as_the_trainer_refuses_it():
    check = check_model(ReturnsAnObject(3, 4).double(), X)
    assert check["carried"].passed is False and "cannot see into" in check["carried"].detail
    assert [v.passed for v in check.verdicts[1:]] == [None] * 5
