"""The heartbeat answer carries each node's wanted GPU capping, through Django and the fast lane alike."""

from __future__ import annotations

import time

import pytest

from agents import readings
from agents.models import Node
from agents.selectors import replica_tokens_per_second
from agents.services import node_token_create
from agents.simulator.nodes import SimNode
from facility.services import condition_override_set, facility_apply
from placement.capping import capping_blocks, capping_run
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
    reported = body["sensors"]["replicas"][0]["tokens_per_second"]
    assert figures == {17: {Node.objects.get(name="gpu01").pk: reported}} and reported > 0
    assert replica_tokens_per_second(node_names=["gpu02"]) == {}


def test_simulated_cards_are_locked_at_the_share_of_their_own_top_clock_through_the_api(monkeypatch):
    monkeypatch.setattr(readings, "_capping_provider", capping_blocks)  # what placement registers
    nodes = {
        "a100": SimNode(node_spec("a100", rack="r1", gpus=2, gpu_model="A100-SXM4-80GB", gpu_power_limit_watts=400,
                                  gpu_max_sm_clock_mhz=1410)),
        "l40s": SimNode(node_spec("l40s", rack="r1", gpus=2, gpu_model="L40S", gpu_power_limit_watts=350,
                                  gpu_max_sm_clock_mhz=2520)),
        "old": SimNode(node_spec("old", rack="r1", gpus=2)),
    }
    tokens = {name: node_token_create(node_name=name) for name in nodes}

    def beat(name: str, now: float) -> dict:
        body = nodes[name].heartbeat(now)
        if name == "old":  # an agent too old to report its cards' top clock
            for gpu in body["sensors"]["gpus"]:
                del gpu["max_sm_clock_mhz"]
        status, answer = post(body, tokens[name])
        assert status == 200, answer
        nodes[name].take_answer(answer, now)
        return answer

    for name in nodes:
        beat(name, 1.0)
    assert Node.objects.get(name="l40s").sensors["gpus"][0]["max_sm_clock_mhz"] == 2520
    facility_apply(text="facility:\n  conditions: {mode: enforce}\n  sources: {agents: false}\n"
                        "  capping: {enabled: true, lever: locked_clocks}\n")
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC 2 down", seconds=7200)
    capping_run()
    capping_run()  # 80 % of the top
    readings.invalidate_assignments()
    wanted = {name: beat(name, 2.0)["capping"] for name in nodes}
    assert wanted == {
        "a100": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [210, 1128]}},
        "l40s": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [210, 2016]}},
        "old": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [210, 1584]}},
    }
    for name, locked in (("a100", [210, 1128]), ("l40s", [210, 2016]), ("old", [210, 1584])):
        body = nodes[name].heartbeat(3.0)
        assert [g["locked_clocks_mhz"] for g in body["sensors"]["gpus"]] == [locked, locked]
