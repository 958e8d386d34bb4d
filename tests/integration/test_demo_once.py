"""One demo a data directory: a second `make demo ADDR=…` on the same checkout refuses, naming the one
running; ctl on the data of a demo that stopped says so."""

from __future__ import annotations

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


def test_a_second_demo_on_the_same_data_refuses_naming_the_first(tmp_path):
    from llmgw.whereabouts import demo_lock_take

    data, state = tmp_path / "var", tmp_path / "state"
    assert llmgw("demo", "--no-serve", cwd=tmp_path, state=state, LLMGW_DATA_DIR=str(data)).returncode == 0
    before = (state / "llmgw" / "demo.json").read_text()
    first = demo_lock_take(data, url="http://127.0.0.1:8000")  # the first demo, serving (this process)
    try:
        second = llmgw("demo", "--addr", "127.0.0.1:8001", cwd=tmp_path, state=state, LLMGW_DATA_DIR=str(data))
        assert second.returncode != 0
        assert second.stderr.strip().splitlines()[-1] == (
            f"error: a demo already runs on {data}: http://127.0.0.1:8000, pid {os.getpid()}. Stop it "
            "(Ctrl-C where it runs), use it, or start this one on another data directory: LLMGW_DATA_DIR=DIR "
            "llmgw demo (make demo LLMGW_DATA_DIR=DIR ADDR=…)"
        )
        assert (state / "llmgw" / "demo.json").read_text() == before  # not repointed
        # Another data directory is another demo.
        other = llmgw("demo", "--no-serve", cwd=tmp_path, state=state, LLMGW_DATA_DIR=str(tmp_path / "other"))
        assert other.returncode == 0, other.stderr
    finally:
        first.close()


def test_ctl_on_a_stopped_demos_data_says_it_is_not_running(tmp_path):
    from llmgw.whereabouts import demo_lock_take, demo_record_write

    data, state = tmp_path / "var", tmp_path / "state"
    assert llmgw("demo", "--no-serve", cwd=tmp_path, state=state, LLMGW_DATA_DIR=str(data)).returncode == 0
    quiet = llmgw("ctl", "nodes", "-o", "json", cwd=tmp_path / "state", state=state)
    assert (quiet.returncode, quiet.stderr) == (0, "")  # a --no-serve demo never answered: nothing to say
    os.environ["XDG_STATE_HOME"], saved = str(state), os.environ["XDG_STATE_HOME"]
    try:
        demo_record_write(data_dir=data, url="http://127.0.0.1:8000")
    finally:
        os.environ["XDG_STATE_HOME"] = saved
    demo_lock_take(data, url="http://127.0.0.1:8000").close()  # it served, then stopped
    stopped = llmgw("ctl", "nodes", "-o", "json", cwd=tmp_path / "state", state=state)
    assert stopped.returncode == 0 and stopped.stdout.startswith("[")
    assert stopped.stderr == (
        f"note: the demo on this data ({data}) is not running: http://127.0.0.1:8000 does not answer, and nodes "
        "show as they were when it stopped; start it again with make demo\n"
    )
    running = demo_lock_take(data, url="http://127.0.0.1:8000")
    try:
        assert llmgw("ctl", "nodes", "-o", "json", cwd=tmp_path / "state", state=state).stderr == ""
    finally:
        running.close()


def test_sim_replays_a_shipped_scenario_by_name_from_anywhere(tmp_path):
    data, state, elsewhere = tmp_path / "var", tmp_path / "state", tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert llmgw("demo", "--no-serve", cwd=tmp_path, state=state, LLMGW_DATA_DIR=str(data)).returncode == 0
    got = llmgw("sim", "facility", "crac-failure", "--speed", "10", cwd=elsewhere, state=state)
    assert (got.returncode, got.stdout) == (0, "replaying crac-failure at ×10 from now (5.0 min); conditions "
                                               "follow at each evaluation (llmgw ctl facility events)\n"), got.stderr
    got = llmgw("sim", "facility", "crac-fail", cwd=elsewhere, state=state)
    assert got.returncode != 0
    assert got.stderr.strip().splitlines()[-1] == (
        "error: no scenario 'crac-fail' (the demo's: crac-failure; or give a scenario file)")


def test_the_scenarios_ship_in_the_package():
    import llmgw

    shipped = Path(llmgw.__file__).parent / "demo" / "scenarios"
    assert sorted(p.name for p in shipped.glob("*.yaml")) == ["crac-failure.yaml"]
