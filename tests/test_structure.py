"""The package's shape: layers that import only what lies below them, small classes and functions, no cycles.

The layers (docs/architecture.md): ``planning`` imports neither torch nor ignite; ``runtime`` imports torch and
``planning`` but not ignite; ``engine`` wires them into ignite; ``handlers`` reach the rest only through public
names; ``data`` lays out batches on its own; ``models`` adapts other libraries' models, through public names too.
The tests mirror the package, a folder per subpackage.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "ignite_tbptt"
MODULES = sorted(PACKAGE.rglob("*.py"))
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
# What each layer may import from the package, besides itself: its subpackages' public names or root modules.
ALLOWED = {
    "planning": {"checks"},
    "runtime": {"planning", "checks", "layout"},
    "data": {"checks", "layout"},
    "engine": {"planning", "runtime", "data", "checks", "layout", "version"},
    "handlers": {"engine", "planning", "checks", "plot"},
    "models": {"", "planning", "checks"},  # adapters for other libraries' models, importing those only when called
    "examples": {"", "data", "models", "lightning"},  # the package's public API, as a user imports it
    "lightning": {
        "engine",
        "runtime",
        "data",
        "checks",
    },  # the trainer on Lightning's Trainer: the engine's loop, no ignite
}
THIRD_PARTY_FORBIDDEN = {"planning": {"torch", "ignite", "numpy"}, "runtime": {"ignite"}}


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path, for_typing=False):
    """``(module, names)`` for every import of ``path``, relative ones resolved; TYPE_CHECKING blocks left out
    unless ``for_typing`` (a cycle through them is a cycle all the same: a type checker follows it)."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if not for_typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.append((base, [alias.name for alias in node.names]))
    return found


