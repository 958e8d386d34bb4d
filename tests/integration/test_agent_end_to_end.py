"""The real `llmgw agent` process against a live control plane: it joins with its labels, is given a
replica, runs it (a small HTTP model server), and the replica becomes ready; a fixture sysfs tree
stands in for the machine's sensors (no NVML here: GPU values absent, never zero)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agents.models import Node
from agents.services import node_token_create
from placement.models import Replica, Shard
from placement.services import models_apply

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
LLMGW = str(Path(sys.executable).with_name("llmgw"))


def wait_for(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not in {seconds} s: {what}")


def test_agent_joins_runs_its_replica_and_reports_it_ready(live_server, tmp_path):
    token = node_token_create(node_name="gpu01")
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "agent.yaml").write_text(
        textwrap.dedent(
            f"""\
            server: {live_server.url}
            node: gpu01
            token_file: token
            interval_seconds: 1
            fabric: ib-a
            sys_root: {ROOT / "tests/fixtures/sys/xeon"}
            labels:
              llmgw.io/rack: r12-07
              llmgw.io/pdu: "r12-07-a,r12-07-b"
            runtime:
              port_range: [18300, 18399]
              grace_seconds: 2
              workdir: {tmp_path}
            """
        )
    )
    log = open(tmp_path / "agent.log", "w")  # noqa: SIM115 - closed below
    agent = subprocess.Popen([LLMGW, "agent", "--config", str(tmp_path / "agent.yaml")], stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        node = wait_for(lambda: Node.objects.filter(name="gpu01").first(), 30, "the node joins")
        assert node.labels["llmgw.io/rack"] == "r12-07"
        assert sorted(node.domains.values_list("domain", flat=True)) == ["pdu:r12-07-a", "pdu:r12-07-b", "rack:r12-07"]
        assert node.sensors["cpu_temperature_celsius"] == 63.0  # the Xeon tree's hottest package
        assert node.sensors["inlet_temperature_celsius"] == 24.0
        assert node.sensors.get("gpus", []) == []  # no NVML on this machine: absent, not zero

        models_apply(
            text=textwrap.dedent(
                f"""\
                kind: Model
                name: tiny
                replicas: 1
                profile:
                  gpus: 0
                  cpu_cores: 2
                  command: "{sys.executable} {ROOT / 'tests/fakes/model_server.py'} --port {{port}} --ready-after 0.5"
                """
            )
        )
        replica = wait_for(lambda: Replica.objects.filter(model__name="tiny", state="ready").first(), 30,
                           "the replica is ready: " + (tmp_path / "agent.log").read_text()[-2000:])
        shard = Shard.objects.get(replica=replica)
        assert shard.node.name == "gpu01"
        assert 18300 <= shard.port <= 18399
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(15)
        log.close()
    assert agent.returncode == 0
