"""How the program tests run their programs on the CPU: uncaptured, or recorded and run again under capture's rules.

The tests of ``cuda_graphs`` write ``programs(True)`` where a GPU captures; the ``program_mode`` fixture
(``conftest.py`` here) runs each of them twice on the CPU: ``"uncaptured"`` (the programs' Python every
window) and ``"recorded"`` (recorded once, the recording run again without their Python:
``ignite_tbptt.runtime.programs.recording``).
"""

import torch

MODES = ("uncaptured", "recorded")
_mode = {"now": "uncaptured"}


def set_mode(mode):
    _mode["now"] = mode


def mode():
    """The value of ``cuda_graphs`` a test's ``True`` stands for now (``True`` itself under ``--device cuda``)."""
    return True if torch.get_default_device().type == "cuda" else _mode["now"]


def programs(cuda_graphs):
    """``cuda_graphs`` for a test's ``True``: captured where the device has CUDA graphs, else the mode's programs."""
    return mode() if cuda_graphs is True else cuda_graphs


def graphs(trainer):
    """The capture a trainer's programs share (``None`` uncaptured): its counts of captures, replays and warm-ups."""
    return trainer._process_function.loop.executor.graphs


def assert_replayed(trainer, *kinds):
    """Where programs are captured (recorded on the CPU, CUDA graphs on a GPU), that programs of each of ``kinds``
    (``"window"``, ``"step"``; by default the window programs) were captured and ran as replays."""
    capture = graphs(trainer)
    if mode() != "uncaptured":
        assert capture is not None, "no capture"
        for kind in kinds or ("window",):
            counts = capture.counts.kinds.get(kind, {})
            assert counts.get("captures", 0) > 0 and counts.get("replays", 0) > 0, f"no {kind} program was replayed"
