"""README.md: its quickstart runs as written, and every figure it keeps is on the docs page that regenerates it."""

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Each figure the README keeps, and the page that gives it with the command that regenerates it.
FIGURES = {
    "2.107-2.152 after one epoch and 1.976-2.020 after two": "docs/examples/char_lm.md",
    "38-57 s on 2 quiet cores": "docs/examples/char_lm.md",
    "5-9 min on 2 cores, 2 workers": "docs/howto/tests.md",
}


def section(title: str) -> str:
    """The README's text under the heading ``## title``, up to the next heading of that level."""
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def quickstart() -> str:
    """The fenced python block under the README's "Quickstart" heading."""
    return section("Quickstart").split("```python\n", 1)[1].split("```", 1)[0]


def test_the_quickstart_runs_as_written(tmp_path, monkeypatch):
    code = quickstart()
    assert 20 <= len(code.strip().splitlines()) <= 30
    assert "create_tbptt_trainer" in code and "attach_tensorboard" in code and "GradientClipping" in code
    k1, k2 = (int(re.search(rf"\b{k}=(\d+)", code).group(1)) for k in ("k1", "k2"))
    assert k2 > k1
    monkeypatch.chdir(tmp_path)  # its TensorBoard logs go to runs/ under the working directory
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md (Quickstart)", "exec"), {"__name__": "__main__"})
    assert re.fullmatch(r"80 windows, 80 optimizer steps, last loss \d+\.\d\d nats\n", out.getvalue()), out.getvalue()
    assert list((tmp_path / "runs" / "quickstart").glob("events.out.tfevents.*"))


def test_the_readme_gives_the_main_job_and_the_test_command_ci_runs():
    commands = section("Run and test").split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert commands[0].startswith("python -m ignite_tbptt.examples.char_lm ")
    assert commands[1].startswith("python -m pytest ")  # .ci/run runs the test command written here
    assert len(README.splitlines()) <= 150


def test_every_figure_the_readme_keeps_is_on_the_page_that_regenerates_it():
    text = " ".join(README.split())
    for figure, page in FIGURES.items():
        assert figure in text, f"README.md no longer says {figure!r}: update FIGURES"
        assert figure in " ".join((ROOT / page).read_text(encoding="utf-8").split()), f"{page} does not say {figure!r}"
    # No other measured figure (a spread of bits, a time in seconds or minutes) in the README than those above.
    kept = " ".join(FIGURES)
    for match in re.finditer(r"\d+(?:\.\d+)?-\d+(?:\.\d+)? (?:s|min)\b|\d\.\d{3}-\d\.\d{3}", text):
        assert match.group() in kept, f"README.md gives {match.group()!r}, which no docs page is held to"
