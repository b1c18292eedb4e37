"""Argument checks shared by the factories, free of torch: each error names the argument and the fix."""

from __future__ import annotations

from typing import Any

__all__ = ["positive_int", "callable_or_none"]


def positive_int(name: str, value: Any, unit: str = "") -> int:
    """Return ``value`` if it is a positive ``int`` (``bool`` excluded).

    Args:
        name: the argument's name, for the message.
        value: the value passed.
        unit: what the number counts, e.g. ``"time steps"``, added to the message.

    Raises:
        TypeError: if ``value`` is not an int.
        ValueError: if ``value`` is not positive.
    """
    what = f"a positive int ({unit})" if unit else "a positive int"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}.")
    if value < 1:
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    return value


def callable_or_none(name: str, value: Any) -> Any:
    """Return ``value`` if it is callable or ``None``.

    Raises:
        TypeError: if ``value`` is neither.
    """
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}.")
    return value
