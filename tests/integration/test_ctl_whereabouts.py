"""`llmgw ctl` from any directory, nothing set: it works on the last demo's data, or says what to do and
exits 2; either way it leaves nothing behind where it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LLMGW = str(Path(sys.executable).with_name("llmgw"))


def llmgw(*args: str, cwd: Path, state: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG", "LLMGW_URL", "LLMGW_DATA_DIR", "LLMGW_TOKEN"}}
    return subprocess.run([LLMGW, *args], cwd=cwd, env={**base, "XDG_STATE_HOME": str(state), **env},
                          capture_output=True, text=True, timeout=120)


def test_ctl_finds_the_demo_from_anywhere_or_says_what_to_do(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = tmp_path / "state"

    result = llmgw("ctl", "nodes", cwd=elsewhere, state=state)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "error: no llmgw server found: LLMGW_URL and LLMGW_DATA_DIR are not set, ./var here holds no llmgw "
        f"database, and no demo has run as this user ({state / 'llmgw' / 'demo.json'})\n"
        "  start the demo: make demo, in the llmgw checkout (llmgw ctl then finds it from any directory)\n"
        "  or use a running server: export LLMGW_URL=http://HOST:8000, then llmgw ctl login (a token from\n"
        "    llmgw ctl token create USER --role operator, run where its database is)\n"
        "  or its data: export LLMGW_DATA_DIR=DIR (the server's data directory) or DATABASE_URL=postgres://…\n"
    )
    assert list(elsewhere.iterdir()) == []

    data = tmp_path / "checkout" / "var"
    loaded = llmgw("demo", "--no-serve", cwd=tmp_path, state=state, LLMGW_DATA_DIR=str(data))
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads((state / "llmgw" / "demo.json").read_text()) == {"data_dir": str(data), "url": None}
    result = llmgw("ctl", "nodes", "-o", "json", cwd=elsewhere, state=state)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == 32
    # The sim's facility replay, from there too.
    scenario = Path(__file__).resolve().parents[2] / "llmgw" / "demo" / "scenarios" / "crac-failure.yaml"
    result = llmgw("sim", "facility", "-f", str(scenario), "--speed", "10", cwd=elsewhere, state=state)
    assert (result.returncode, result.stdout) == (0, "replaying crac-failure at ×10 from now (5.0 min); conditions "
                                                     "follow at each evaluation (llmgw ctl facility events)\n")
    assert list(elsewhere.iterdir()) == []


def test_sim_sends_to_where_the_demo_whose_data_it_found_serves(tmp_path, monkeypatch):
    from llmgw.management.commands.sim import DEFAULT_SERVER, default_server
    from llmgw.whereabouts import demo_record_write

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    demo_record_write(data_dir=tmp_path / "demo", url="http://127.0.0.1:8731")
    monkeypatch.setenv("LLMGW_DATA_DIR", str(tmp_path / "demo"))
    assert default_server() == "http://127.0.0.1:8731"
    monkeypatch.setenv("LLMGW_DATA_DIR", str(tmp_path / "other"))  # another server's data: not the demo's address
    assert default_server() == DEFAULT_SERVER
    demo_record_write(data_dir=tmp_path / "demo", url=None)  # llmgw demo --no-serve
    monkeypatch.setenv("LLMGW_DATA_DIR", str(tmp_path / "demo"))
    assert default_server() == DEFAULT_SERVER
