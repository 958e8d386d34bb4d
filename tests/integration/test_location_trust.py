"""What a node's token may say of its node: with facility.location_from: store, not where it is; and no
draw beyond what its inventory can (readings past it are dropped, named, and flagged on the node)."""

from __future__ import annotations

import json
import logging
import textwrap
import time

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator

from agents.models import Node, NodeDomain
from agents.services import implausible_lines, labels_set, node_token_create
from agents.simulator.cluster import heartbeat_for
from facility.services import budget_set, facility_apply
from llmgw.errors import InvalidInput
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db

PATH = "/api/v1/agents/heartbeat"


def beat(name: str = "gpu01", *, rack: str | None = "r1", gpus: int = 8, sensors: dict | None = None, **kw) -> dict:
    """An honest 8 × H100 node (700 W limits) in rack r1, unless told, with readings it can draw."""
    hb = heartbeat_for(node_spec(name, rack=rack, gpus=gpus, **kw))
    hb["sensors"] = sensors if sensors is not None else {
        "gpus": [{"index": i, "temperature_celsius": 60.0, "power_watts": 400.0} for i in range(gpus)],
        "cpu_power_watts": 220.0,
    }
    return hb


def apply(location_from: str) -> dict:
    text = "facility:\n  node_watts: 350\n  location_from: " + location_from + "\n"
    return facility_apply(text=text)


def domains(name: str = "gpu01") -> list[str]:
    return sorted(NodeDomain.objects.filter(node__name=name).values_list("domain", flat=True))


def rack_use(rack: str = "r1") -> float:
    from facility.selectors import domain_figures

    return domain_figures(domain=f"rack:{rack}").use_watts


# -- location: whose word it is ----------------------------------------------------------------------------


def test_by_default_the_agent_says_where_its_node_is(node_client):
    client = node_client("gpu01")
    assert client.post(PATH, beat(), format="json").status_code == 200
    assert client.post(PATH, beat(rack="r9"), format="json").status_code == 200
    assert domains() == ["rack:r9"]  # today's behaviour: the agent moved its node
    assert Node.objects.get(name="gpu01").location_conflicts == []


def test_with_location_from_store_a_node_token_cannot_move_its_node_into_another_rack(node_client, caplog):
    apply("store")
    labels_set(node_name="gpu01", changes={"llmgw.io/rack": "r1"}, set_by="dcim")
    client = node_client("gpu01")
    assert client.post(PATH, beat(rack="r1"), format="json").status_code == 200
    assert domains() == ["rack:r1"]
    assert Node.objects.get(name="gpu01").location_conflicts == []

    # The attack: the node's token labels its node into rack r9, and a PDU of r9.
    with caplog.at_level(logging.WARNING, logger="agents.services"):
        for _ in range(3):
            response = client.post(PATH, beat(rack="r9", pdu="r9-a"), format="json")
            assert response.status_code == 200
    node = Node.objects.get(name="gpu01")
    assert domains() == ["rack:r1"]
    assert node.labels == {"llmgw.io/rack": "r1"}
    assert node.agent_labels == {"llmgw.io/rack": "r9", "llmgw.io/pdu": "r9-a"}  # kept, as the agent said it
    assert node.location_conflicts == [
        "llmgw.io/rack: the agent says r9, the store says r1; the agent's value is ignored (location_from: rack: store)",
        "llmgw.io/pdu: the agent says r9-a, the store has no pdu; the agent's value is ignored "
        "(location_from: pdu: store)",
    ]
    logged = [r.getMessage() for r in caplog.records if "the agent says r9" in r.getMessage()]
    assert len(logged) == 1  # once per change, not once per heartbeat


def test_the_conflict_is_shown_on_the_node_page_in_the_api_and_the_list(node_client, client, make_user, api):
    from facility.nodes import node_rows

    apply("{rack: store}")
    labels_set(node_name="gpu01", changes={"llmgw.io/rack": "r1"})
    node_client("gpu01").post(PATH, beat(rack="r9", labels={"llmgw.io/site": "sto1"}), format="json")
    assert domains() == ["rack:r1", "site:sto1"]  # the rack is the store's, the site still the agent's

    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    page = client.get("/nodes/gpu01/").content.decode()
    assert 'id="location-conflicts"' in page
    assert "llmgw.io/rack: the agent says r9, the store says r1; the agent&#x27;s value is ignored" in page

    detail = api.get("/api/v1/nodes/gpu01").json()
    assert detail["location_conflicts"] == [
        "llmgw.io/rack: the agent says r9, the store says r1; the agent's value is ignored (location_from: rack: store)"
    ]
    rack = next(label for label in detail["labels"] if label["key"] == "llmgw.io/rack")
    assert (rack["value"], rack["source"], rack["agent_value"]) == ("r1", "store", "r9")
    [row] = node_rows()
    assert row.as_dict()["warnings"] == detail["location_conflicts"]


