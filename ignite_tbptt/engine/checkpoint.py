"""What a trainer's checkpoint was made with, and which changes a resumed run may make.

A trainer's ``state_dict`` records its configuration beside the stream it saves: the windows in use (the type and
parameters of the window source, a handler's such as ``AdaptiveTruncation`` where one is attached),
``carry_hidden``, ``recompute``, ``gradient_accumulation_steps``, ``deterministic`` and the package version.
Loading it compares that record with the trainer it is loaded into and raises before anything changes, naming both
values, unless the change is safe where the checkpoint was taken:

- the windows and ``recompute`` may change between streams: at an epoch's end with ``carry_hidden=True``, or
  between any two batches with ``carry_hidden=False`` on both sides (a stream under way holds hidden state,
  retained graphs and windows planned by the old configuration);
- ``carry_hidden`` may change at a stream's start (an epoch's end);
- ``gradient_accumulation_steps`` may change where no window waits for its optimizer step;
- ``deterministic`` may change at an epoch's end (ignite's ``DeterministicEngine`` and ``Engine`` find a
  mid-epoch batch differently);
- the package version and the seed of ``RandomWindows`` or ``ARTBP`` are recorded only (the draws go on from the
  saved generator).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from ..planning import WindowSource
from ..version import __version__

__all__ = ["COMPARED", "configuration", "check_resume", "source_type", "handler_sources", "load_checkpoint"]


def configuration(windows: Any, carry_hidden: bool, recompute: int | None, accumulation: int) -> dict[str, Any]:
    """The record of a trainer's configuration that its checkpoints carry (``deterministic`` is the engine's)."""
    return {
        "version": __version__,
        "windows": {"type": type(windows).__name__, **windows.hparams()},
        "carry_hidden": carry_hidden,
        "recompute": recompute,
        "gradient_accumulation_steps": accumulation,
    }


#: The entries of a configuration that :func:`check_resume` compares.
COMPARED = ("windows", "recompute", "carry_hidden", "gradient_accumulation_steps", "deterministic")


def check_resume(
    saved: dict[str, Any],
    given: dict[str, Any],
    stream: dict[str, Any],
    epoch_end: bool,
    names: tuple[str, ...] | None = None,
) -> None:
    """Refuse to resume a checkpoint whose configuration differs from the trainer's where the change is unsafe.

    Args:
        saved: the checkpoint's :func:`configuration`, with ``deterministic``.
        given: the trainer's, alike.
        stream: the checkpoint's stream state (:meth:`TBPTTProcessFunction.state_dict`).
        epoch_end: whether the checkpoint was taken at an epoch's end.
        names: the entries to compare, some of :data:`COMPARED`; default all.

    Raises:
        ValueError: naming each unsafe difference, its saved and its given value, and how to proceed.
    """
    partial = saved.get("source") is not None  # an older record: compare what it kept of the windows
    saved = _upgraded(saved)
    between_streams = stream.get("position", 0) == 0 or not (saved["carry_hidden"] or given["carry_hidden"])
    allowed = {
        "windows": between_streams,
        "recompute": between_streams,
        "carry_hidden": stream.get("position", 0) == 0,
        "gradient_accumulation_steps": stream.get("group_windows", 0) == 0,
        "deterministic": epoch_end,
    }
    problems = []
    for name in COMPARED if names is None else names:
        safe = allowed[name]
        old, new = _compared(name, saved.get(name)), _compared(name, given.get(name))
        if name == "windows" and partial and isinstance(old, dict) and isinstance(new, dict):
            new = {key: new.get(key) for key in old}
        if old != new and not safe:
            problems.append(f"{name}: saved {_shown(saved.get(name))}, given {_shown(given.get(name))}")
    if problems:
        raise ValueError(
            f"the checkpoint (ignite-tbptt {saved.get('version', '?')}) was made with another configuration than this "
            f"trainer's, and was taken where the change is unsafe: {'; '.join(problems)}. Build the trainer as the "
            "checkpoint was made to resume it; to train on with the new configuration, load only the model and the "
            "optimizer. Which changes are safe where is listed in docs/howto/checkpoint.md."
        )


def _upgraded(saved: dict[str, Any]) -> dict[str, Any]:
    # Records up to 0.4.0.dev0 named the source the trainer was built with under "windows", and the type of the one in
    # use, a handler's (AdaptiveTruncation), under "source". Such a handler keeps the built source's windows (k1 and
    # the rest) and plans its own cuts (k2): the built source's parameters but k2 are the handler's too.
    source, windows = saved.get("source"), saved.get("windows")
    if source is None or not isinstance(windows, dict) or windows.get("type") == source:
        return saved
    kept = {key: value for key, value in windows.items() if key not in ("type", "k2")}
    return {**saved, "windows": {"type": source, **kept}}


def handler_sources() -> set[str]:
    """The names of the window sources that attach as handlers (``standalone = False``), such as AdaptiveTruncation."""
    found, pending = set(), [WindowSource]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if not cls.standalone:
            found.add(cls.__name__)
    return found


def source_type(saved: dict[str, Any]) -> str | None:
    """The type of the window source in use when the checkpoint was made (``None`` for a record without one)."""
    windows = _upgraded(saved).get("windows")
    return windows.get("type") if isinstance(windows, dict) else None


def _compared(name: str, value: Any) -> Any:
    # A random source's seed only chose the first draws; a resumed run goes on from the saved generator.
    if name == "windows" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "seed"}
    return value


def _shown(value: Any) -> str:
    if isinstance(value, dict) and "type" in value:
        return f"{value['type']}({', '.join(f'{k}={v}' for k, v in value.items() if k != 'type')})"
    return repr(value)


def load_checkpoint(path: str | Path, map_location: Any = None) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(path, weights_only=True)``, for ``Checkpoint.load_objects(to_load, ...)``.

    Every checkpoint a trainer writes holds only tensors, numbers, strings and containers of them, which
    ``weights_only=True`` reads without running any code.

    Args:
        path: the file.
        map_location: as ``torch.load``'s, e.g. the device to resume on.

    Returns:
        The checkpoint's dict (``{"trainer": ..., "model": ..., "optimizer": ...}`` as ``Checkpoint`` wrote it).

    Raises:
        ValueError: if the file holds other objects (unpickling those could run code): nothing of it ran.
        OSError: if the file is missing, truncated or not a checkpoint; the message names it.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"refusing to load {path}: it holds objects other than tensors and numbers, which could run code when "
            f"loaded. Checkpoints of ignite-tbptt's trainers never do. ({str(error).splitlines()[0]})"
        ) from None
    except (OSError, EOFError, RuntimeError) as error:
        raise OSError(f"cannot read the checkpoint {path}: {error}") from None
