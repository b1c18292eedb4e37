"""The suite's options and fixtures: ``--device`` runs the tests on another device, and a free port for processes.

``python -m pytest --device cuda`` makes that device torch's default during every test of the layers that train
(``tests/engine``, ``tests/handlers``, ``tests/runtime``, ``tests/data``, ``tests/planning``, ``tests/models``,
``tests/examples``),
so that the models, states and batches the tests make are created there, as ``torch.device`` used as a context
does (PyTorch's own device-generic tests, ``common_device_type.py``, are the model). Tests that cannot run there
(other processes, the docs build, the benchmarks' and notebooks' runs) are skipped with their reason; a test marks
itself ``@pytest.mark.cpu_only("why")`` for the same. The default is ``cpu``: the suite as CI runs it.
"""

import socket
from pathlib import Path

import pytest
import torch

# The folders whose tests train: they run on the --device.
ON_DEVICE = {"engine", "handlers", "runtime", "data", "planning", "models", "examples"}


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="the device the training tests run on, e.g. cuda or cuda:1 (torch's default device in each test)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (still part of the README's test command)")
    config.addinivalue_line("markers", "cpu_only(reason): runs on the CPU only; skipped with the reason under --device")
    device = torch.device(config.getoption("--device"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device.")


def pytest_collection_modifyitems(config, items):
    device = torch.device(config.getoption("--device"))
    if device.type == "cpu":
        return
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        marker = item.get_closest_marker("cpu_only")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=f"CPU only: {marker.args[0] if marker.args else ''}"))
        elif folder not in ON_DEVICE:
            item.add_marker(pytest.mark.skip(reason=f"runs on the CPU only (tests/{folder}: docs, benchmarks, layout)"))


@pytest.fixture(autouse=True)
def _on_the_device(request):
    device = torch.device(request.config.getoption("--device"))
    if device.type == "cpu":
        yield
        return
    with device:  # torch's factories create tensors and parameters there during the test
        yield


@pytest.fixture
def device(request):
    """The ``--device`` the test runs on, a ``torch.device``."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
