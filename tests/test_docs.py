import os
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).parent.parent / "docs"


def test_documentation_builds_without_warnings(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    api = (tmp_path / "api.html").read_text()
    for name in ("create_tbptt_trainer", "create_tbptt_evaluator", "GradientClipping", "attach_tensorboard"):
        assert f'id="ignite_tbptt.{name}"' in api
    assert (tmp_path / "_images" / "schedule_k1-2_k2-5.png").is_file()


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
