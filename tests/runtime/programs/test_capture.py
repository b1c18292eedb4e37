"""A program's warm-up, capture and replay run on its parameters' CUDA device, whatever device is current.

Without a GPU, torch.cuda's graph and stream calls are stood in for by recorders: the tests check the order in which
the program enters the device, that no CUDA call of the program runs outside it, and that its warm-up and capture
run on streams of that device, the capture checked against its own thread only.
"""

import contextlib
from unittest import mock

import pytest
import torch

from ignite_tbptt.runtime import GraphCapture, Program


def recorded_cuda(events, current):
    """Stand-ins for torch.cuda's device, stream and graph calls, recording what the programs ask of them."""

    class Device:
        def __init__(self, device):
            self.device, self.before = str(device), None

        def __enter__(self):
            self.before, current[0] = current[0], self.device

        def __exit__(self, *exc):
            current[0] = self.before

    class Stream:
        def __init__(self):
            self.device = current[0]  # a stream belongs to the device current when it is made

        def wait_stream(self, other):
            pass

    class Graph:
        def replay(self):
            events.append(("replay", current[0]))

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, capture_error_mode="global"):
        if stream is None or stream.device != current[0]:
            raise AssertionError(f"captured on {stream and stream.device}'s stream with {current[0]} current")
        events.append(("capture", current[0], capture_error_mode))
        yield

    @contextlib.contextmanager
    def on_stream(s):
        if s.device != current[0]:
            raise AssertionError(f"ran on {s.device}'s stream with {current[0]} current")
        yield

    return {
        "device": Device,
        "current_device": lambda: current[0],
        "CUDAGraph": Graph,
        "graph": graph,
        "graph_pool_handle": lambda: None,
        "current_stream": lambda device=None: Stream(),
        "Stream": lambda device=None: Stream(),
        "stream": on_stream,
    }


def test_warm_up_capture_and_replay_run_with_the_programs_device_current():
    events = []
    current = ["cuda:0"]

    def body():
        events.append(("body", current[0]))

    with mock.patch.multiple(torch.cuda, **recorded_cuda(events, current)):
        capture = GraphCapture(warmup=1)
        capture.device = torch.device("cuda", 1)  # the model's device, not the current one
        program = Program(body, capture, "the window")
        for _ in range(3):
            program()
    assert events == [
        ("body", "cuda:1"),  # the warm-up
        ("capture", "cuda:1", "thread_local"),  # another thread's CUDA call does not invalidate it
        ("body", "cuda:1"),  # recorded: a capture runs nothing
        ("replay", "cuda:1"),
        ("replay", "cuda:1"),
    ]
    assert current == ["cuda:0"]  # given back
    assert capture.counts.as_dict() == {
        **{"captures": 1, "replays": 2, "warmups": 1, "eager_windows": 0, "eager_steps": 0, "evictions": 0},
        **{"window/warmups": 1, "window/captures": 1, "window/replays": 2},
    }


def test_two_trainers_on_two_devices_capture_each_on_a_stream_of_its_own_device():
    # torch's default capture stream is made once per process, on the device that first captures: a trainer on a
    # second device would capture on the first's stream and record none of its kernels.
    events = []
    current = ["cuda:0"]
    with mock.patch.multiple(torch.cuda, **recorded_cuda(events, current)):
        for index in (0, 1):
            capture = GraphCapture(warmup=1)
            capture.device = torch.device("cuda", index)
            program = Program(lambda: None, capture, "the window")
            for _ in range(3):
                program()
    assert [e for e in events if e[0] == "capture"] == [("capture", f"cuda:{i}", "thread_local") for i in (0, 1)]


def test_the_liveness_check_on_a_torch_without_it_is_refused_with_the_version():
    capture = GraphCapture()

    def old_graph(cuda_graph, pool=None, stream=None, capture_error_mode="global"):  # torch 2.12's signature
        raise AssertionError("not called")

    refused = pytest.raises(RuntimeError, match=r"check_input_liveness needs torch 2\.13 or later.*this is torch")
    with mock.patch.object(torch.cuda, "graph", old_graph), refused:
        capture.check_input_liveness = True
    assert capture.check_input_liveness is False
