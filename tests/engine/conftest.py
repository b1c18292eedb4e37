"""The engine tests' fixtures: ``program_mode`` runs a program test uncaptured and replayed (``program_mode.py``)."""

import pytest
import torch

from ignite_tbptt.runtime import GraphCapture
from ignite_tbptt.runtime.programs.replayed_capture import ReplayedCapture

from . import program_mode as pm


@pytest.fixture(params=pm.MODES)
def program_mode(request, monkeypatch):
    if torch.get_default_device().type == "cuda":
        if request.param == "replayed":
            pytest.skip("under --device cuda the programs are captured in CUDA graphs")
        # Captured with torch's tracker: a replay that reads an input freed since its capture raises.
        init = GraphCapture.__init__

        def checked(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.check_input_liveness = True

        monkeypatch.setattr(GraphCapture, "__init__", checked)
    elif request.param == "replayed":
        # One warm-up run rather than CUDA's three: the tests' short runs capture, and replay, each program they make.
        init = ReplayedCapture.__init__
        monkeypatch.setattr(ReplayedCapture, "__init__", lambda self, warmup=3, names=None: init(self, 1, names))
    pm.set_mode(request.param)
    yield request.param
    pm.set_mode("uncaptured")
