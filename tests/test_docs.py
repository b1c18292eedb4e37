import os
import subprocess
import sys
from pathlib import Path

import pytest

import ignite_tbptt
import ignite_tbptt.data
import ignite_tbptt.handlers
import ignite_tbptt.models

DOCS = Path(__file__).parent.parent / "docs"
PUBLIC = [ignite_tbptt.data, ignite_tbptt.handlers, ignite_tbptt.models]  # beside the root


@pytest.mark.slow  # a Sphinx build of every page
def test_documentation_builds_without_warnings(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    public = {page.stem: page.read_text() for page in (tmp_path / "api").glob("*.html") if page.stem != "internals"}
    # Every name the package and its public subpackages export is documented on a page of the public API.
    exported = [f"ignite_tbptt.{name}" for name in ignite_tbptt.__all__]
    exported += [
        f"ignite_tbptt.{package.__name__.rpartition('.')[2]}.{name}" for package in PUBLIC for name in package.__all__
    ]
    missing = [name for name in exported if not any(f'id="{name}"' in page for page in public.values())]
    missing = [name for name in missing if not _documented_as_root(name, public)]
    assert not missing, f"public names without an entry in docs/api/: {missing}"
    # The internals have a page of their own, not the public one.
    assert not any('id="ignite_tbptt.runtime.' in page for page in public.values())
    assert 'id="ignite_tbptt.planning.segment_plan.SegmentPlan"' in (tmp_path / "api" / "internals.html").read_text()
    assert (tmp_path / "_images" / "schedule_k1-2_k2-5.png").is_file()
    # The tutorial notebook is reachable from the index, and the theme's search has an index to search.
    index = (tmp_path / "index.html").read_text()
    for kind in ("Tutorials", "How-to guides", "Explanation", "Reference"):
        assert kind in index
    assert 'href="tutorial.html"' in index
    assert list(tmp_path.glob("_downloads/*/tbptt_tutorial.ipynb"))
    assert "create_tbptt_trainer" in (tmp_path / "searchindex.js").read_text()
    assert (tmp_path / "search.html").is_file()


def _documented_as_root(name: str, pages: dict[str, str]) -> bool:
    """A subpackage's name that the package's root also exports, documented once under the root's name."""
    short = name.rpartition(".")[2]
    return short in ignite_tbptt.__all__ and any(f'id="ignite_tbptt.{short}"' in page for page in pages.values())


@pytest.mark.slow  # the how-to's script, which starts its processes
def test_the_distributed_howto_runs_as_written(tmp_path, free_port):
    text = (DOCS / "howto" / "distributed.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "training.py"
    script.write_text(code)
    # Its rendezvous on a free port: ignite's default, 2222, may be taken by another test's processes.
    env = {**os.environ, "MASTER_PORT": str(free_port)}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    assert "optimizer steps, last loss" in result.stdout
