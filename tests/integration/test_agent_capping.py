"""The whole agent process against a stand-in control plane answering a capping block: the limit it
sets through NVML is read back and reported, then restored when the block goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.control_plane import DEADLINE_SECONDS, ControlPlane, agent_yaml, wait_until

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "tests" / "fakes" / "agent_with_fake_nvml.py"
CAP = {"lever": "power_limit", "all": {"power_limit_watts": 490}}


@pytest.fixture
def plane():
    control_plane = ControlPlane()
    yield control_plane
    control_plane.close()


def run_agent(plane: ControlPlane, tmp_path: Path, *flags: str) -> subprocess.Popen:
    (tmp_path / "root").mkdir()
    config = tmp_path / "agent.yaml"
    config.write_text(agent_yaml(plane.url, interval_seconds=0.2, sys_root=tmp_path / "root"))
    return subprocess.Popen(
        [sys.executable, str(AGENT), "--config", str(config), *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def last_gpu(plane: ControlPlane) -> dict:
    if not plane.requests:
        return {}
    return (plane.requests[-1]["body"]["sensors"].get("gpus") or [{}])[0]


def stop(agent: subprocess.Popen) -> str:
    agent.send_signal(signal.SIGTERM)
    try:
        assert agent.wait(DEADLINE_SECONDS) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    return agent.stdout.read().decode()


def test_the_agent_sets_reports_and_restores_the_power_limit(plane, tmp_path):
    plane.answer = {"node": "gpu01", "interval_seconds": 0.2, "replicas": [], "capping": CAP}
    agent = run_agent(plane, tmp_path)
    try:
        wait_until(lambda: last_gpu(plane).get("enforced_power_limit_watts") == 490.0)
        assert last_gpu(plane)["default_power_limit_watts"] == 700.0
        assert last_gpu(plane)["max_sm_clock_mhz"] == 1980
        assert "capping" not in last_gpu(plane)
        plane.answer = {"node": "gpu01", "interval_seconds": 0.2, "replicas": []}
        wait_until(lambda: last_gpu(plane).get("enforced_power_limit_watts") == 700.0)
    finally:
        output = stop(agent)
    assert "GPU power limit set to 490 W" in output
    assert "GPU power limit set to 700 W" in output


def test_an_agent_without_root_reports_not_permitted_and_keeps_beating(plane, tmp_path):
    plane.answer = {"node": "gpu01", "interval_seconds": 0.2, "replicas": [], "capping": CAP}
    agent = run_agent(plane, tmp_path, "--no-permission")
    try:
        wait_until(lambda: last_gpu(plane).get("capping") == "not permitted")
        beats = len(plane.requests)
        wait_until(lambda: len(plane.requests) >= beats + 2)
        assert last_gpu(plane)["enforced_power_limit_watts"] == 700.0
        assert last_gpu(plane)["power_watts"] == 312.5
    finally:
        stop(agent)


def test_an_a100_reports_its_own_top_clock_and_holds_the_lock_asked_below_it(plane, tmp_path):
    plane.answer = {"node": "gpu01", "interval_seconds": 0.2, "replicas": []}
    agent = run_agent(plane, tmp_path, "--a100")
    try:
        wait_until(lambda: last_gpu(plane).get("max_sm_clock_mhz") == 1410)
        # What the control plane asks of an A100 capped to 80 %: a share of 1410 MHz, not of 1980.
        plane.answer = {"node": "gpu01", "interval_seconds": 0.2, "replicas": [],
                        "capping": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [210, 1128]}}}
        wait_until(lambda: last_gpu(plane).get("locked_clocks_mhz") == [210, 1128])
        plane.answer = {"node": "gpu01", "interval_seconds": 0.2, "replicas": []}
        wait_until(lambda: "locked_clocks_mhz" not in last_gpu(plane))
    finally:
        output = stop(agent)
    assert "GPU SM clocks locked to 210-1128 MHz" in output
    assert "GPU clocks unlocked" in output
