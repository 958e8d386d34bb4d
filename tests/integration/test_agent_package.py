"""`pip install llmgw` on a GPU node: the agent runs with only its own dependencies.

Builds a virtualenv (no pip, no network) that sees only the packages pyproject.toml's base dependencies
need, linked from this environment, and the project's source; runs `llmgw agent --once --dry-run` in it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("django", "celery", "psycopg", "channels", "rest_framework", "kombu", "redis")


def base_distributions() -> set[str]:
    """The base dependencies of pyproject.toml and everything they require (no extras)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in seen:
            continue
        seen.add(name)
        todo += [Requirement(r) for r in metadata.distribution(name).requires or []]
    return seen


def link_distribution(name: str, site: Path) -> None:
    """Link a distribution's top-level modules and its metadata into `site`, as pip would have put them."""
    dist = metadata.distribution(name)
    tops = {Path(str(f)).parts[0] for f in dist.files or []}
    for top in tops:
        source = Path(dist.locate_file(top))
        if top in ("..", "__pycache__") or not source.exists() or (site / top).exists():
            continue
        (site / top).symlink_to(source)


def make_agent_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python*/site-packages")
    for name in sorted(base_distributions()):
        link_distribution(name, site)
    (site / "llmgw.pth").write_text(f"{REPO}\n")  # the project itself, as `pip install llmgw` puts it
    script = venv / "bin" / "llmgw"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom llmgw.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return venv


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory) -> Path:
    return make_agent_venv(tmp_path_factory.mktemp("venv"))


def run_in(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DJANGO", "VIRTUAL_ENV"))}
    return subprocess.run(args, cwd=venv, env=env, capture_output=True, text=True, timeout=60)


def test_the_control_planes_stack_is_absent(agent_venv):
    for module in ("django", "celery", "psycopg", "channels"):
        result = run_in(agent_venv, str(agent_venv / "bin" / "python"), "-c", f"import {module}")
        assert result.returncode == 1
        assert f"No module named '{module}'" in result.stderr


def test_agent_dry_run_prints_its_heartbeat(agent_venv):
    result = run_in(agent_venv, str(agent_venv / "bin" / "llmgw"), "agent", "--once", "--dry-run")
    assert result.returncode == 0, result.stderr
    heartbeat = json.loads(result.stdout)
    assert heartbeat["node"]
    assert heartbeat["inventory"]["cpu_cores"] > 0
    assert isinstance(heartbeat["sensors"], dict)


def test_the_agent_loads_nothing_of_the_control_plane(agent_venv):
    code = (
        "import sys, agents.node.daemon, agents.node.sensors, llmgw.cli;"
        # agent.yaml read as the agent reads it (PyYAML is imported when a file is parsed)
        "from llmgw.yamldoc import load_documents; load_documents('node: gpu01', 'agent.yaml');"
        "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    result = run_in(agent_venv, str(agent_venv / "bin" / "python"), "-c", code)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.replace("'", '"')))
    assert loaded & set(SERVER_ONLY) == set()
    assert "httpx" in loaded and "yaml" in loaded