def layer(name):
    """The subpackage of ``ignite_tbptt.<layer>...``, ``""`` for the package itself, a root module's name else."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_each_module_imports_only_the_layers_below_it(path):
    own = layer(module_name(path))
    if own not in ALLOWED:  # the package's root: __init__, version, checks, metrics, plot
        return
    for module, names in imports(path):
        top = module.split(".")[0]
        assert top not in THIRD_PARTY_FORBIDDEN.get(own, ()), f"{own} must not import {top}"
        if top != "ignite_tbptt":
            continue
        target = layer(module)
        if target == own:
            continue
        assert target in ALLOWED[own], f"{module_name(path)} imports {module}: {own} may import {ALLOWED[own]}"
        if own in ("handlers", "models", "examples"):  # public names only: a subpackage's or a root module's own
            assert module.count(".") <= 1, f"{module_name(path)} reaches into {module}"
            assert not any(n.startswith("_") for n in names), f"{module_name(path)} imports private {names}"


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
def test_no_class_over_200_code_lines_and_no_function_over_60(path):
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            assert code_lines(node, lines) <= 200, node.name
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert code_lines(node, lines) <= 60, node.name


def is_module(name):
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_no_import_cycle_inside_the_package():
    graph = {}
    for path in MODULES:
        targets = set()
        for module, names in imports(path, for_typing=True):
            if module.split(".")[0] != "ignite_tbptt":
                continue
            submodules = {f"{module}.{n}" for n in names if is_module(f"{module}.{n}")}
            # `from . import hidden` imports the module `hidden`; `from .executor import X`, the module `executor`.
            targets |= submodules if submodules and len(submodules) == len(names) else {module}
        graph[module_name(path)] = targets - {module_name(path)}
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


def test_a_subpackage_is_one_layer_and_at_most_a_handful_of_modules_stay_at_the_root():
    assert SUBPACKAGES == ["data", "engine", "examples", "handlers", "lightning", "models", "planning", "runtime"]
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert root == ["__init__", "checks", "layout", "metrics", "plot", "version"]


def test_the_tests_mirror_the_package():
    for name in SUBPACKAGES:
        assert (ROOT / "tests" / name / "__init__.py").is_file(), f"tests/{name}/ is missing"
    folders = {p.name for p in (ROOT / "tests").iterdir() if (p / "__init__.py").is_file()}
    assert folders <= set(SUBPACKAGES), folders - set(SUBPACKAGES)


def test_every_module_lists_its_public_names():
    for path in MODULES:
        if path.name == "version.py":
            continue
        tree = ast.parse(path.read_text())
        listed = any(
            isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets) for n in tree.body
        )
        assert listed or path.name == "__init__.py" and not tree.body[1:], f"{path.relative_to(PACKAGE)} has no __all__"


def test_importing_the_package_does_not_import_matplotlib():
    code = "import sys, ignite_tbptt; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_runtime_carries_out_plans_and_never_asks_a_window_source():
    # Every decision about a segment or a window's close is a plan made in planning/ (StreamPlanner); the runtime,
    # and the loop that hands it the plans, only carry them out.
    from ignite_tbptt.planning import WindowSource

    asked = {"window", "cut", "boundary", "compensation", "reaches_back"}  # what a source decides
    assert all(callable(getattr(WindowSource, name)) for name in asked)
    carriers = [*(PACKAGE / "runtime").glob("*.py"), PACKAGE / "engine" / "stream_loop.py"]
    for path in carriers:
        for module, names in imports(path):
            if layer(module) == "planning" and layer(module_name(path)) == "runtime":
                assert all(n.endswith("Plan") for n in names), f"{module_name(path)} imports {names} from planning"
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in asked:
                receiver = ast.unparse(node.func.value)
                assert "planner" in receiver, f"{module_name(path)} asks {receiver}.{node.func.attr}(...)"
            assert not (isinstance(node, ast.Attribute) and node.attr == "source" and "runtime" in path.parts)


def calls_of(name):
    """The modules of the package that call ``name(...)`` or ``X.name(...)``, by their path from the package."""
    found = set()
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called == name:
                    found.add(str(path.relative_to(PACKAGE)))
    return found


def test_the_layout_is_made_where_time_dim_is_read_and_no_module_computes_an_axis_from_it():
    # One Layout per trainer or evaluator, made from its time_dim argument and passed to all that needs an axis.
    assert calls_of("Layout") == set()
    assert calls_of("of") >= {"engine/trainer.py", "engine/evaluator.py"}
    for path in MODULES:
        if path.name != "layout.py":
            assert "1 - axis" not in path.read_text(), path


def _programs_run(refused=None, profiled=False, cuda_graphs="recorded"):
    # A GRU trained with cuda_graphs="recorded", windows and steps as programs where planning says so, with
    # planning's one rule replaced by ``refused`` where given; its parameters and how its programs ran.
    import contextlib

    import torch

    from ignite_tbptt import create_tbptt_trainer
    from ignite_tbptt.planning import execution

    torch.manual_seed(0)
    model = torch.nn.GRU(3, 3).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    trainer = create_tbptt_trainer(
        model, optimizer, torch.nn.functional.mse_loss, k1=4, k2=4, carry_hidden=True, cuda_graphs=cuda_graphs
    )
    stream = torch.randn(97, 2, 3, dtype=torch.float64)
    batches = [(stream[t : t + 16], stream[t + 1 : t + 17]) for t in range(0, 96, 16)]
    original = execution.program_refused
    execution.program_refused = refused or original
    try:
        with torch.profiler.profile() if profiled else contextlib.nullcontext():
            state = trainer.run(batches, max_epochs=2)
    finally:
        execution.program_refused = original
    return [p.detach().clone() for p in model.parameters()], state


def test_one_rule_decides_whether_windows_and_steps_run_as_programs():
    # planning.execution.program_refused answers for every window and every optimizer step: replaced, every path
    # follows it, and nothing else in the trainer decides (the profiler, which it weighs, stops no program it lets run).
    import torch

    from ignite_tbptt.planning import EagerReason, execution

    _, state = _programs_run()
    kinds = state.programs.kinds
    assert kinds["window"]["replays"] > 0 and kinds["step"]["replays"] > 0
    trained, state = _programs_run(refused=lambda facts, step: EagerReason.PROFILER)
    counts = state.programs
    assert counts.captures == counts.replays == counts.warmups == 0
    assert counts.eager == {"profiler": state.window, "step/profiler": state.optimizer_step}
    eager, _ = _programs_run(cuda_graphs=False)
    assert all(torch.equal(a, b) for a, b in zip(trained, eager))
    # Under the profiler, with a rule that ignores it, windows and steps still run as programs.
    _, state = _programs_run(lambda facts, step: execution.EagerReason.CHECKS if facts.checks_pending else None, True)
    assert state.programs.kinds["window"]["replays"] > 0 and state.programs.kinds["step"]["replays"] > 0
    assert "profiler" not in state.programs.eager


def test_one_walk_plans_a_stream_for_the_loop_the_look_aheads_and_walk():
    # The order of a stream's plans (a window opened, its segments, its close planned and carried out) is written
    # once, in planning/walk.py's StreamWalk: the stream loop, the program look-aheads and walk() all run it, and
    # none asks a planner for a plan itself.
    walked = {"open_window", "segment", "close", "closed"}
    askers: dict[str, set[str]] = {}
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr in walked and "planner" in ast.unparse(node.func.value):
                askers.setdefault(str(path.relative_to(PACKAGE)), set()).add(node.func.attr)
    assert askers == {"planning/walk.py": walked}, askers


def test_the_engine_imports_the_runtime_through_its_public_names():
    for path in (PACKAGE / "engine").glob("*.py"):
        for module, _ in imports(path):
            assert not module.startswith("ignite_tbptt.runtime."), f"{module_name(path)} imports {module}"


def test_the_architecture_page_names_every_module():
    # docs/architecture.md is drawn from the listing: a module added or renamed is added or renamed there too.
    page = (ROOT / "docs" / "architecture.md").read_text()
    for path in MODULES:
        if path.name != "__init__.py" and "examples" not in path.parts:  # the examples are named without .py
            assert path.name in page, f"docs/architecture.md does not name {path.relative_to(PACKAGE)}"
        elif "examples" in path.parts and path.name != "__init__.py":
            assert path.stem in page, f"docs/architecture.md does not name examples/{path.stem}"


@pytest.mark.slow  # a process importing torch and ignite
def test_the_package_root_imports_its_public_names_and_subpackages_on_first_use():
    # ``import ignite_tbptt`` loads no torch, so that an example's --help answers at once; each public name, and each
    # subpackage read as an attribute, loads when first read.
    code = """
import sys
import ignite_tbptt
before = "torch" in sys.modules
from ignite_tbptt import create_tbptt_trainer, walk
assert ignite_tbptt.engine.create_tbptt_trainer is create_tbptt_trainer
assert ignite_tbptt.planning.walk is walk and ignite_tbptt.runtime.__name__ == "ignite_tbptt.runtime"
assert set(ignite_tbptt.__all__) <= set(dir(ignite_tbptt)) and "engine" in dir(ignite_tbptt)
try:
    ignite_tbptt.create_tbptt_trainr
except AttributeError as error:
    assert error.name == "create_tbptt_trainr", error
print(before)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
