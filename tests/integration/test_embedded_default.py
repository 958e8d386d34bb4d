"""The embedded default works with nothing installed: SQLite under LLMGW_DATA_DIR, tasks in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LLMGW = str(Path(sys.executable).with_name("llmgw"))


def llmgw(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG"}}
    env["LLMGW_DATA_DIR"] = str(data_dir)
    return subprocess.run([LLMGW, *args], env=env, capture_output=True, text=True, timeout=120)


def test_demo_loads_on_sqlite_and_ctl_reads_it(tmp_path):
    result = llmgw(tmp_path, "demo", "--no-serve")
    assert result.returncode == 0, result.stderr
    assert "log in as admin / " in result.stdout
    assert (tmp_path / "llmgw.sqlite3").exists()

    nodes = json.loads(llmgw(tmp_path, "ctl", "nodes", "-o", "json").stdout)
    assert len(nodes) == 32
    assert {n["location"]["room"] for n in nodes} == {"hall-a", "hall-b"}
    assert len({n["location"]["rack"] for n in nodes}) == 8

    held = llmgw(tmp_path, "ctl", "facility", "hold", "rack:r1-01", "--reason", "PDU swap")
    assert held.returncode == 0, held.stderr
    table = llmgw(tmp_path, "ctl", "nodes", "--domain", "rack:r1-01").stdout.splitlines()
    assert len(table) == 5
    assert all(line.split()[1] == "held" for line in table[1:])
