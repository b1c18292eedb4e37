"""The package's shape: modules small enough to read in one sitting, no import cycles, light to import."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "ignite_tbptt"
MODULES = sorted(PACKAGE.rglob("*.py"))


def code_lines(node, lines):
    """Lines of ``node`` that hold code: docstrings, comments and blank lines not counted."""
    numbers = set(range(node.lineno, node.end_lineno + 1))
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                numbers -= set(range(first.lineno, first.end_lineno + 1))
    return sum(1 for n in numbers if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_no_class_over_250_code_lines_and_no_function_over_60(path):
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            assert code_lines(node, lines) <= 250, node.name
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert code_lines(node, lines) <= 60, node.name


def module_imports(path):
    """The package modules ``path`` imports when it is imported (not under TYPE_CHECKING, not in functions)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [alias.name for alias in node.names]
            found.update(name.split(".")[0] for name in names)
    return found


def test_no_import_cycle_inside_the_package():
    graph = {p.stem: module_imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    done, visiting = set(), []

    def visit(module):
        assert module not in visiting, " -> ".join([*visiting, module])
        if module in done or module not in graph:
            return
        visiting.append(module)
        for imported in graph[module]:
            visit(imported)
        visiting.pop()
        done.add(module)

    for module in graph:
        visit(module)


def test_importing_the_package_does_not_import_matplotlib():
    code = "import sys, ignite_tbptt; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
