"""Argument checks shared by the factories, free of torch: each error names the argument and the fix."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

__all__ = ["positive_int", "callable_or_none", "called_as", "refusal_of_call", "renamed"]


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


def called_as(name: str, value: Any, *parameters: str, example: str) -> None:
    """Refuse a callable ``value`` that cannot take ``parameters`` positionally, as the trainer will call it.

    A callable whose signature Python cannot read (a builtin, say) passes.

    Args:
        name: the argument's name, for the message.
        value: the callable passed, or ``None``.
        *parameters: the names of what it will be given, in order.
        example: a working value, for the message.

    Raises:
        TypeError: if ``value`` cannot be called with that many positional arguments.
    """
    if value is None:
        return
    refusal = refusal_of_call(value, *parameters)
    if refusal is not None:
        form = f"{name}({', '.join(parameters)})"
        raise TypeError(
            f"{name} is called as {form}, but {getattr(value, '__name__', type(value).__name__)}"
            f"{inspect.signature(value)} cannot take that ({refusal}); pass, e.g., {name}={example}."
        )


def refusal_of_call(function: Any, *arguments: Any) -> str | None:
    """Why ``function(*arguments)`` would fail to bind its arguments (Python's words), or ``None`` if it binds.

    A callable whose signature Python cannot read (a builtin, say) binds: its call itself will tell.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read
        return None
    try:
        signature.bind(*arguments)
    except TypeError as error:
        return str(error)
    return None


def renamed(module: str, name: str, renames: dict[str, tuple[str, Any]]) -> Any:
    """A module's ``__getattr__`` for names kept one minor release under their old spelling (CHANGELOG, "Deprecated").

    Args:
        module: the module's name, for the message.
        name: the attribute asked for.
        renames: ``{old name: (new name, value)}``.

    Raises:
        AttributeError: for a name that is neither, as Python's own.
    """
    if name not in renames:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new, value = renames[name]
    warnings.warn(f"{module}.{name} is now {new}; the old name goes in 0.6.", DeprecationWarning, stacklevel=3)
    return value