def test_site_is_still_the_agents_when_only_the_rack_is_the_stores(node_client):
    apply("{rack: store}")
    node_client("gpu01").post(PATH, beat(rack="r9", labels={"llmgw.io/site": "sto1"}), format="json")
    assert domains() == ["site:sto1"]  # the agent's rack is ignored; the store has none
    assert Node.objects.get(name="gpu01").labels == {"llmgw.io/site": "sto1"}


def test_an_ignored_label_shows_as_ignored_among_the_sources(node_client, api):
    apply("store")
    node_client("gpu01").post(PATH, beat(rack="r9"), format="json")
    labels = api.get("/api/v1/nodes/gpu01").json()["labels"]
    assert labels == [{"key": "llmgw.io/rack", "value": "r9", "source": "ignored", "agent_value": "r9"}]
    assert domains() == []


def test_applying_location_from_moves_the_nodes_that_joined_before_and_back(node_client):
    node_client("gpu01").post(PATH, beat(rack="r9"), format="json")
    node_client("gpu02").post(PATH, beat("gpu02", rack="r1"), format="json")
    labels_set(node_name="gpu01", changes={"llmgw.io/site": "sto1"})
    labels_set(node_name="gpu02", changes={"llmgw.io/rack": "r1"})
    apply("{rack: store}")
    assert domains("gpu01") == ["site:sto1"]
    assert domains("gpu02") == ["rack:r1"]
    assert len(Node.objects.get(name="gpu01").location_conflicts) == 1
    assert Node.objects.get(name="gpu02").location_conflicts == []
    apply("agents")
    assert domains("gpu01") == ["rack:r9", "site:sto1"]
    assert Node.objects.get(name="gpu01").location_conflicts == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("shop", "server.yaml line 3: facility.location_from: agents, store, or a mapping of level to agents or "
                 "store; not 'shop'"),
        ("\n    rak: store", "server.yaml line 4: facility.location_from.rak: unknown level; levels are site, room, "
                            "row, rack, pdu, leg"),
        ("\n    site: agents\n    rack: stor", "server.yaml line 5: facility.location_from.rack: agents or store, "
                                               "not 'stor'"),
    ],
)
def test_a_bad_location_from_is_refused_naming_line_and_field(value, message):
    from facility.models import FacilitySettings

    with pytest.raises(InvalidInput) as exc:
        facility_apply(text=f"facility:\n  node_watts: 300\n  location_from: {value}\n")
    assert exc.value.message == message
    assert FacilitySettings.load().node_watts == 350  # nothing of the file applied


# -- readings: no more than the inventory can draw ---------------------------------------------------------


def attack_sensors() -> dict:
    """64 GPUs × 5 kW (each within the protocol's bounds) from a node of eight 700 W cards."""
    return {"gpus": [{"index": i, "power_watts": 5000.0} for i in range(64)], "cpu_power_watts": 220.0}


def test_64_gpus_at_5_kw_are_dropped_naming_the_field_and_the_racks_use_is_unchanged(node_client):
    budget_set(domain="rack:r1", cap_watts=14400)
    client = node_client("gpu01")
    for _ in range(2):  # two honest readings: the measured peak
        assert client.post(PATH, beat(), format="json").status_code == 200
    before = rack_use()

    hb = beat(sensors=attack_sensors(), labels={"team": "red"})
    hb["replicas"] = []
    response = client.post(PATH, hb, format="json")
    assert response.status_code == 200
    warnings = response.json()["warnings"]
    assert len(warnings) == 64
    assert warnings[0] == (
        "sensors.gpus[0].power_watts: 5000 W is more than GPU 0 can draw (its maximum is 700 W; up to 795 W is "
        "believed); dropped"
    )
    assert warnings[8] == "sensors.gpus[8].power_watts: 5000 W from GPU 8, which the inventory does not list; dropped"
    node = Node.objects.get(name="gpu01")
    assert node.agent_labels["team"] == "red"  # the rest of the heartbeat is taken
    assert implausible_lines(node.sensors) == warnings  # the node is flagged
    assert node.measured_watts == 220.0  # only the CPU reading is believed
    assert rack_use() == before
    assert rack_use() < 14400


