"""Every command of the README's tour runs, in order, on the demo facility (embedded SQLite), as a new
user would type it: exit 0, no traceback, and the figures it leads the reader to are there."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.integration.test_docs_examples import heartbeats_fresh

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The `llmgw …` lines of the README's ```sh blocks, in order."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("llmgw "):
                commands.append(line)
    return commands


def run(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG", "LLMGW_URL"}}
    env["LLMGW_DATA_DIR"] = str(tmp_path)
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


def test_the_readme_tour_runs_on_the_demo(tmp_path):
    commands = readme_commands()
    assert len(commands) >= 10, commands
    loaded = run(tmp_path, ["demo", "--no-serve"])
    assert loaded.returncode == 0, loaded.stderr
    outputs = {}
    for line in commands:
        heartbeats_fresh(tmp_path)  # as the demo's simulated agents keep them, however long the tour takes
        done = run(tmp_path, shlex.split(line)[1:])
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, line
        outputs[line] = done.stdout
    # What the tour's words point at is there.
    assert any("feed A101 415 V 50 A 3φ 80 %" in line for line in outputs["llmgw ctl facility"].splitlines())
    assert outputs["llmgw ctl facility feed-loss"].splitlines()[-1] == "0 violations"
    assert "FEED" in outputs["llmgw ctl facility feeds"].splitlines()[0]
