import socket

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (still part of the README's test command)")


@pytest.fixture
def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