@pytest.mark.django_db(transaction=True)
def test_the_fast_lane_drops_them_too(monkeypatch):
    """The same check on the fast lane (agents.asgi), for a heartbeat that says nothing new but readings."""
    from agents.asgi import HeartbeatFastLane
    from llmgw.asgi import application

    token = node_token_create(node_name="gpu01")

    def post(body: dict) -> tuple[int, dict]:
        raw = json.dumps(body).encode()
        communicator = HttpCommunicator(
            application, "POST", PATH, body=raw,
            headers=[(b"authorization", f"Token {token}".encode()), (b"content-type", b"application/json"),
                     (b"content-length", str(len(raw)).encode()), (b"host", b"127.0.0.1")],
        )
        response = async_to_sync(communicator.get_response)(timeout=10)
        return response["status"], json.loads(response["body"])

    answered_here = []
    original = HeartbeatFastLane.answer

    def spy(self, scope, body):
        result = original(self, scope, body)
        answered_here.append(result is not None)
        return result

    monkeypatch.setattr(HeartbeatFastLane, "answer", spy)
    assert post(beat())[0] == 200
    status, answer = post(beat(sensors=attack_sensors()))
    assert answered_here == [False, True]
    assert status == 200 and len(answer["warnings"]) == 64
    deadline = time.monotonic() + 5
    while "implausible" not in Node.objects.get(name="gpu01").sensors:
        assert time.monotonic() < deadline, "the fast lane's readings were not written"
        time.sleep(0.05)
    node = Node.objects.get(name="gpu01")
    assert implausible_lines(node.sensors) == answer["warnings"]
    assert node.measured_watts == 220.0


def test_cpus_drawing_more_than_the_node_can_are_dropped(node_client):
    sensors = {"gpus": [{"index": i, "power_watts": 700.0} for i in range(8)], "cpu_power_watts": 19000.0}
    response = node_client("gpu01").post(PATH, beat(sensors=sensors), format="json")
    assert response.status_code == 200
    [warning] = response.json()["warnings"]
    assert warning == (
        "sensors.cpu_power_watts: 19000 W puts the node at 24600 W, more than it can draw (5600 W of its cards' "
        "maximums, 350 W of its own; up to 11925 W is believed); dropped"
    )
    assert Node.objects.get(name="gpu01").measured_watts == 5600.0


def test_the_flag_shows_on_the_page_and_in_metrics_and_clears_with_honest_readings(node_client, client, make_user):
    from agents.metrics import node_sensors_text

    agent = node_client("gpu01")
    agent.post(PATH, beat(sensors=attack_sensors()), format="json")
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    page = client.get("/nodes/gpu01/").content.decode()
    assert 'id="node-implausible"' in page
    assert "sensors.gpus[63].power_watts: 5000 W from GPU 63, which the inventory does not list; dropped" in page
    assert 'llmgw_node_implausible_readings{node="gpu01"} 64.0' in node_sensors_text()

    response = agent.post(PATH, beat(), format="json")
    assert "warnings" not in response.json()
    assert "implausible" not in Node.objects.get(name="gpu01").sensors
    assert "llmgw_node_implausible_readings{" not in node_sensors_text()
    assert 'id="node-implausible"' not in client.get("/nodes/gpu01/").content.decode()


def test_implausible_readings_are_logged_once_per_change(node_client, caplog, monkeypatch):
    from agents import readings

    monkeypatch.setattr(readings, "_implausible_fields", {})  # what this process logged in earlier tests
    agent = node_client("gpu01")
    with caplog.at_level(logging.INFO, logger="agents.readings"):
        for sensors in [attack_sensors(), attack_sensors(), None, None]:
            agent.post(PATH, beat(sensors=sensors), format="json")
    messages = [r.getMessage() for r in caplog.records if r.name == "agents.readings"]
    assert len(messages) == 2
    assert messages[0].startswith("node gpu01: implausible readings dropped: sensors.gpus[0].power_watts: 5000 W")
    assert messages[1] == "node gpu01: its readings are plausible again"


def test_a_lowered_node_watts_judges_the_next_heartbeat(node_client):
    agent = node_client("gpu01")
    cpu_only = {"gpus": [], "cpu_power_watts": 600.0}
    assert "warnings" not in agent.post(PATH, beat(gpus=0, sensors=cpu_only), format="json").json()
    facility_apply(text=textwrap.dedent("facility:\n  node_watts: 200\n"))  # up to 450 W is believed now
    assert len(agent.post(PATH, beat(gpus=0, sensors=cpu_only), format="json").json()["warnings"]) == 1
