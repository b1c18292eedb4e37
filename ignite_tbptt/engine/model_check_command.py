"""The command line of :func:`~ignite_tbptt.check_model`, for a model a factory makes.

``python -m ignite_tbptt.engine.model_check_command module:factory``. A module of its own, which the package does
not import, so that ``python -m`` runs it once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .model_check import check_model

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the check of the model ``module:factory`` makes (``python -m ignite_tbptt.engine.model_check_command``).

    ``factory()`` returns ``(model, x)`` or ``(model, x, options)``, ``options`` the keywords of :func:`check_model`
    (``module_state``, ``random``, ...). The module is imported from the current directory or the path.

    Returns:
        0 where every property holds, 1 otherwise (the exit status).
    """
    parser = argparse.ArgumentParser(
        prog="python -m ignite_tbptt.engine.model_check_command",
        description="Whether a model carries its state as truncated BPTT relies on (ignite_tbptt.check_model).",
    )
    parser.add_argument("factory", help="module:function returning (model, x) or (model, x, options)")
    args = parser.parse_args(argv)
    module, _, name = args.factory.partition(":")
    if not module or not name:
        parser.error(f"factory must be module:function, e.g. my_models:make_lstm, got {args.factory!r}")
    made = getattr(importlib.import_module(module), name)()
    model, x, options = (*made, {})[:3]
    check = check_model(model, x, **options)
    print(check)
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
