"""What a model compiled with ``torch.compile`` needs from the trainer, scoped to the trainer's own calls.

Two things break exact TBPTT with k2 > k1 under ``torch.compile`` and are handled here:

- **Donated buffers.** AOTAutograd lets a compiled backward reuse the memory of the tensors its forward saved
  ("donated buffers", ``torch._functorch.config.donated_buffer``), which is only valid if the graph is
  backpropagated once. A retained segment is backpropagated by every window that reaches it (``retain_graph``),
  so torch refuses: "This backward function was compiled with non-empty donated buffers which requires
  create_graph=False and retain_graph=False". :func:`retainable` switches donation off while the trainer
  runs a model call (where the graph is compiled) and a retaining backward call (where torch checks it), and
  restores the setting after each, so the rest of the process keeps torch's default. The trainer opens one
  such scope around each iteration whose graphs outlive an optimizer step (handlers of its window and step
  events run inside it too), and the scopes inside it then cost nothing (setting torch's config costs a few
  microseconds).
- **Python hooks inside a compiled region.** The saved-tensor hooks of
  :mod:`ignite_tbptt.runtime.weight_versions` run from
  inside the model's forward pass. Where Dynamo falls back to eager code (a graph break, e.g. around
  ``nn.GRU``), its frame evaluation would trace the hooks as new frames and recompile them for every
  parameter storage until its recompile limit. :func:`never_traced` marks their code for Dynamo to skip: a flag
  on the code object, so the hooks, called for every saved tensor, cost nothing more when nothing is compiled
  (a ``torch.compiler.disable`` wrapper costs about 0.5 µs a call).

Neither is needed while ``torch._dynamo`` is not imported (nothing can be compiled then), so both are skipped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

__all__ = ["compiling_possible", "retainable", "never_traced"]


def compiling_possible() -> bool:
    """Whether ``torch.compile`` may be in use: ``torch._dynamo`` has been imported."""
    return "torch._dynamo" in sys.modules


def retainable(needed: bool = True) -> AbstractContextManager:
    """Context in which compiled graphs get no donated buffers, so they may be backpropagated more than once.

    With ``needed`` false (no graph outlives its first backward call), and inside another such context, it does
    nothing: the outer one restores torch's setting when it closes.
    """
    return _without_donated_buffers() if needed and compiling_possible() and not _open else _NO_CONTEXT


_NO_CONTEXT = nullcontext()
_open = 0  # retainable() contexts open now


@contextmanager
def _without_donated_buffers() -> Iterator[None]:
    # Set and restored by hand: the config's own patch() grows a context-variable map with every use.
    import torch._functorch.config as config

    global _open
    saved = config.donated_buffer
    config.donated_buffer = False
    _open += 1
    try:
        yield
    finally:
        _open -= 1
        config.donated_buffer = saved


def never_traced(*functions: Callable) -> None:
    """Mark the code of ``functions`` for Dynamo never to trace (as ``torch._dynamo.skip``), once it is imported.

    Each function's own frames are skipped, not the frames it calls, so pass every function of the call chain.
    Marking again is free; before ``torch._dynamo`` is imported nothing can be compiled, and nothing is marked.
    """
    if functions in _MARKED or not compiling_possible():
        return
    from torch._dynamo.eval_frame import skip_code

    for fn in functions:
        skip_code(fn.__code__)
    _MARKED.add(functions)


_MARKED: set[tuple[Callable, ...]] = set()  # the calls that marked their functions
