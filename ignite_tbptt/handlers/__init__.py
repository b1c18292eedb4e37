"""Handlers: what attaches to a trainer the ignite way, one handler a file.

Each handler has ``attach(engine)`` returning itself (and ``state_dict`` where it has state), and reads only
``engine.state`` and the public names of :mod:`ignite_tbptt.engine` and :mod:`ignite_tbptt.planning`: it reaches the
trainer through :meth:`~ignite_tbptt.TBPTTProcessFunction.of`, never through the process function's internals. A new
handler goes here, in a file named after it.
"""

from .adaptive_truncation import AdaptiveTruncation
from .gradient_clipping import GradientClipping, gradient_norm
from .gradient_reach import GradientReach
from .tensorboard_logger import attach_tensorboard

__all__ = ["GradientClipping", "gradient_norm", "GradientReach", "AdaptiveTruncation", "attach_tensorboard"]
