"""The heartbeat API: a node's token writes that node only; bad heartbeats are refused whole."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.models import GPU, Node
from agents.simulator.cluster import heartbeat_for
from facility.nodes import node_rows
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db


def beat(name="gpu01", **kw):
    hb = heartbeat_for(node_spec(name, rack="r1", **kw))
    hb["sensors"] = {
        "gpus": [
            {"index": i, "temperature_celsius": 50.0 + i, "power_watts": 300.0, "power_limit_watts": 700.0,
             "throttle_reasons": []}
            for i in range(8)
        ],
        "cpu_temperature_celsius": 61.5,
        "cpu_power_watts": 220.0,
    }
    return hb


def test_a_heartbeat_creates_the_node_and_answers_its_replicas(node_client):
    client = node_client("gpu01")
    response = client.post("/api/v1/agents/heartbeat", beat(), format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"node": "gpu01", "interval_seconds": 10, "replicas": []}
    node = Node.objects.get(name="gpu01")
    assert node.gpus.count() == 8
    assert node.measured_watts == 8 * 300 + 220
    assert node.labels["llmgw.io/rack"] == "r1"
    assert node.sensors["cpu_temperature_celsius"] == 61.5


def test_a_token_writes_only_its_own_node(node_client):
    client = node_client("gpu01")
    response = client.post("/api/v1/agents/heartbeat", beat("gpu02"), format="json")
    assert response.status_code == 403
    assert response.json()["detail"] == "node: this token belongs to 'gpu01'; it cannot write 'gpu02'"
    assert not Node.objects.filter(name="gpu02").exists()


def test_user_tokens_cannot_post_heartbeats(api):
    assert api.post("/api/v1/agents/heartbeat", beat(), format="json").status_code == 401


def test_an_unknown_token_is_refused(anon_api):
    anon_api.credentials(HTTP_AUTHORIZATION="Token node_nope")
    response = anon_api.post("/api/v1/agents/heartbeat", beat(), format="json")
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("mutate", "warning"),
    [
        (lambda hb: hb["sensors"]["gpus"][0].__setitem__("power_watts", -5),
         "sensors.gpus[0].power_watts: -5 W is outside what any sensor reads (0 to 5000 W); dropped"),
        (lambda hb: hb["sensors"]["gpus"][0].__setitem__("power_watts", 10_000_000),
         "sensors.gpus[0].power_watts: 10,000,000 W is outside what any sensor reads (0 to 5000 W); dropped"),
        (lambda hb: hb["sensors"]["gpus"][0].__setitem__("slowdown_temperature_celsius", 400),
         "sensors.gpus[0].slowdown_temperature_celsius: 400 °C is outside what any sensor reads (-40 to 150 °C); "
         "dropped"),
        (lambda hb: hb["sensors"].__setitem__("cpu_temperature_celsius", 900),
         "sensors.cpu_temperature_celsius: 900 °C is outside what any sensor reads (-40 to 150 °C); dropped"),
    ],
)
def test_a_reading_no_sensor_gives_is_dropped_naming_the_field_the_rest_stored(node_client, mutate, warning):
    client = node_client("gpu01")
    assert client.post("/api/v1/agents/heartbeat", beat(), format="json").status_code == 200
    odd = beat()
    odd["labels"]["team"] = "red"
    mutate(odd)
    response = client.post("/api/v1/agents/heartbeat", odd, format="json")
    assert response.status_code == 200
    assert response.json()["warnings"] == [warning]
    node = Node.objects.get(name="gpu01")
    assert node.agent_labels["team"] == "red"
    assert [entry["reading"] for entry in node.sensors["implausible"]] == [warning.partition(":")[0]]


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [
        (lambda hb: hb["sensors"]["gpus"][2].__setitem__("throttle_reasons", ["too_hot"]),
         "sensors.gpus[2].throttle_reasons: unknown reason 'too_hot'; reasons are hw_slowdown, hw_thermal, "
         "power_brake, sw_power_cap, sw_thermal"),
        (lambda hb: hb["sensors"].__setitem__("cpu_power_watts", "220"),
         "sensors.cpu_power_watts: must be a number (W), not '220'"),
        (lambda hb: hb["inventory"]["gpus"][1].__setitem__("index", 0),
         "inventory.gpus[1].index: two GPUs with index 0"),
        (lambda hb: hb["sensors"]["gpus"][1].__setitem__("index", 0),
         "sensors.gpus[1].index: two GPUs with index 0"),
        (lambda hb: hb["labels"].__setitem__("llmgw.io/rak", "r1"),
         "labels: unknown label key 'llmgw.io/rak': the llmgw.io/ keys are llmgw.io/site, llmgw.io/room, "
         "llmgw.io/row, llmgw.io/rack, llmgw.io/pdu, llmgw.io/leg"),
        (lambda hb: hb.__setitem__("interval_seconds", 60),
         "interval_seconds: must be between 0.1 and 10 seconds, got 60"),
        (lambda hb: hb.__setitem__("replicas", [{"id": 1, "state": "sleeping"}]),
         "replicas[0].state: unknown state 'sleeping'; states are failed, ready, starting, stopping"),
        (lambda hb: hb["sensors"].__setitem__("fan_rpm", 3000),
         "sensors.fan_rpm: unknown field; sensors takes bmc, cpu_power_watts, cpu_temperature_celsius, gpus, "
         "inlet_temperature_celsius, node_power_watts, power_source, replicas"),
    ],
)
def test_a_bad_heartbeat_is_refused_naming_the_field_and_nothing_stored(node_client, mutate, detail):
    client = node_client("gpu01")
    assert client.post("/api/v1/agents/heartbeat", beat(), format="json").status_code == 200
    before = Node.objects.get(name="gpu01").sensors
    bad = beat()
    bad["sensors"]["cpu_temperature_celsius"] = 70.0
    mutate(bad)
    response = client.post("/api/v1/agents/heartbeat", bad, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["detail"] == detail
    assert detail.startswith(body["field"] + ": ")
    assert Node.objects.get(name="gpu01").sensors == before


def test_a_repeated_heartbeat_takes_the_fast_path_and_still_updates_readings(node_client, django_assert_max_num_queries):
    client = node_client("gpu01")
    client.post("/api/v1/agents/heartbeat", beat(), format="json")
    hb = beat()
    hb["sensors"]["cpu_temperature_celsius"] = 77.0
    # The token is cached: one UPDATE in a savepoint (two statements) with its SET LOCAL (the batch's
    # commit waits for no WAL flush), and the measured window's setting (read at most every 10 s; each
    # test starts without it).
    with django_assert_max_num_queries(5):
        response = client.post("/api/v1/agents/heartbeat", hb, format="json")
    assert response.status_code == 200
    assert Node.objects.get(name="gpu01").sensors["cpu_temperature_celsius"] == 77.0


def test_a_changed_inventory_takes_the_full_path(node_client):
    client = node_client("gpu01")
    client.post("/api/v1/agents/heartbeat", beat(), format="json")
    hb = beat()
    hb["inventory"]["gpus"][3]["power_limit_watts"] = 500.0
    client.post("/api/v1/agents/heartbeat", hb, format="json")
    assert GPU.objects.get(node__name="gpu01", index=3).power_limit_watts == 500.0


def test_nan_is_refused(node_client):
    client = node_client("gpu01")
    raw = '{"node": "gpu01", "sensors": {"cpu_power_watts": NaN}}'
    response = client.post("/api/v1/agents/heartbeat", raw, content_type="application/json")
    assert response.status_code == 400
    assert not Node.objects.filter(name="gpu01").exists()


def test_an_oversized_heartbeat_is_refused(node_client, settings):
    settings.LLMGW_HEARTBEAT_MAX_BYTES = 2000
    hb = beat()
    hb["labels"]["note"] = "x" * 200
    hb["labels"].update({f"k{i}": "v" * 100 for i in range(30)})
    response = node_client("gpu01").post("/api/v1/agents/heartbeat", hb, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].endswith("-byte limit")
    assert response.json()["field"] == "heartbeat"


def test_null_readings_are_absent_not_zero(node_client):
    hb = beat()
    hb["sensors"]["gpus"][0]["memory_temperature_celsius"] = None
    hb["sensors"]["inlet_temperature_celsius"] = None
    assert node_client("gpu01").post("/api/v1/agents/heartbeat", hb, format="json").status_code == 200
    sensors = Node.objects.get(name="gpu01").sensors
    assert "inlet_temperature_celsius" not in sensors
    assert "memory_temperature_celsius" not in sensors["gpus"][0]


def test_three_missed_intervals_make_a_node_not_ready(node_client):
    node_client("gpu01").post("/api/v1/agents/heartbeat", beat(), format="json")
    assert [r.state for r in node_rows()] == ["ready"]
    Node.objects.update(last_heartbeat_at=timezone.now() - timedelta(seconds=29))
    assert [r.state for r in node_rows()] == ["ready"]
    Node.objects.update(last_heartbeat_at=timezone.now() - timedelta(seconds=31))
    assert [r.state for r in node_rows()] == ["not-ready"]


def test_a_gpu_that_stops_reporting_is_kept_absent_once_an_operator_accepts_it(node_client):
    from agents.services import node_inventory_accept

    client = node_client("gpu01")
    client.post("/api/v1/agents/heartbeat", beat(), format="json")
    hb = copy.deepcopy(beat())
    hb["inventory"]["gpus"] = hb["inventory"]["gpus"][:7]
    client.post("/api/v1/agents/heartbeat", hb, format="json")
    assert not GPU.objects.filter(present=False).exists()  # a change of its GPUs waits for an operator
    node_inventory_accept(node_name="gpu01")
    assert list(GPU.objects.filter(present=False).values_list("index", flat=True)) == [7]
    assert node_rows()[0].gpus_total == 7
