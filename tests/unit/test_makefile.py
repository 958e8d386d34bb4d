"""The Makefile's installs: `make demo` the server extra alone, `make test` the test extra beside it, even
after a demo; each again when pyproject.toml changes. Read from `make -n` (prints, runs nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def planned(venv: Path, target: str) -> list[str]:
    """The install commands `make TARGET` would run with the virtualenv at `venv`."""
    done = subprocess.run(["make", "-n", "-C", str(ROOT), f"VENV={venv}", "PYTHON=python3", target],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if " -m venv " in line or "pip install" in line]


def test_demo_installs_the_server_extra_and_test_adds_the_test_extra(tmp_path):
    venv = tmp_path / ".venv"
    assert planned(venv, "demo") == [f"python3 -m venv {venv}", f"{venv}/bin/pip install -q -e '.[server]'"]

    # After `make demo`: the demo installs nothing more; the tests install their extra.
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".installed-server").touch()
    assert planned(venv, "demo") == []
    for target in ("test", "test-quick", "lint", "docs"):
        assert planned(venv, target) == [f"{venv}/bin/pip install -q -e '.[server,test]'"], target

    # After `make test`: nothing for either, until pyproject.toml is newer than what was installed.
    (venv / ".installed-test").touch()
    assert planned(venv, "test") == planned(venv, "demo") == []
    old = (ROOT / "pyproject.toml").stat().st_mtime - 60
    for stamp in (".installed-server", ".installed-test"):
        os.utime(venv / stamp, (old, old))
    assert planned(venv, "demo") == [f"{venv}/bin/pip install -q -e '.[server]'"]
    assert planned(venv, "test") == [f"{venv}/bin/pip install -q -e '.[server,test]'"]
