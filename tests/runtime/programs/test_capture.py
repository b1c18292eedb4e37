"""A program's warm-up, capture and replay run on its parameters' CUDA device, whatever device is current.

Without a GPU, torch.cuda's graph and stream calls are stood in for by recorders: the test checks the order in which
the program enters the device, and that no CUDA call of the program runs outside it.
"""

import contextlib
from unittest import mock

import torch

from ignite_tbptt.runtime import GraphCapture, Program


def test_warm_up_capture_and_replay_run_with_the_programs_device_current():
    events = []
    current = ["cuda:0"]

    class Device:
        def __init__(self, device):
            self.device, self.before = str(device), None

        def __enter__(self):
            self.before, current[0] = current[0], self.device

        def __exit__(self, *exc):
            current[0] = self.before

    class Stream:
        def wait_stream(self, other):
            pass

    class Graph:
        def replay(self):
            events.append(("replay", current[0]))

    @contextlib.contextmanager
    def graph(g, pool=None):
        events.append(("capture", current[0]))
        yield

    def body():
        events.append(("body", current[0]))

    cuda = {
        "device": Device,
        "CUDAGraph": Graph,
        "graph": graph,
        "graph_pool_handle": lambda: None,
        "current_stream": lambda device=None: Stream(),
        "Stream": lambda device=None: Stream(),
        "stream": lambda s: contextlib.nullcontext(),
    }
    with mock.patch.multiple(torch.cuda, **cuda):
        capture = GraphCapture(warmup=1)
        capture.device = torch.device("cuda", 1)  # the model's device, not the current one
        program = Program(body, capture, "the window")
        for _ in range(3):
            program()
    assert events == [
        ("body", "cuda:1"),  # the warm-up
        ("capture", "cuda:1"),
        ("body", "cuda:1"),  # recorded: a capture runs nothing
        ("replay", "cuda:1"),
        ("replay", "cuda:1"),
    ]
    assert current == ["cuda:0"]  # given back
    assert capture.counts.as_dict() == {"captures": 1, "replays": 2, "warmups": 1, "eager_windows": 0, "evictions": 0}
