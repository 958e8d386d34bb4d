"""The heartbeat answer carries each node's wanted GPU capping, through Django and the fast lane alike."""

from __future__ import annotations

import time

import pytest

from agents import readings
from agents.models import Node
from agents.selectors import replica_tokens_per_second
from agents.services import node_token_create
from agents.simulator.nodes import SimNode
from tests.conftest import node_spec
from tests.integration.test_heartbeat_lane import post, spy_on_lane

pytestmark = pytest.mark.django_db(transaction=True)

CAP = {"lever": "power_limit", "all": {"power_limit_watts": 490.0}}
CLOCKS = {"lever": "locked_clocks", "gpus": [{"uuid": "GPU-sim-gpu01-0", "locked_clocks_mhz": [900, 1400]}]}


@pytest.fixture
def wanted():
    caps: dict[str, dict] = {}
    readings.register_capping_provider(lambda: dict(caps))
    yield caps
    readings.register_capping_provider(None)


def test_the_capping_answer_follows_the_provider_on_both_paths(wanted, monkeypatch):
    answered_here = spy_on_lane(monkeypatch)
    token = node_token_create(node_name="gpu01")
    node = SimNode(node_spec("gpu01", rack="r1", gpus=2))
    wanted["gpu01"] = CAP
    wanted["gpu02"] = CLOCKS  # another node's capping is not this one's
    status, answer = post(node.heartbeat(1.0), token)
    assert (status, answer["capping"]) == (200, CAP)
    node.take_answer(answer, 1.5)
    # The simulated GPUs now hold 490 W: the inventory changed, so the full path again.
    status, answer = post(node.heartbeat(2.0), token)
    assert answer["capping"] == CAP
    status, answer = post(node.heartbeat(3.0), token)
    assert answer["capping"] == CAP
    assert answered_here[-1] is True  # the fast lane answered with the capping too

    wanted["gpu01"] = CLOCKS
    readings.invalidate_assignments()  # what a decision's change does (placement_changed)
    status, answer = post(node.heartbeat(4.0), token)
    assert answer["capping"] == CLOCKS
    status, answer = post(node.heartbeat(5.0), token)
    assert answer["capping"] == CLOCKS
    assert answered_here[-1] is True

    del wanted["gpu01"]
    readings.invalidate_assignments()
    status, answer = post(node.heartbeat(6.0), token)
    assert "capping" not in answer
    status, answer = post(node.heartbeat(7.0), token)
    assert "capping" not in answer


def test_capping_sensors_and_tokens_per_second_are_stored():
    token = node_token_create(node_name="gpu01")
    node = SimNode(node_spec("gpu01", rack="r1", gpus=2), ready_delay=0)
    node.take_answer({"replicas": [{"id": 17, "gpus": [0, 1]}]}, now=0)
    node.heartbeat(0.5)
    body = node.heartbeat(1.0)
    body["sensors"]["gpus"][0]["capping"] = "not permitted"
    status, _ = post(body, token)
    assert status == 200
    deadline = time.monotonic() + 5
    while not (Node.objects.get(name="gpu01").sensors or {}).get("replicas"):
        assert time.monotonic() < deadline, "the readings were not written"
        time.sleep(0.05)
    sensors = Node.objects.get(name="gpu01").sensors
    assert sensors["gpus"][0]["capping"] == "not permitted"
    assert sensors["gpus"][0]["enforced_power_limit_watts"] == 700.0
    figures = replica_tokens_per_second()
    assert list(figures) == [17] and figures[17] == body["sensors"]["replicas"][0]["tokens_per_second"] > 0
    assert replica_tokens_per_second(node_names=["gpu02"]) == {}
