"""``torch.profiler`` ranges named after the trainer's parts, free while no profiler runs."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

__all__ = ["profiled", "profiling", "NO_CONTEXT"]

# Reentrant and stateless: one instance serves every "no context" of a window, without an allocation each time.
NO_CONTEXT = nullcontext()


_autograd_profiler = torch.autograd.profiler


def profiling() -> bool:
    """Whether a ``torch.profiler`` runs now: the hot path skips its ranges' contexts altogether when none does.

    Reads the flag torch keeps in Python for such checks (``torch.autograd.profiler._is_profiler_enabled``, set
    by ``torch.profiler.profile``, ``emit_nvtx`` and ``emit_itt`` as they start and stop, and read by
    ``torch._dynamo`` alike), rather than asking the C++ profiler: a call through pybind11, three times a window.
    """
    return _autograd_profiler._is_profiler_enabled


def profiled(name: str) -> AbstractContextManager:
    """A ``torch.profiler`` range ``name`` while a profiler runs, else nothing (a range costs about 10 µs)."""
    return torch.profiler.record_function(name) if _autograd_profiler._is_profiler_enabled else NO_CONTEXT
