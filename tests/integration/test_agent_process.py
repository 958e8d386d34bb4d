"""The whole node agent as a process: it runs the replicas the control plane assigns and stops them on
SIGTERM."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.fakes.control_plane import DEADLINE_SECONDS, REPLICA, ControlPlane, agent_yaml, wait_until

REPO = Path(__file__).resolve().parents[2]
FAKE_SERVER = REPO / "tests" / "fakes" / "model_server.py"


@pytest.fixture
def plane():
    control_plane = ControlPlane()
    yield control_plane
    control_plane.close()


def test_the_agent_runs_assigned_replicas_and_stops_them_on_sigterm(plane, tmp_path):
    command = " ".join(shlex.quote(p) for p in (sys.executable, str(FAKE_SERVER))) + " --port {port}"
    plane.answer = {"node": "gpu01", "interval_seconds": 0.2, "replicas": [{**REPLICA, "command": command}]}
    (tmp_path / "root").mkdir()  # an empty machine: no sensors at all
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(
        agent_yaml(plane.url, interval_seconds=0.2, sys_root=tmp_path / "root")
        + "runtime:\n  port_range: [41000, 41099]\n  grace_seconds: 2\n"
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "agents.node.daemon", "--config", str(config_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_until(
            lambda: any(
                r["body"]["replicas"] and r["body"]["replicas"][0]["state"] == "ready" for r in plane.requests
            )
        )
        port = next(r for r in plane.requests if r["body"]["replicas"])["body"]["replicas"][0]["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/env", timeout=5) as response:
            replica_pid = json.loads(response.read())["pid"]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(DEADLINE_SECONDS) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    output = agent.stdout.read().decode()
    assert "replica 17 (llama-70b): ready on port" in output
    assert "replica 17 (llama-70b): stopping, the agent is shutting down" in output
    assert (
        not Path(f"/proc/{replica_pid}").exists()
        or "Z" in Path(f"/proc/{replica_pid}/stat").read_text().split()[2]
    )
