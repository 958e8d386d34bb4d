"""What a node knows, on the control plane: its GPU topology kept and shown (API, console, ctl), and its
BMC's figure taken as its measured draw — from heartbeats, and from a real agent reading a Redfish
emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agents.models import Node
from agents.node.sensors import SensorReader
from agents.services import node_token_create
from facility.models import FacilitySettings
from facility.power import FacilitySettings as PowerSettings
from facility.power import node_use_watts
from llmgw.ctl import main as ctl
from tests.fakes.fixture_trees import tree
from tests.fakes.gpu_machines import hgx_h100, pcie_4gpu
from tests.fakes.redfish import sushy_static

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
LLMGW = str(Path(sys.executable).with_name("llmgw"))
HEARTBEAT = "/api/v1/agents/heartbeat"
NV18_ROW = ["NV18"] * 7


def heartbeat(name: str, inventory: dict, sensors: dict | None = None) -> dict:
    return {"node": name, "interval_seconds": 10, "inventory": inventory, "labels": {}, "sensors": sensors or {}}


def post(node_client, body: dict):
    response = node_client(body["node"]).post(HEARTBEAT, body, format="json")
    assert response.status_code == 200, response.content
    return response


def page(client, make_user, name: str) -> str:
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    response = client.get(f"/nodes/{name}/")
    assert response.status_code == 200
    return response.content.decode()


def run_ctl(capsys, *argv: str) -> tuple[int, str]:
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def test_the_topology_is_kept_and_shown(node_client, api, client, make_user, capsys):
    inventory = SensorReader(sys_root=tree("hgx-h100"), nvml=hgx_h100()).inventory()
    post(node_client, heartbeat("hgx01", inventory))
    node = Node.objects.get(name="hgx01")
    assert node.gpu_topology["numa"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.gpu_topology["links"][0] == ["X", *NV18_ROW]

    detail = api.get("/api/v1/nodes/hgx01").json()
    assert detail["gpu_topology"] == node.gpu_topology

    html = page(client, make_user, "hgx01")
    assert "GPU topology" in html
    assert html.count(">NV18</td>") == 56  # every pair, both ways
    assert '<td class="numa">1</td>' in html

    code, out = run_ctl(capsys, "node", "hgx01")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("hgx01  ready  GPUs 8/8 free")
    table = lines[lines.index("") + 1:]
    assert table[0].split() == ["GPU0", "GPU1", "GPU2", "GPU3", "GPU4", "GPU5", "GPU6", "GPU7", "NUMA"]
    assert table[1].split() == ["GPU0", "X", *NV18_ROW, "0"]
    assert table[8].split() == ["GPU7", *NV18_ROW, "X", "1"]
    code, out = run_ctl(capsys, "node", "show", "hgx01", "-o", "json")
    assert json.loads(out)["gpu_topology"] == node.gpu_topology

    # A heartbeat whose GPUs were not read in time keeps what is known; another machine's replaces it.
    post(node_client, heartbeat("hgx01", {"cpu_cores": 224}))
    assert Node.objects.get(name="hgx01").gpu_topology == node.gpu_topology
    post(node_client, heartbeat("hgx01", SensorReader(sys_root=tree("pcie-4gpu"), nvml=pcie_4gpu()).inventory()))
    assert Node.objects.get(name="hgx01").gpu_topology["numa"] == [-1, -1, -1, -1]
    assert "NUMA N/A: the platform has one node" in page(client, make_user, "hgx01")


def test_a_node_without_a_topology_shows_none(node_client, api, client, make_user, capsys):
    post(node_client, heartbeat("cpu01", {"gpus": [], "cpu_cores": 64}))
    assert api.get("/api/v1/nodes/cpu01").json()["gpu_topology"] is None
    assert "GPU topology" not in page(client, make_user, "cpu01")
    code, out = run_ctl(capsys, "node", "cpu01")
    assert "GPU0" not in out


def test_the_bmc_figure_is_the_measured_draw_and_a_down_bmc_falls_back(node_client, api, client, make_user, capsys):
    inventory = SensorReader(sys_root=tree("pcie-4gpu"), nvml=pcie_4gpu()).inventory()
    gpus = [{"index": i, "power_watts": 200.0} for i in range(4)]
    up = {"gpus": gpus, "cpu_power_watts": 150.0, "node_power_watts": 1540.0, "power_source": "bmc",
          "bmc": {"state": "up", "resource": "EnvironmentMetrics"}}
    for _ in range(2):  # two readings: the measured peak
        post(node_client, heartbeat("inf01", inventory, up))
    node = Node.objects.get(name="inf01")
    node_watts = FacilitySettings.load().node_watts
    # The BMC's whole-chassis figure takes the place of GPU + CPU + node_watts in the node's term.
    assert node.measured_watts == 1540.0 - node_watts
    settings = PowerSettings(node_watts=node_watts)
    assert node_use_watts(0.0, node.fresh_measured_watts(), settings) == 1540.0
    assert node_use_watts(1600.0, node.fresh_measured_watts(), settings) == 1600.0 + node_watts

    detail = api.get("/api/v1/nodes/inf01").json()
    assert (detail["power_source"], detail["bmc_watts"]) == ("bmc", 1540.0)
    assert detail["bmc"] == {"state": "up", "resource": "EnvironmentMetrics"}
    html = page(client, make_user, "inf01")
    assert "1.5 kW <span class=\"sub\">measured by the BMC</span>" in html
    code, out = run_ctl(capsys, "node", "inf01")
    assert "power: 1.5 kW measured by the BMC (EnvironmentMetrics)" in out.splitlines()

    down = {"gpus": gpus, "cpu_power_watts": 150.0, "bmc": {"state": "down", "reason": "no answer within 5 s"}}
    post(node_client, heartbeat("inf01", inventory, down))
    node.refresh_from_db()
    assert node.measured_watts == 950.0  # the cards and CPUs again
    detail = api.get("/api/v1/nodes/inf01").json()
    assert (detail["power_source"], detail["bmc_watts"]) == ("gpu+cpu", None)
    html = page(client, make_user, "inf01")
    assert "BMC down</strong>: no answer within 5 s" in html and "measured by the BMC" not in html
    code, out = run_ctl(capsys, "node", "inf01")
    assert "BMC down: no answer within 5 s; the measured draw is the GPUs' and CPUs' readings" in out


def test_a_heartbeat_claiming_a_bmc_figure_without_its_source_is_refused(node_client):
    response = node_client("inf01").post(
        HEARTBEAT, heartbeat("inf01", {}, {"node_power_watts": 1540.0}), format="json"
    )
    assert response.status_code == 400
    assert "sensors.power_source" in response.json()["detail"]


def wait_for(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not in {seconds} s: {what}")


@pytest.mark.slow
def test_a_real_agent_reads_its_bmc_through_the_redfish_emulator(live_server, tmp_path):
    token = node_token_create(node_name="gpu01")
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "bmc").write_text("root:calvin\n")
    log = open(tmp_path / "agent.log", "w")  # noqa: SIM115 - closed below
    with sushy_static("public-rackmount1") as redfish:
        (tmp_path / "agent.yaml").write_text(
            textwrap.dedent(
                f"""\
                server: {live_server.url}
                node: gpu01
                token_file: token
                interval_seconds: 1
                sys_root: {ROOT / "tests/fixtures/sys/xeon"}
                bmc:
                  redfish: {redfish}
                  credentials_file: bmc
                  chassis: 1U
                """
            )
        )
        agent = subprocess.Popen([LLMGW, "agent", "--config", str(tmp_path / "agent.yaml")], stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try:
            node = wait_for(
                lambda: Node.objects.filter(name="gpu01", sensors__power_source="bmc").first(), 30,
                "a heartbeat with the BMC's figure",
            )
            assert node.sensors["node_power_watts"] == 374.0  # DMTF's rackmount1: EnvironmentMetrics
            assert node.sensors["bmc"] == {"state": "up", "resource": "EnvironmentMetrics"}
            assert node.measured_watts == 374.0 - FacilitySettings.load().node_watts
        except BaseException:
            print((tmp_path / "agent.log").read_text()[-3000:])
            raise
    try:
        # The emulator is gone: the BMC is down with why, and the node's own readings stand.
        node = wait_for(
            lambda: Node.objects.filter(name="gpu01", sensors__bmc__state="down").first(), 30, "the BMC down"
        )
        assert node.sensors["bmc"]["reason"].startswith("cannot connect to http://127.0.0.1:")
        assert "node_power_watts" not in node.sensors
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(30)
        log.close()


def test_the_fast_lane_takes_the_bmc_figure_less_node_watts(monkeypatch):
    from agents import readings
    from agents.simulator.nodes import SimNode
    from tests.conftest import node_spec
    from tests.integration.test_heartbeat_lane import post as lane_post
    from tests.integration.test_heartbeat_lane import spy_on_lane

    answered_here = spy_on_lane(monkeypatch)
    token = node_token_create(node_name="gpu01")
    node = SimNode(node_spec("gpu01", rack="r1"))
    bmc = {"node_power_watts": 4200.0, "power_source": "bmc", "bmc": {"state": "up", "resource": "Power"}}
    first = node.heartbeat(1.0)
    first["sensors"].update(bmc)
    assert lane_post(first, token)[0] == 200
    second = node.heartbeat(2.0)
    second["sensors"].update(bmc, node_power_watts=4800.0)
    assert lane_post(second, token)[0] == 200
    assert answered_here == [False, True]
    node_watts = FacilitySettings.load().node_watts
    wait_for(lambda: Node.objects.get(name="gpu01").measured_watts == 4800.0 - node_watts, 5, "the lane's write")

    # The facility's node_watts not at hand on the event loop: Django's path answers, and reads it.
    readings.forget_draws()
    third = node.heartbeat(3.0)
    third["sensors"].update(bmc, node_power_watts=5000.0)
    assert lane_post(third, token)[0] == 200
    assert answered_here == [False, True, False]
    assert Node.objects.get(name="gpu01").measured_watts == 5000.0 - node_watts
