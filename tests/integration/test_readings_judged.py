"""A reading is judged on its own, through the real heartbeat API with a node's token: an implausible value
is dropped and flagged, never the node; a node's inventory changes only when an operator confirms it; one
sample never holds a peak."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.metrics import node_sensors_text
from agents.models import GPU, Node
from agents.simulator.cluster import gpu_uuid, heartbeat_for
from facility.services import budget_set, facility_apply
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db

PATH = "/api/v1/agents/heartbeat"
SENTINEL_WATTS = 4_294_967  # NVML's 0xFFFFFFFF mW, read as watts


def beat(name: str = "gpu01", *, gpus: int = 8, watts: list[float] | None = None, cpu: float | None = 220.0,
         **sensors) -> dict:
    """An 8 × H100 node (700 W limits) in rack r1, its cards at 300 W unless told."""
    hb = heartbeat_for(node_spec(name, rack="r1", gpus=gpus))
    watts = [300.0] * gpus if watts is None else watts
    hb["sensors"] = {
        "gpus": [{"index": i, "uuid": gpu_uuid(name, i), "temperature_celsius": 60.0, "power_watts": w}
                 for i, w in enumerate(watts)],
        **({"cpu_power_watts": cpu} if cpu is not None else {}),
        **sensors,
    }
    return hb


@pytest.fixture
def clock(monkeypatch):
    """The time every part of the control plane reads (django.utils.timezone.now), moved by the test."""
    now = [timezone.now()]
    monkeypatch.setattr(timezone, "now", lambda: now[0])

    def move(seconds: float = 10.0):
        now[0] += timedelta(seconds=seconds)
        return now[0]

    return move


@pytest.fixture
def viewer_page(client, make_user):
    user, _ = make_user("pageviewer", "viewer")
    client.force_login(user)
    return lambda name="gpu01": client.get(f"/nodes/{name}/").content.decode()


def node(name: str = "gpu01") -> Node:
    return Node.objects.get(name=name)


def detail(api, name: str = "gpu01") -> dict:
    response = api.get(f"/api/v1/nodes/{name}")
    assert response.status_code == 200
    return response.json()


def rack_use(rack: str = "r1") -> float:
    from facility.selectors import domain_figures

    return domain_figures(domain=f"rack:{rack}").use_watts


# -- one reading out of range: dropped, not the heartbeat --------------------------------------------------


def test_a_card_reading_nvmls_sentinel_is_dropped_and_flagged_the_heartbeat_taken(
    node_client, clock, api, viewer_page
):
    agent = node_client("gpu01")
    watts = [300.0] * 8
    watts[3] = SENTINEL_WATTS
    for _ in range(2):
        clock()
        response = agent.post(PATH, beat(watts=watts), format="json")
        assert response.status_code == 200
    line = "sensors.gpus[3].power_watts: 4,294,967 W is outside what any sensor reads (0 to 5000 W); dropped"
    assert response.json()["warnings"] == [line]
    stored = node()
    assert stored.is_ready()
    assert stored.sensors["implausible"] == [{
        "reading": "sensors.gpus[3].power_watts", "value": 4294967.0,
        "why": "4,294,967 W is outside what any sensor reads (0 to 5000 W)", "kind": "out_of_bounds",
    }]
    assert "power_watts" not in stored.sensors["gpus"][3]
    assert stored.sensors["gpus"][3]["temperature_celsius"] == 60.0  # the card's other readings are kept
    assert stored.measured_watts == stored.measured_peak_watts == 7 * 300.0 + 220.0
    shown = detail(api)
    assert shown["state"] == "ready"
    assert shown["sensors"]["implausible"][0]["value"] == 4294967.0
    assert shown["warnings"] == [line]
    assert line in viewer_page()
    text = node_sensors_text()
    assert 'llmgw_readings_implausible{kind="out_of_bounds"} 1.0' in text
    assert 'llmgw_readings_implausible{kind="gpu_power"}' not in text  # a series only for a kind dropped
    assert 'llmgw_node_implausible_readings{node="gpu01"} 1.0' in text


def test_a_card_reading_the_agent_dropped_at_the_source_flags_the_node_as_one_dropped_here(
    node_client, clock, api, viewer_page
):
    """The agent's own reader, on a card whose NVML answers its not-available value for power: the GPU's
    `dropped` goes out, and the control plane flags the node for it as for a reading it drops itself."""
    from agents.node.sensors import SensorReader
    from tests.fakes.fake_nvml import fake_nvml, h100_sxm
    from tests.fakes.fixture_trees import tree

    card = h100_sxm(0)
    card.power_mw = 0xFFFFFFFF
    read = SensorReader(sys_root=tree("vm"), nvml=fake_nvml([card])).read()["gpus"][0]
    assert "power_watts" not in read
    hb = beat()
    hb["sensors"]["gpus"][3] = {**read, "index": 3, "uuid": gpu_uuid("gpu01", 3)}
    agent = node_client("gpu01")
    for _ in range(2):
        clock()
        response = agent.post(PATH, hb, format="json")
        assert response.status_code == 200
    line = "sensors.gpus[3].power_watts: 0xFFFFFFFF mW, NVML's not-available value; dropped"
    assert response.json()["warnings"] == [line]
    stored = node()
    assert stored.is_ready()
    assert stored.sensors["implausible"] == [{
        "reading": "sensors.gpus[3].power_watts", "value": 4294967.295,
        "why": "0xFFFFFFFF mW, NVML's not-available value", "kind": "at_source",
    }]
    assert "dropped" not in stored.sensors["gpus"][3]
    assert stored.measured_watts == 7 * 300.0 + 220.0
    assert detail(api)["sensors"]["implausible"][0]["kind"] == "at_source"
    assert html.escape(line) in viewer_page()
    text = node_sensors_text()
    assert 'llmgw_readings_implausible{kind="at_source"} 1.0' in text
    assert 'llmgw_node_implausible_readings{node="gpu01"} 1.0' in text


def test_a_temperature_no_sensor_reads_is_dropped_too(node_client):
    response = node_client("gpu01").post(PATH, beat(inlet_temperature_celsius=6553.5), format="json")
    assert response.status_code == 200
    assert response.json()["warnings"] == [
        "sensors.inlet_temperature_celsius: 6553.5 °C is outside what any sensor reads (-40 to 150 °C); dropped"
    ]
    assert "inlet_temperature_celsius" not in node().sensors


def test_a_malformed_heartbeat_is_still_refused_naming_the_field(node_client):
    hb = beat()
    hb["sensors"]["gpus"][2]["power_watts"] = "300"
    response = node_client("gpu01").post(PATH, hb, format="json")
    assert response.status_code == 400
    assert response.json()["detail"] == "sensors.gpus[2].power_watts: must be a number (W), not '300'"
    assert not Node.objects.filter(name="gpu01").exists()


# -- physical plausibility ---------------------------------------------------------------------------------


def test_cards_at_925_w_against_700_w_limits_are_dropped(node_client, clock):
    agent = node_client("gpu01")
    agent.post(PATH, beat(), format="json")
    clock()
    response = agent.post(PATH, beat(watts=[925.0] * 8), format="json")
    warnings = response.json()["warnings"]
    assert len(warnings) == 8
    assert warnings[0] == (
        "sensors.gpus[0].power_watts: 925 W is more than GPU 0 can draw (its maximum is 700 W; up to 795 W is "
        "believed); dropped"
    )
    assert node().measured_watts == 220.0
    assert {e["kind"] for e in node().sensors["implausible"]} == {"gpu_power"}


def test_a_cards_maximum_comes_from_its_limits_range_where_the_agent_reports_it(node_client):
    hb = beat(watts=[760.0] * 8)
    for card in hb["inventory"]["gpus"]:
        card["power_limit_watts"], card["power_limit_max_watts"] = 350.0, 700.0  # capped to 350 W
    response = node_client("gpu01").post(PATH, hb, format="json")
    assert "warnings" not in response.json()  # within 700 W × 1.1 + 25 W
    assert GPU.objects.filter(node__name="gpu01", power_limit_max_watts=700.0).count() == 8


def test_a_bmc_reading_past_the_nodes_ceiling_is_dropped(node_client, clock):
    facility_apply(text="facility:\n  node_watts: 4600\n")
    agent = node_client("gpu01")
    bmc = {"node_power_watts": 11_000.0, "power_source": "bmc", "bmc": {"state": "up"}}
    hb = beat(watts=[650.0] * 8, cpu=None, **bmc)
    hb["inventory"]["max_draw_watts"] = 10_200.0  # its PSUs' rating, as its agent declares it
    response = agent.post(PATH, hb, format="json")
    assert response.json()["warnings"] == [
        "sensors.node_power_watts: 11000 W is more than the node can draw (its ceiling is 10200 W; up to 10710 W "
        "is believed); dropped"
    ]
    assert node().measured_watts == 8 * 650.0  # the cards' own readings
    clock()
    hb["sensors"]["node_power_watts"] = 10_100.0
    assert "warnings" not in agent.post(PATH, hb, format="json").json()
    assert node().measured_watts == 10_100.0 - 4600


def test_the_nodes_ceiling_set_by_the_facility_judges_its_readings(node_client, clock):
    from agents.services import node_max_draw_set

    facility_apply(text="facility:\n  node_watts: 4600\n")
    agent = node_client("gpu01")
    hb = beat(watts=[650.0] * 8, cpu=None, node_power_watts=11_000.0, power_source="bmc", bmc={"state": "up"})
    assert "warnings" not in agent.post(PATH, hb, format="json").json()  # no ceiling known: a loose bound
    node_max_draw_set(node_name="gpu01", watts=10_200)
    clock()
    response = agent.post(PATH, hb, format="json")  # the same heartbeat: judged by the new ceiling
    assert [e["kind"] for e in node().sensors["implausible"]] == ["node_power"]
    assert response.json()["warnings"][0].startswith("sensors.node_power_watts: 11000 W is more than the node can")


def test_a_bmc_answering_0_w_while_the_cards_draw_2400_w_is_dropped_the_cards_count(node_client, clock):
    facility_apply(text="facility:\n  node_watts: 4600\n")
    agent = node_client("gpu01")
    hb = beat(watts=[300.0] * 8, cpu=None, node_power_watts=0.0, power_source="bmc", bmc={"state": "up"})
    response = agent.post(PATH, hb, format="json")
    assert response.json()["warnings"] == [
        "sensors.node_power_watts: 0 W is less than half of what its cards alone read (2400 W): their readings "
        "count; dropped"
    ]
    assert node().measured_watts == 2400.0
    assert detail_power(node()) == "gpu+cpu"


def detail_power(stored: Node) -> str | None:
    from agents.services import power_source

    return power_source(stored.sensors)["power_source"]


# -- the measured peak needs two readings ------------------------------------------------------------------


def test_one_heartbeat_never_holds_the_measured_peak(node_client, clock):
    budget_set(domain="rack:r1", cap_watts=40_000)
    agent = node_client("gpu01")
    agent.post(PATH, beat(watts=[700.0] * 8, cpu=None), format="json")  # one burst
    assert node().measured_peak_watts is None
    for _ in range(5):
        clock()
        agent.post(PATH, beat(watts=[300.0] * 8, cpu=None), format="json")
    assert node().measured_peak_watts == 2400.0
    clock()
    agent.post(PATH, beat(watts=[690.0] * 8, cpu=None), format="json")  # a second burst: the peak holds it
    assert node().measured_peak_watts == 8 * 690.0


# -- inventory is a fact the control plane confirms ---------------------------------------------------------


def test_a_jump_from_8_cards_to_64_waits_for_an_operator(node_client, clock, api, viewer_api, viewer_page):
    budget_set(domain="rack:r1", cap_watts=14_400)
    agent = node_client("gpu01")
    agent.post(PATH, beat(), format="json")  # its first heartbeat: taken as it is
    assert GPU.objects.filter(node__name="gpu01", present=True).count() == 8
    clock()

    response = agent.post(PATH, beat(gpus=64, watts=[300.0] * 64), format="json")
    assert response.status_code == 200
    warnings = response.json()["warnings"]
    assert len(warnings) == 56
    assert warnings[0] == (
        "sensors.gpus[8].power_watts: 300 W from GPU 8, which the node's accepted inventory does not list; dropped"
    )
    stored = node()
    assert stored.is_ready()
    assert GPU.objects.filter(node=stored, present=True).count() == 8  # placement keeps its known cards
    assert stored.measured_watts == 8 * 300.0 + 220.0  # readings count only for the cards it had
    assert rack_use() == 350.0 + 8 * 300.0 + 220.0  # node_watts and its known cards' readings, not 19.2 kW
    operator = api
    shown = detail(operator)
    assert shown["gpus"]["total"] == 8
    assert shown["inventory_pending"]["known"] == 8 and len(shown["inventory_pending"]["gpus"]) == 64
    assert shown["inventory_pending"]["changes"][0] == "GPU 8: new, H100-SXM5-80GB (GPU-sim-gpu01-8)"
    waiting = (
        "its agent reports 64 GPUs where 8 are known; the change waits for an operator "
        "(llmgw ctl nodes accept-inventory gpu01)"
    )
    assert waiting in shown["warnings"]
    assert 'id="node-inventory-pending"' in viewer_page()
    assert "llmgw ctl nodes accept-inventory gpu01" in viewer_page()
    assert 'llmgw_node_inventory_pending{node="gpu01"} 64.0' in node_sensors_text()

    clock()  # the same heartbeat again (its fast path): still judged by the known cards
    agent.post(PATH, beat(gpus=64, watts=[300.0] * 64), format="json")
    assert node().measured_watts == 8 * 300.0 + 220.0

    viewer = viewer_api
    refused = viewer.post("/api/v1/nodes/gpu01/inventory/accept")
    assert refused.status_code == 403
    accepted = operator.post("/api/v1/nodes/gpu01/inventory/accept")
    assert accepted.status_code == 200
    assert accepted.json() == {"node": "gpu01", "gpus": 64}
    assert node().pending_inventory is None
    clock()
    response = agent.post(PATH, beat(gpus=64, watts=[300.0] * 64), format="json")
    assert "warnings" not in response.json()
    assert node().measured_watts == 64 * 300.0 + 220.0
    assert "llmgw_node_inventory_pending{" not in node_sensors_text()
    again = operator.post("/api/v1/nodes/gpu01/inventory/accept")
    assert again.status_code == 409
    assert again.json()["detail"] == "node gpu01: no change of its GPUs waits to be accepted"


def test_a_swapped_card_waits_too_and_its_reading_does_not_count(node_client, clock):
    agent = node_client("gpu01")
    agent.post(PATH, beat(), format="json")
    clock()
    hb = beat()
    hb["inventory"]["gpus"][5]["uuid"] = hb["sensors"]["gpus"][5]["uuid"] = "GPU-another"
    response = agent.post(PATH, hb, format="json")
    assert response.json()["warnings"] == [
        "sensors.gpus[5].power_watts: 300 W from GPU 5 (GPU-another), which the node's accepted inventory does not "
        "list; dropped"
    ]
    assert GPU.objects.get(node__name="gpu01", index=5).uuid == gpu_uuid("gpu01", 5)


def test_a_capped_cards_new_limit_is_no_inventory_change(node_client, clock):
    agent = node_client("gpu01")
    agent.post(PATH, beat(), format="json")
    clock()
    hb = beat()
    for card in hb["inventory"]["gpus"]:
        card["power_limit_watts"] = 450.0
    assert "warnings" not in agent.post(PATH, hb, format="json").json()
    assert node().pending_inventory is None
    assert set(GPU.objects.filter(node__name="gpu01").values_list("power_limit_watts", flat=True)) == {450.0}


def test_a_node_that_re_registers_is_taken_at_its_word(node_client, clock):
    node_client("gpu01").post(PATH, beat(), format="json")
    clock()
    node_client("gpu01").post(PATH, beat(gpus=4, watts=[300.0] * 4), format="json")  # a new token
    assert GPU.objects.filter(node__name="gpu01", present=True).count() == 4
    assert node().pending_inventory is None


def test_ctl_accepts_an_inventory_change(node_client, clock, capsys):
    from llmgw.ctl import main

    agent = node_client("gpu01")
    agent.post(PATH, beat(), format="json")
    clock()
    agent.post(PATH, beat(gpus=4, watts=[300.0] * 4), format="json")
    assert main(["nodes"]) == 0
    assert (
        "warning: gpu01: its agent reports 4 GPUs where 8 are known; the change waits for an operator "
        "(llmgw ctl nodes accept-inventory gpu01)"
    ) in capsys.readouterr().out.replace(";\n  ", "; ")  # a long warning breaks after its "; "
    assert main(["nodes", "accept-inventory", "gpu01"]) == 0
    assert capsys.readouterr().out == "gpu01: its inventory of 4 GPUs is accepted\n"
    assert GPU.objects.filter(node__name="gpu01", present=True).count() == 4


# -- the acceptance: ten minutes of one broken card -------------------------------------------------------


def test_a_node_with_one_broken_card_for_ten_minutes_stays_ready_its_draw_without_that_card(
    node_client, clock, api
):
    budget_set(domain="rack:r1", cap_watts=14_400)
    agent = node_client("gpu01")
    watts = [400.0] * 8
    watts[6] = SENTINEL_WATTS
    operator = api
    for _ in range(60):  # a heartbeat every 10 s, for 10 minutes of the moved clock
        clock(10)
        response = agent.post(PATH, beat(watts=watts), format="json")
        assert response.status_code == 200
        assert detail(operator)["state"] == "ready"
    stored = node()
    assert stored.measured_watts == stored.measured_peak_watts == 7 * 400.0 + 220.0
    assert [e["reading"] for e in stored.sensors["implausible"]] == ["sensors.gpus[6].power_watts"]
    assert GPU.objects.filter(node=stored, present=True).count() == 8
