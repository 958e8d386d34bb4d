"""The heartbeat's fast lane in front of Django (agents.asgi): same answers, readings still stored."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator

from agents.models import Node
from agents.services import node_token_create
from agents.simulator.nodes import SimNode
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db(transaction=True)


def post(body: dict, token: str, content_type: bytes = b"application/json") -> tuple[int, dict]:
    from llmgw.asgi import application

    raw = json.dumps(body).encode()
    communicator = HttpCommunicator(
        application, "POST", "/api/v1/agents/heartbeat", body=raw,
        headers=[(b"authorization", f"Token {token}".encode()), (b"content-type", content_type),
                 (b"content-length", str(len(raw)).encode()), (b"host", b"127.0.0.1")],
    )
    response = async_to_sync(communicator.get_response)(timeout=10)
    return response["status"], json.loads(response["body"])


def spy_on_lane(monkeypatch) -> list[bool]:
    """A list that gets, per heartbeat, whether the fast lane answered it (True) or Django did."""
    from agents.asgi import HeartbeatFastLane

    answered_here: list[bool] = []
    original = HeartbeatFastLane.answer

    def spy(self, scope, body):
        result = original(self, scope, body)
        answered_here.append(result is not None)
        return result

    monkeypatch.setattr(HeartbeatFastLane, "answer", spy)
    return answered_here


def test_the_second_same_heartbeat_is_answered_by_the_lane_and_its_readings_stored(monkeypatch):
    answered_here = spy_on_lane(monkeypatch)
    token = node_token_create(node_name="gpu01")
    node = SimNode(node_spec("gpu01", rack="r1"))
    first = node.heartbeat(1.0)
    status, answer = post(first, token)
    assert (status, answer) == (200, {"node": "gpu01", "interval_seconds": 10, "replicas": []})
    assert answered_here == [False]  # a new node: Django's full path

    second = node.heartbeat(2.0)
    second["sensors"]["cpu_temperature_celsius"] = 71.5
    status, answer = post(second, token)
    assert (status, answer) == (200, {"node": "gpu01", "interval_seconds": 10, "replicas": []})
    assert answered_here == [False, True]
    # Written by the batch writer's thread, a moment later.
    deadline = time.monotonic() + 5
    while Node.objects.get(name="gpu01").sensors.get("cpu_temperature_celsius") != 71.5:
        assert time.monotonic() < deadline, "the fast lane's readings were not written"
        time.sleep(0.05)


def test_a_bad_heartbeat_is_refused_by_django_with_the_field_even_for_a_known_node():
    token = node_token_create(node_name="gpu01")
    node = SimNode(node_spec("gpu01", rack="r1"))
    assert post(node.heartbeat(1.0), token)[0] == 200
    bad = node.heartbeat(2.0)
    bad["sensors"]["cpu_power_watts"] = "-1"
    status, body = post(bad, token)
    assert status == 400
    assert body["detail"] == "sensors.cpu_power_watts: must be a number (W), not '-1'"


def test_a_heartbeat_that_gives_a_key_twice_is_refused_by_django_naming_it_even_for_a_known_node(monkeypatch):
    from llmgw.asgi import application

    answered_here = spy_on_lane(monkeypatch)
    token = node_token_create(node_name="gpu01")
    node = SimNode(node_spec("gpu01", rack="r1"))
    assert post(node.heartbeat(1.0), token)[0] == 200
    # The node's name twice: json would keep the second; neither the lane nor Django takes it.
    raw = json.dumps(node.heartbeat(2.0)).encode().replace(b'"node": "gpu01"', b'"node": "gpu01", "node": "gpu01"', 1)
    communicator = HttpCommunicator(
        application, "POST", "/api/v1/agents/heartbeat", body=raw,
        headers=[(b"authorization", f"Token {token}".encode()), (b"content-type", b"application/json"),
                 (b"content-length", str(len(raw)).encode()), (b"host", b"127.0.0.1")],
    )
    response = async_to_sync(communicator.get_response)(timeout=10)
    assert response["status"] == 400
    assert json.loads(response["body"])["detail"] == "JSON parse error - 'node' is given twice in one object"
    assert answered_here == [False, False]


def test_a_heartbeat_not_sent_as_json_is_refused_as_django_refuses_it(monkeypatch):
    answered_here = spy_on_lane(monkeypatch)
    token = node_token_create(node_name="gpu01")
    node = SimNode(node_spec("gpu01", rack="r1"))
    assert post(node.heartbeat(1.0), token)[0] == 200
    assert post(node.heartbeat(2.0), token, content_type=b"text/plain")[0] == 415
    assert post(node.heartbeat(3.0), token, content_type=b"Application/JSON; charset=utf-8")[0] == 200
    assert answered_here == [False, False, True]


def test_another_nodes_name_with_a_known_token_is_refused():
    token = node_token_create(node_name="gpu01")
    node = SimNode(node_spec("gpu01", rack="r1"))
    assert post(node.heartbeat(1.0), token)[0] == 200
    other = SimNode(node_spec("gpu02", rack="r1")).heartbeat(2.0)
    status, body = post(other, token)
    assert status == 403
    assert not Node.objects.filter(name="gpu02").exists()


def test_a_process_that_learned_the_running_nodes_answers_their_first_heartbeat_in_the_lane(monkeypatch):
    from datetime import timedelta

    from agents import readings
    from agents.asgi import learn_running_nodes
    from agents.authentication import forget_node_tokens

    answered_here = spy_on_lane(monkeypatch)
    tokens = {name: node_token_create(node_name=name) for name in ("gpu01", "gpu02")}
    nodes = {name: SimNode(node_spec(name, rack="r1")) for name in tokens}
    for name, node in nodes.items():
        assert post(node.heartbeat(1.0), tokens[name])[0] == 200  # joined through Django
    # gpu02 went quiet past its ready window; then a new process starts, knowing nothing of either.
    Node.objects.filter(name="gpu02").update(last_heartbeat_at=Node.objects.get(name="gpu02").last_heartbeat_at
                                             - timedelta(seconds=60))
    readings.forget()
    forget_node_tokens()
    learn_running_nodes()
    readings.assignments("gpu01")  # the map fresh, as the served process's refresher keeps it

    second = nodes["gpu01"].heartbeat(2.0)
    second["sensors"]["cpu_temperature_celsius"] = 64.5
    assert post(second, tokens["gpu01"]) == (200, {"node": "gpu01", "interval_seconds": 10, "replicas": []})
    assert post(nodes["gpu02"].heartbeat(2.0), tokens["gpu02"])[0] == 200
    assert answered_here == [False, False, True, False]  # gpu02 comes back through Django
    deadline = time.monotonic() + 5  # written by the batch writer's thread, a moment later
    while Node.objects.get(name="gpu01").sensors.get("cpu_temperature_celsius") != 64.5:
        assert time.monotonic() < deadline, "the fast lane's readings were not written"
        time.sleep(0.05)


def test_a_known_node_back_from_quiet_is_answered_in_the_lane_and_placement_hears_it_came_back(monkeypatch):
    """A heartbeat that waited past its node's ready window (a queue under load, a pause) is answered in
    the lane like any other; the batch write finds the stored heartbeat too old and says the node came
    back, as Django's full path would. (Sending such nodes through Django fed an overload: each one
    slower, so more waited past their windows.)"""
    from datetime import timedelta

    from agents import readings, signals

    answered_here = spy_on_lane(monkeypatch)
    heard: list[tuple[tuple[str, ...], bool]] = []

    def receiver(*, node_names, heartbeat=False, **_):
        heard.append((tuple(node_names), heartbeat))

    signals.nodes_changed.connect(receiver, dispatch_uid="test-came-back")
    try:
        tokens = {name: node_token_create(node_name=name) for name in ("gpu01", "gpu02")}
        nodes = {name: SimNode(node_spec(name, rack="r1")) for name in tokens}
        for name, node in nodes.items():
            assert post(node.heartbeat(1.0), tokens[name])[0] == 200  # joined through Django
        readings.assignments("gpu01")  # the map fresh, as the served process's refresher keeps it
        # gpu02's last heartbeat stored a minute ago (its window is 30 s); gpu01's is fresh.
        Node.objects.filter(name="gpu02").update(
            last_heartbeat_at=Node.objects.get(name="gpu02").last_heartbeat_at - timedelta(seconds=60)
        )
        heard.clear()

        for name in ("gpu01", "gpu02"):
            assert post(nodes[name].heartbeat(2.0), tokens[name]) == (
                200, {"node": name, "interval_seconds": 10, "replicas": []}
            )
        assert answered_here == [False, False, True, True]
        deadline = time.monotonic() + 5  # the batch writer's thread, a moment later
        while not heard:
            assert time.monotonic() < deadline, "the batch did not say gpu02 came back"
            time.sleep(0.05)
        assert heard == [(("gpu02",), True)]  # gpu01 never left: nothing to say of it
        assert Node.objects.get(name="gpu02").is_ready(timezone_now())
    finally:
        signals.nodes_changed.disconnect(dispatch_uid="test-came-back")


def timezone_now():
    from django.utils import timezone

    return timezone.now()
