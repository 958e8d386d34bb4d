"""`pip install llmgw` (no server extra, a GPU node's install): the control plane's commands say what to
install, exit 2, instead of dying on `No module named 'django'`."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

# The server extra's packages made unimportable, as on an install without them.
LEAN = """\
import sys
from importlib.abc import MetaPathFinder
from llmgw.cli import SERVER_MODULES, main
for name in list(sys.modules):
    if name.partition(".")[0] in SERVER_MODULES:
        del sys.modules[name]
class Lean(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in SERVER_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Lean())
sys.exit(main(sys.argv[1:]))
"""


def lean(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"LLMGW_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    env["XDG_STATE_HOME"] = tempfile.mkdtemp()
    return subprocess.run([sys.executable, "-c", LEAN, *argv], capture_output=True, text=True, env=env,
                          timeout=60, cwd=tempfile.mkdtemp())


@pytest.mark.parametrize("argv", [("demo",), ("serve",), ("ctl", "nodes"), ("migrate",)])
def test_a_control_plane_command_says_what_to_install(argv):
    got = lean(*argv)
    assert (got.returncode, got.stdout) == (2, ""), got.stderr
    assert got.stderr == (
        f"error: llmgw {argv[0]} is the control plane's, and this install lacks its packages (no module named "
        "'django'): pip install 'llmgw[server]'\n"
    )


def test_the_usage_says_the_control_plane_is_not_installed():
    got = lean("--help")
    assert got.returncode == 0
    assert "control plane (not installed here: pip install 'llmgw[server]'):\n  demo " in got.stdout
    assert "on a GPU node:\n  agent " in got.stdout
