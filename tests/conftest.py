"""The suite's options and fixtures: ``--device`` runs the tests on another device; a free port and gloo groups.

``python -m pytest --device cuda`` makes that device torch's default during every test of the layers that train
(``tests/engine``, ``tests/handlers``, ``tests/runtime``, ``tests/data``, ``tests/planning``, ``tests/models``,
``tests/examples``),
so that the models, states and batches the tests make are created there, as ``torch.device`` used as a context
does (PyTorch's own device-generic tests, ``common_device_type.py``, are the model). Tests that cannot run there
(other processes, the docs build, the benchmarks' and notebooks' runs) are skipped with their reason; a test marks
itself ``@pytest.mark.cpu_only("why")`` for the same. The default is ``cpu``: the suite as CI runs it.

On another device, three more things hold:

- the tensors a test module makes when it is imported (its constants, and tensors given to ``parametrize``) are
  moved to the device before the tests run, as if they had been made in the test;
- a test marked ``@pytest.mark.explicit_device`` runs without the default device and puts its model and batches
  on the ``device`` fixture itself, as a user does: under a default device, tensors the library makes on the CPU on
  purpose land on the device, and each ``Tensor.item()`` passes torch's device mode once more (counting host
  reads, this would count each twice);
- cuDNN runs its deterministic algorithms, so that runs compared bit for bit (resumes, replays) are comparable.
"""

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

from .gloo import gloo  # noqa: F401 (the fixture: processes in one gloo group, kept for the whole pytest run)

# The folders whose tests train: they run on the --device.
ON_DEVICE = {"engine", "handlers", "runtime", "data", "planning", "models", "examples"}


def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.has_plugin("xdist"):
        # pyproject.toml's addopts runs pytest-xdist workers: where it is not installed, or `-p no:xdist` turns it
        # off, its options are still accepted (and ignored), and the tests run in this one process.
        group = parser.getgroup("xdist", "distributed and subprocess testing (pytest-xdist is not loaded)")
        group._addoption("-n", "--numprocesses", dest="numprocesses", default=0, help="ignored: no pytest-xdist")
        group.addoption("--dist", default="no", help="ignored: no pytest-xdist")
    parser.addoption(
        "--device",
        default="cpu",
        help="the device the training tests run on, e.g. cuda or cuda:1 (torch's default device in each test)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (still part of the README's test command)")
    config.addinivalue_line("markers", "cpu_only(reason): runs on the CPU only; skipped with the reason under --device")
    config.addinivalue_line("markers", "explicit_device: no default device; the test places everything on `device`")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (the README's command runs two)
        # The cores are shared out among the workers: torch's threads here, and in the processes a test starts
        # (examples, gloo groups, the docs build, the notebook's kernel). Two workers each running as many threads as
        # there are cores are several times slower than one after the other.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cores // config.workerinput["workercount"])
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    device = torch.device(config.getoption("--device"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device.")
    if device.type == "cuda":
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):
        # The longest first (the notebook, then the tests marked slow), so that the workers share them out while
        # the short ones fill in around them, rather than one worker being left with a long test at the end.
        items.sort(
            key=lambda item: 0 if item.nodeid.endswith(".ipynb") else 1 if item.get_closest_marker("slow") else 2
        )
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
    moved: dict = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("tests.") and module is not None:
            for key, value in list(vars(module).items()):
                if not key.startswith("__"):
                    setattr(module, key, _to_device(value, device, moved))
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for key, value in params.items():
            params[key] = _to_device(value, device, moved)


def _to_device(value, device, moved):
    """``value`` with its tensors on ``device``: lists and dicts changed in place (other modules may hold them)."""
    if id(value) in moved:
        return moved[id(value)]
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.device.type == "cpu":
        result = value.to(device)
    elif isinstance(value, list):
        value[:] = [_to_device(v, device, moved) for v in value]
        result = value
    elif isinstance(value, dict):
        for key in list(value):
            value[key] = _to_device(value[key], device, moved)
        result = value
    elif type(value) is tuple:
        result = tuple(_to_device(v, device, moved) for v in value)
    else:
        return value
    moved[id(value)] = result
    return result


@pytest.fixture(autouse=True)
def _on_the_device(request):
    device = torch.device(request.config.getoption("--device"))
    if device.type == "cpu" or request.node.get_closest_marker("explicit_device") is not None:
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
