"""The public API against its recorded snapshot, tests/api_snapshot.txt.

The snapshot lists ``__all__`` of the package and of each subpackage, and the signature of every public callable
(a class's is its constructor's). Regenerate it with ``python -m tests.test_api --write`` only for a change made on
purpose, and record that change in CHANGELOG.md (its header states the deprecation policy).
"""

from __future__ import annotations

import difflib
import enum
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).parent / "api_snapshot.txt"
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # a default's repr: <function default_model_fn at 0x7f...>
_FORWARD_REF = re.compile(r"ForwardRef\('([^']*)'[^)]*\)")  # a NamedTuple's field annotation, as Python prints it
PACKAGES = [
    "ignite_tbptt",
    "ignite_tbptt.data",
    "ignite_tbptt.engine",
    "ignite_tbptt.handlers",
    "ignite_tbptt.lightning",
    "ignite_tbptt.models",
    "ignite_tbptt.planning",
    "ignite_tbptt.runtime",
]
# Subpackages of an extra, and the module the extra installs: where it is absent (the wheel as a plain
# `pip install ignite-tbptt` gives it), their recorded lines are left out of the comparison.
OPTIONAL = {"ignite_tbptt.lightning": "lightning"}


def _installed(package: str) -> bool:
    return package not in OPTIONAL or importlib.util.find_spec(OPTIONAL[package]) is not None


def _signature(obj: object) -> str:
    if inspect.isclass(obj):
        if issubclass(obj, dict) and hasattr(obj, "__annotations__") and hasattr(obj, "__total__"):  # a TypedDict
            keys = ", ".join(f"{k}: {getattr(v, '__forward_arg__', v)}" for k, v in obj.__annotations__.items())
            return f"TypedDict(total={obj.__total__}) {{{keys}}}"
        if issubclass(obj, enum.Enum):  # its members, not EnumType.__call__'s signature (which differs by Python)
            return f"enum {[member.name for member in obj]}"
        kind = "class"
    elif callable(obj):
        kind = "def"
    else:
        return f"= {type(obj).__name__}"
    try:
        signature = str(inspect.signature(obj))
    except (TypeError, ValueError):  # an enum or a builtin without one
        signature = "(...)"
    signature = _FORWARD_REF.sub(r"'\1'", _ADDRESS.sub("", signature))
    return f"{kind}{signature}"


def api_lines() -> list[str]:
    """One line per public name of each package: ``package.name kind(signature)``, in ``__all__``'s order."""
    lines = []
    for package in filter(_installed, PACKAGES):
        module = importlib.import_module(package)
        names = list(module.__all__)
        lines.append(f"{package}.__all__ = {sorted(names)}")
        for name in names:
            lines.append(f"{package}.{name} {_signature(getattr(module, name))}")
    return lines


def test_the_public_api_is_the_recorded_one():
    absent = tuple(f"{package}." for package in PACKAGES if not _installed(package))
    recorded = [line for line in SNAPSHOT.read_text(encoding="utf-8").splitlines() if not line.startswith(absent)]
    current = api_lines()
    diff = "\n".join(difflib.unified_diff(recorded, current, "tests/api_snapshot.txt", "the package now", lineterm=""))
    assert current == recorded, (
        "The public API changed. If the change is deliberate, regenerate the snapshot with "
        "`python -m tests.test_api --write` and record the change in CHANGELOG.md (Added, Changed, Deprecated or "
        "Removed; a removal or incompatible change is deprecated first, as CHANGELOG.md's header says). "
        f"Otherwise undo it.\n{diff}"
    )


def test_each_subpackage_lists_only_names_it_has():
    for package in filter(_installed, PACKAGES):
        module = importlib.import_module(package)
        assert len(set(module.__all__)) == len(module.__all__), package
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert not missing, f"{package}.__all__ names {missing}, which it does not define"


def test_an_extra_not_installed_is_named_on_import(monkeypatch):
    # sys.modules[name] = None makes Python's import fail as it does where the module is not installed.
    import pytest

    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    for name in ["ignite_tbptt.lightning", "ignite_tbptt.lightning.module"]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ModuleNotFoundError, match=r'pip install "ignite-tbptt\[lightning\]"'):
        importlib.import_module("ignite_tbptt.lightning")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m tests.test_api --write  (rewrites tests/api_snapshot.txt)")
    if not all(map(_installed, PACKAGES)):
        raise SystemExit(f"install every extra first (pip install -e '.[dev]'): {OPTIONAL} would be left out")
    SNAPSHOT.write_text("\n".join(api_lines()) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}")


def test_renamed_names_still_answer_with_a_warning_naming_the_new_one():
    # CHANGELOG.md, "Deprecated": each old name keeps working until 0.6, and says what replaces it.
    import pytest
    import torch

    import ignite_tbptt
    import ignite_tbptt.engine
    import ignite_tbptt.planning
    from ignite_tbptt.runtime.programs import GraphReplayError, RecordingError

    with pytest.warns(DeprecationWarning, match="TBPTTProcessFunction"):
        assert ignite_tbptt.TBPTTStep is ignite_tbptt.TBPTTProcessFunction
    with pytest.warns(DeprecationWarning, match="TBPTTProcessFunction"):
        assert ignite_tbptt.engine.TBPTTStep is ignite_tbptt.engine.TBPTTProcessFunction
    with pytest.warns(DeprecationWarning, match="EagerReason"):
        assert ignite_tbptt.planning.Eager is ignite_tbptt.planning.EagerReason
    assert GraphReplayError is RecordingError
    model = torch.nn.GRU(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(DeprecationWarning, match="cuda_graphs='recorded'"):
        trainer = ignite_tbptt.create_tbptt_trainer(
            model, optimizer, torch.nn.functional.mse_loss, 2, cuda_graphs="replayed"
        )
    x = torch.randn(8, 1, 2)
    assert trainer.run([(x, x)], max_epochs=2).programs.kinds["window"]["captures"] == 1
