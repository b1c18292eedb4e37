"""Generalised truncated backpropagation through time, TBPTT(k1, k2), for PyTorch-Ignite.

The package is layered (docs/architecture.md): :mod:`~ignite_tbptt.planning` decides windows, cuts and segments
without torch; :mod:`~ignite_tbptt.runtime` carries the plans out with torch, without ignite;
:mod:`~ignite_tbptt.engine` wires them into ignite; :mod:`~ignite_tbptt.handlers` attach to a trainer;
:mod:`~ignite_tbptt.data` lays out batches. The names below are the public API.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

from .version import __version__ as __version__

# Each public name and the subpackage that defines it. They are imported on first use (PEP 562), so that
# ``import ignite_tbptt.examples.char_lm`` parses its options, and answers ``--help``, before torch loads.
_SOURCES = {
    "count_targets": "data",
    "masked_loss": "data",
    "DeterministicTBPTTEngine": "engine",
    "FullStateDict": "engine",
    "TBPTTEngine": "engine",
    "TBPTTEvents": "engine",
    "TBPTTProcessFunction": "engine",
    "check_model": "engine",
    "create_tbptt_evaluator": "engine",
    "create_tbptt_trainer": "engine",
    "load_checkpoint": "engine",
    "tbptt_training_step": "engine",
    "AdaptiveTruncation": "handlers",
    "GradientClipping": "handlers",
    "GradientReach": "handlers",
    "attach_tensorboard": "handlers",
    "gradient_norm": "handlers",
    "BitsPerTarget": "metrics",
    "LossPerTarget": "metrics",
    "Perplexity": "metrics",
    "ARTBP": "planning",
    "RandomWindows": "planning",
    "Schedule": "planning",
    "Window": "planning",
    "WindowSource": "planning",
    "walk": "planning",
    "plot_columns": "plot",
    "plot_reach": "plot",
    "plot_schedule": "plot",
    "default_model_fn": "runtime",
    "default_reset_hidden": "runtime",
}

if TYPE_CHECKING:
    from .data import count_targets, masked_loss
    from .engine import (
        DeterministicTBPTTEngine,
        FullStateDict,
        TBPTTEngine,
        TBPTTEvents,
        TBPTTProcessFunction,
        check_model,
        create_tbptt_evaluator,
        create_tbptt_trainer,
        load_checkpoint,
        tbptt_training_step,
    )
    from .handlers import AdaptiveTruncation, GradientClipping, GradientReach, attach_tensorboard, gradient_norm
    from .metrics import BitsPerTarget, LossPerTarget, Perplexity
    from .planning import ARTBP, RandomWindows, Schedule, Window, WindowSource, walk
    from .plot import plot_columns, plot_reach, plot_schedule
    from .runtime import default_model_fn, default_reset_hidden


# The subpackages and modules, read as attributes of the package (``ignite_tbptt.engine``), as when they were imported.
_SUBMODULES = frozenset(
    {"checks", "data", "engine", "examples", "handlers", "layout", "metrics", "models", "planning", "plot", "runtime"}
)


# Names kept for one minor release under their old spelling (CHANGELOG.md, "Deprecated"): old name, new name.
_RENAMED = {"TBPTTStep": "TBPTTProcessFunction"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"ignite_tbptt.{name} is now {new}; the old name goes in 0.6.", DeprecationWarning, stacklevel=2)
        return __getattr__(new)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)  # binds it in the package: later reads skip this
    if name not in _SOURCES:
        raise AttributeError(f"module 'ignite_tbptt' has no attribute {name!r}", name=name, obj=sys.modules[__name__])
    value = getattr(importlib.import_module(f".{_SOURCES[name]}", __name__), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES) | _SUBMODULES)


__all__ = [
    "create_tbptt_trainer",
    "tbptt_training_step",
    "TBPTTProcessFunction",
    "TBPTTEngine",
    "DeterministicTBPTTEngine",
    "TBPTTEvents",
    "Schedule",
    "RandomWindows",
    "AdaptiveTruncation",
    "ARTBP",
    "Window",
    "WindowSource",
    "walk",
    "default_model_fn",
    "default_reset_hidden",
    "create_tbptt_evaluator",
    "LossPerTarget",
    "BitsPerTarget",
    "Perplexity",
    "GradientClipping",
    "GradientReach",
    "gradient_norm",
    "plot_schedule",
    "plot_columns",
    "plot_reach",
    "attach_tensorboard",
    "load_checkpoint",
    "FullStateDict",
    "masked_loss",
    "count_targets",
    "check_model",
]
