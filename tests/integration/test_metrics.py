"""/metrics: node sensors as Prometheus series; absent readings and stale nodes have none; optional token."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import path
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents.metrics import metrics_view
from agents.models import Node
from agents.services import heartbeat_record
from agents.simulator.cluster import heartbeat_for
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db

# Served the way llmgw/urls.py is to route /metrics (with the token check), for these tests.
urlpatterns = [path("metrics", metrics_view)]

REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "power_brake")


def record(name, sensors, gpus=2):
    hb = heartbeat_for(node_spec(name, gpus=gpus))
    hb["sensors"] = sensors
    return heartbeat_record(node_name=name, heartbeat=hb)


def full_sensors():
    return {
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "temperature_celsius": 61.0, "memory_temperature_celsius": 66.0,
             "power_watts": 512.5, "power_limit_watts": 700.0, "throttle_reasons": ["sw_power_cap"]},
            {"index": 1, "uuid": "GPU-b", "temperature_celsius": 33.0, "memory_temperature_celsius": 35.0,
             "power_watts": 71.0, "power_limit_watts": 700.0, "throttle_reasons": []},
        ],
        "cpu_temperature_celsius": 55.0,
        "cpu_power_watts": 180.0,
        "inlet_temperature_celsius": 23.5,
    }


def llmgw_series(client, **headers):
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if sample.name.startswith("llmgw_"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def gpu_key(name, node, index, uuid, **extra):
    return (name, tuple(sorted({"node": node, "gpu": str(index), "uuid": uuid, **extra}.items())))


def test_a_node_with_every_sensor_has_every_series(client):
    record("gpu01", full_sensors())
    expected = {}
    for index, uuid, temp, mem, watts, reasons in ((0, "GPU-a", 61.0, 66.0, 512.5, {"sw_power_cap"}),
                                                   (1, "GPU-b", 33.0, 35.0, 71.0, set())):
        expected[gpu_key("llmgw_gpu_temperature_celsius", "gpu01", index, uuid)] = temp
        expected[gpu_key("llmgw_gpu_memory_temperature_celsius", "gpu01", index, uuid)] = mem
        expected[gpu_key("llmgw_gpu_power_watts", "gpu01", index, uuid)] = watts
        expected[gpu_key("llmgw_gpu_power_limit_watts", "gpu01", index, uuid)] = 700.0
        for reason in REASONS:
            key = gpu_key("llmgw_gpu_throttled", "gpu01", index, uuid, reason=reason)
            expected[key] = 1.0 if reason in reasons else 0.0
    expected[("llmgw_node_cpu_temperature_celsius", (("node", "gpu01"),))] = 55.0
    expected[("llmgw_node_cpu_power_watts", (("node", "gpu01"),))] = 180.0
    expected[("llmgw_node_inlet_temperature_celsius", (("node", "gpu01"),))] = 23.5
    assert llmgw_series(client) == expected


def test_an_absent_reading_is_an_absent_series_not_zero(client):
    record("gpu01", {
        "gpus": [{"index": 0, "uuid": "GPU-a", "temperature_celsius": 40.0, "power_watts": 90.0}],
        "cpu_temperature_celsius": 50.0,
    })
    assert llmgw_series(client) == {
        gpu_key("llmgw_gpu_temperature_celsius", "gpu01", 0, "GPU-a"): 40.0,
        gpu_key("llmgw_gpu_power_watts", "gpu01", 0, "GPU-a"): 90.0,
        ("llmgw_node_cpu_temperature_celsius", (("node", "gpu01"),)): 50.0,
    }


def test_label_values_are_escaped_and_values_read_back_exactly(client):
    # The node sensors' series are written directly in the text format (agents.metrics): whatever a
    # stored document holds, Prometheus's parser reads back the labels and values it was given.
    record("gpu01", full_sensors())
    odd = 'GPU-"quoted"\\back\\slash\nnew line'
    Node.objects.filter(name="gpu01").update(sensors={
        "gpus": [{"index": 0, "uuid": odd, "temperature_celsius": 1e21, "power_watts": 0.1 + 0.2,
                  "power_limit_watts": -0.0, "memory_temperature_celsius": True}],
        "cpu_power_watts": 12,
    })
    assert llmgw_series(client) == {
        gpu_key("llmgw_gpu_temperature_celsius", "gpu01", 0, odd): 1e21,
        gpu_key("llmgw_gpu_power_watts", "gpu01", 0, odd): 0.1 + 0.2,
        gpu_key("llmgw_gpu_power_limit_watts", "gpu01", 0, odd): 0.0,
        ("llmgw_node_cpu_power_watts", (("node", "gpu01"),)): 12.0,
    }


def test_a_node_without_sensors_has_no_series(client):
    record("vm01", {}, gpus=0)
    assert llmgw_series(client) == {}


def test_a_not_ready_node_is_left_out(client):
    record("gpu01", full_sensors())
    record("gpu02", {"cpu_power_watts": 150.0})
    Node.objects.filter(name="gpu01").update(last_heartbeat_at=timezone.now() - timedelta(seconds=31))
    assert llmgw_series(client) == {("llmgw_node_cpu_power_watts", (("node", "gpu02"),)): 150.0}


@pytest.fixture(autouse=True)
def _a_viewer_scrapes(client, make_user):
    """Prometheus scrapes as a viewer; these tests log the client in as one."""
    user, _ = make_user("prometheus", "viewer")
    client.force_login(user)


@pytest.mark.urls("tests.integration.test_metrics")
def test_metrics_need_a_viewer_without_a_metrics_token(client, make_user, monkeypatch):
    from django.test import Client

    monkeypatch.delenv("LLMGW_METRICS_TOKEN", raising=False)
    record("gpu01", {"cpu_power_watts": 150.0})
    anonymous = Client()
    response = anonymous.get("/metrics")
    assert response.status_code == 401
    assert b"llmgw_" not in response.content
    _, key = make_user("scraper", "viewer")
    assert llmgw_series(anonymous, HTTP_AUTHORIZATION=f"Token {key}") == {
        ("llmgw_node_cpu_power_watts", (("node", "gpu01"),)): 150.0
    }
    assert anonymous.get("/metrics", HTTP_AUTHORIZATION="Token nope").status_code == 401


@pytest.mark.urls("tests.integration.test_metrics")
def test_a_metrics_token_is_required_when_set(client, monkeypatch):
    monkeypatch.setenv("LLMGW_METRICS_TOKEN", "s3cret-scrape")
    record("gpu01", {"cpu_power_watts": 150.0})
    from django.test import Client

    anonymous = Client()
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": "Token s3cret-scrape"}):
        response = anonymous.get("/metrics", **headers)
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert b"llmgw_" not in response.content
    assert llmgw_series(client, HTTP_AUTHORIZATION="Bearer s3cret-scrape") == {
        ("llmgw_node_cpu_power_watts", (("node", "gpu01"),)): 150.0
    }


def test_a_scrape_reads_the_nodes_in_one_query(client, django_assert_max_num_queries):
    for i in range(5):
        record(f"gpu{i:02}", full_sensors())
    from agents.metrics import node_sensors_text

    with django_assert_max_num_queries(1):
        text = node_sensors_text()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert len(samples) == 5 * (2 * 4 + 2 * 5 + 3)


@pytest.mark.urls("tests.integration.test_metrics")
def test_domain_power_and_holds_are_series(client, join_node):
    from facility.services import budget_set, hold_create

    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1")
    budget_set(domain="rack:r1", cap_watts=16000, other_watts=800)
    hold_create(domain="rack:r1", reason="PDU swap", drain=True)
    series = llmgw_series(client)
    rack = (("domain", "rack:r1"), ("level", "rack"))
    assert series[("llmgw_domain_power_budget_watts", rack)] == 16000
    assert series[("llmgw_domain_power_limit_watts", rack)] == 14400
    assert series[("llmgw_domain_use_watts", rack)] == 1500  # two idle nodes at 350 W and the rack's 800 W
    assert series[("llmgw_domain_reserved_watts", rack)] == 0
    assert ("llmgw_domain_measured_watts", rack) not in series  # nobody read anything: no series, not 0
    assert series[("llmgw_domain_held", rack)] == 2


def test_conditions_reading_ages_and_sources_are_series(client, join_node):
    from facility.evaluation import conditions_evaluate
    from facility.services import facility_apply, scenario_start

    join_node("gpu01", rack="r1")
    facility_apply(text="facility:\n  sources:\n    agents: false\n")
    scenario_start(
        data={"name": "hot", "tracks": [{"domains": "rack:r1", "signal": "cooling_alarm", "points": [[0, 1]]}]},
        started_at=timezone.now() - timedelta(minutes=1),
    )
    conditions_evaluate()
    series = llmgw_series(client)
    rack = (("domain", "rack:r1"), ("level", "rack"))
    assert series[("llmgw_domain_condition", (("condition", "hot"), *rack))] == 1
    assert series[("llmgw_domain_condition", (("condition", "ok"), *rack))] == 0
    assert 0 <= series[("llmgw_domain_reading_age_seconds", (*rack, ("signal", "cooling_alarm")))] < 60
    assert series[("llmgw_facility_source_up", (("source", "simulated"),))] == 1
    assert ("llmgw_facility_source_up", (("source", "agents"),)) not in series
