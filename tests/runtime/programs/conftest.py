"""The program tests' fixtures: ``program_mode`` runs a program test uncaptured and recorded, ``recorded_mode``
recorded (``program_mode.py``); both capture in CUDA graphs under ``--device cuda``."""

import pytest
import torch

from ignite_tbptt.runtime import GraphCapture
from ignite_tbptt.runtime.programs.recording import Recorder

from . import program_mode as pm


@pytest.fixture(params=pm.MODES)
def program_mode(request, monkeypatch):
    """A program test run uncaptured and recorded on the CPU; under ``--device cuda``, captured in CUDA graphs."""
    if torch.get_default_device().type == "cuda" and request.param == "recorded":
        pytest.skip("under --device cuda the programs are captured in CUDA graphs")
    yield from _in_mode(request.param, monkeypatch)


@pytest.fixture(params=["recorded"])
def recorded_mode(request, monkeypatch):
    """A program test run recorded on the CPU; under ``--device cuda``, captured in CUDA graphs.

    For the reach and step programs' tests: a recorded run runs each program's Python at its warm-up and its
    capture, and an uncaptured one only that Python every window; the window programs' tests
    (``test_window.py``) and the property test run both.
    """
    yield from _in_mode(request.param, monkeypatch)


#: Warm-up runs before a capture in the program tests, the same on the CPU and under ``--device cuda`` (the trainer's
#: default is three): the tests' short runs capture, and replay, each program they make, and each recorded capture is
#: compared with the run before it (a value that would be baked is refused).
WARMUP = 2


def _in_mode(mode, monkeypatch):
    if torch.get_default_device().type == "cuda":
        # Captured with torch's tracker: a replay that reads an input freed since its capture raises.
        init = GraphCapture.__init__

        def checked(self, warmup=3):
            init(self, WARMUP)
            self.check_input_liveness = True

        monkeypatch.setattr(GraphCapture, "__init__", checked)
    elif mode == "recorded":
        init = Recorder.__init__
        monkeypatch.setattr(Recorder, "__init__", lambda self, warmup=3, names=None: init(self, WARMUP, names))
    pm.set_mode(mode)
    yield mode
    pm.set_mode("uncaptured")
