"""Bad input never costs anyone else: heartbeats, bodies and console sockets refused cleanly, never a 5xx,
a hang, or another node's readings lost."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from agents import readings
from agents.models import Node
from agents.services import heartbeat_record, node_token_create
from agents.simulator.nodes import SimNode
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/api/v1/agents/heartbeat"


def lane(raw: bytes, token: str) -> tuple[int, dict]:
    """POST through the ASGI application: body bounds, the fast lane, then Django."""
    from llmgw.asgi import application

    communicator = HttpCommunicator(
        application, "POST", PATH, body=raw,
        headers=[(b"authorization", f"Token {token}".encode()), (b"content-type", b"application/json"),
                 (b"content-length", str(len(raw)).encode()), (b"host", b"127.0.0.1")],
    )
    response = async_to_sync(communicator.get_response)(timeout=10)
    return response["status"], json.loads(response["body"] or b"{}")


def django(raw: bytes, token: str) -> tuple[int, dict]:
    """POST to Django alone (the DRF view, no ASGI lane in front)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    response = client.post(PATH, raw, content_type="application/json")
    return response.status_code, response.json()


def joined(name: str) -> tuple[str, SimNode]:
    """A node with a token whose first heartbeat was stored: its next same heartbeat may take the lane."""
    token = node_token_create(node_name=name)
    node = SimNode(node_spec(name, rack="r1"))
    status, _ = lane(json.dumps(node.heartbeat(1.0)).encode(), token)
    assert status == 200
    return token, node


def with_replica(hb: dict, **fields) -> dict:
    hb["replicas"] = [{"id": 1, "state": "failed", **fields}]
    return hb


# Each: what it does to a heartbeat, and the field the refusal must name.
POISONS = [
    (lambda hb: hb["sensors"]["gpus"][0].__setitem__("uuid", "GPU-\x00"), "sensors.gpus[0].uuid"),
    (lambda hb: hb.__setitem__("agent_version", "1.0\x00"), "agent_version"),
    (lambda hb: hb["inventory"].__setitem__("hostname", "gpu01\x00"), "inventory.hostname"),
    (lambda hb: hb["labels"].__setitem__("note", "a\x00b"), "labels.note"),
    (lambda hb: hb["labels"].__setitem__("no\x00te", "x"), "labels"),
    (lambda hb: with_replica(hb, message="exit\x00ed"), "replicas[0].message"),
    (lambda hb: hb["sensors"]["gpus"][0].__setitem__("uuid", "GPU-\ud800"), "sensors.gpus[0].uuid"),
    (lambda hb: hb.__setitem__("agent_version", "\udfff"), "agent_version"),
    (lambda hb: hb["labels"].__setitem__("llmgw.io/rack", "r1-01\n"), "labels.llmgw.io/rack"),
    (lambda hb: hb["inventory"].__setitem__("memory_gib", 10**400), "inventory.memory_gib"),
    (lambda hb: hb.__setitem__("agent_version", "v" * 51), "agent_version"),
    (lambda hb: hb["inventory"].__setitem__("hostname", "h" * 254), "inventory.hostname"),
    (lambda hb: hb["inventory"]["gpus"][0].__setitem__("uuid", "u" * 101), "inventory.gpus[0].uuid"),
    (lambda hb: with_replica(hb, message="m" * 1001), "replicas[0].message"),
    (lambda hb: with_replica(hb, state=[]), "replicas[0].state"),
    (lambda hb: hb["sensors"]["gpus"][0].__setitem__("throttle_reasons", [{}]), "sensors.gpus[0].throttle_reasons"),
    (lambda hb: with_replica(hb, pid=10**30), "replicas[0].pid"),
]


@pytest.mark.parametrize("post", [lane, django], ids=["fast-lane", "django"])
@pytest.mark.parametrize(("poison", "field"), POISONS, ids=[f for _, f in POISONS])
def test_a_poisoned_heartbeat_is_refused_naming_the_field_and_nothing_is_stored(post, poison, field):
    token, node = joined("gpu01")
    before = Node.objects.get(name="gpu01").sensors
    hb = node.heartbeat(2.0)
    poison(hb)
    status, body = post(json.dumps(hb).encode(), token)
    assert status == 400, body
    assert body["field"] == field
    assert body["detail"].startswith(field + ": ")
    assert len(body["detail"]) < 400  # a refusal never echoes the input back whole
    assert Node.objects.get(name="gpu01").sensors == before


# A reading of hundreds of digits is no reading: dropped and named, the rest of the heartbeat stored.
POISONED_READINGS = [
    (lambda hb: hb["sensors"].__setitem__("cpu_temperature_celsius", 10**400), "sensors.cpu_temperature_celsius",
     "an integer of 401 digits °C is outside what any sensor reads (-40 to 150 °C)"),
    (lambda hb: hb["sensors"]["gpus"][0].__setitem__("power_watts", -(10**400)), "sensors.gpus[0].power_watts",
     "an integer of 401 digits W is outside what any sensor reads (0 to 5000 W)"),
]


@pytest.mark.parametrize("post", [lane, django], ids=["fast-lane", "django"])
@pytest.mark.parametrize(("poison", "field", "why"), POISONED_READINGS, ids=[f for _, f, _ in POISONED_READINGS])
def test_a_poisoned_reading_is_dropped_naming_the_field_the_heartbeat_stored(post, poison, field, why):
    token, node = joined("gpu01")
    hb = node.heartbeat(2.0)
    poison(hb)
    status, body = post(json.dumps(hb).encode(), token)
    assert status == 200, body
    assert body["warnings"] == [f"{field}: {why}; dropped"]
    deadline = time.monotonic() + 5
    while not Node.objects.get(name="gpu01").sensors.get("implausible"):  # the lane's batch is written apart
        assert time.monotonic() < deadline, "the readings were not written"
        time.sleep(0.05)
    assert Node.objects.get(name="gpu01").sensors["implausible"] == [
        {"reading": field, "value": None, "why": why, "kind": "out_of_bounds"}
    ]


@pytest.mark.parametrize("post", [lane, django], ids=["fast-lane", "django"])
@pytest.mark.parametrize(
    "raw",
    [
        b'{"node": "gpu01", "sensors": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        b"[" * 100_000,
        b'{"node": "gpu01", "labels": ' + b'{"a": ' * 65 + b"1" + b"}" * 66,
    ],
    ids=["1000-deep", "100000-open", "65-deep-objects"],
)
def test_deep_json_is_refused_before_parsing(post, raw):
    token, _ = joined("gpu01")
    status, body = post(raw, token)
    assert status == 400
    assert "nested deeper than 64" in body["detail"]


def test_json_64_deep_is_not_refused_for_its_depth():
    from llmgw.jsonguard import json_depth_exceeds

    assert not json_depth_exceeds(b"[" * 64 + b"]" * 64)
    assert json_depth_exceeds(b"[" * 65 + b"]" * 65)
    # Brackets inside strings, escaped quotes included, are not nesting.
    assert not json_depth_exceeds(json.dumps({"a": "[" * 500 + '\\"' + "{" * 500}))


# -- the batch writer ------------------------------------------------------------------------------------


class Unstorable:
    """A reading no database can store (not JSON): fails its row on every backend."""


@pytest.mark.parametrize(
    "poisoned_sensors",
    [{"gpus": [{"index": 0, "uuid": "GPU-\x00"}]}, {"cpu_temperature_celsius": Unstorable()}],
    ids=["nul-in-uuid", "not-json"],
)
def test_a_poisoned_row_in_a_readings_batch_costs_the_honest_node_nothing(monkeypatch, poisoned_sensors):
    from agents.simulator.cluster import heartbeat_for

    digests = {}
    for name in ("bad01", "good01"):
        hb = heartbeat_for(node_spec(name, rack="r1"))
        heartbeat_record(node_name=name, heartbeat=hb)
        from agents.services import report_digest

        digests[name] = report_digest(hb)
    monkeypatch.setattr(readings, "FLUSH_SECONDS", 3600)  # both rows wait in one batch
    now = Node.objects.get(name="good01").last_heartbeat_at
    assert readings.buffer_readings("bad01", digests["bad01"], at=now, sensors=poisoned_sensors, watts=1.0, interval=10)
    assert readings.buffer_readings(
        "good01", digests["good01"], at=now, sensors={"cpu_temperature_celsius": 55.5}, watts=2.0, interval=10
    )
    timer = readings._timer
    try:
        assert readings.flush() == 1
    finally:
        timer.cancel()
    assert Node.objects.get(name="good01").sensors == {"cpu_temperature_celsius": 55.5}
    assert Node.objects.get(name="good01").measured_watts == 2.0
    assert Node.objects.get(name="bad01").sensors == {}


def test_alternating_poisoned_and_honest_heartbeats_lose_no_honest_reading(monkeypatch):
    bad_token, bad = joined("bad01")
    good_token, good = joined("good01")
    monkeypatch.setattr(readings, "FLUSH_SECONDS", 3600)  # the test flushes, not the lane's timer
    for i in range(10):
        hb = bad.heartbeat(2.0 + i)
        hb["sensors"]["gpus"][0]["uuid"] = "GPU-\x00"
        assert lane(json.dumps(hb).encode(), bad_token)[0] == 400
        hb = good.heartbeat(2.0 + i)
        hb["sensors"]["cpu_temperature_celsius"] = 40.0 + i
        assert lane(json.dumps(hb).encode(), good_token)[0] == 200
        timer = readings._timer
        assert readings.flush() == 1  # what the lane's timer does a moment later
        timer.cancel()
        assert Node.objects.get(name="good01").sensors["cpu_temperature_celsius"] == 40.0 + i


# -- raw sockets: bodies too large, too slow -------------------------------------------------------------


def uvicorn_in_thread(**limits):
    """The real ASGI application in uvicorn, in a thread, on a free port of 127.0.0.1: yields its address."""
    import uvicorn

    from llmgw.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(application, lifespan="off", log_level="warning", **limits)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        assert thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield sock.getsockname()
    srv.should_exit = True
    thread.join(15)
    sock.close()


@pytest.fixture
def server():
    """The real ASGI application in uvicorn, in a thread, on a free port of 127.0.0.1."""
    yield from uvicorn_in_thread()


def raw_request(address, head: bytes, body: bytes = b"") -> bytes:
    """Send head and body in one write; return what the server answers (up to its close)."""
    with socket.create_connection(address, timeout=30) as conn:
        try:
            conn.sendall(head + body)
        except OSError:  # the server answered and closed while the body was still going out
            pass
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split()[1])


@pytest.mark.parametrize("size", [262_145, 300_000, 400_000])
def test_an_oversize_heartbeat_in_one_write_is_answered_413_at_once(server, size):
    body = b'{"node": "gpu01", "labels": {"x": "' + b"a" * (size - 38) + b'"}}'
    assert len(body) == size
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    answer = raw_request(server, head, body)
    assert status_of(answer) == 413
    assert b"262144-byte limit" in answer


def test_an_oversize_chunked_heartbeat_is_answered_413_once_the_limit_is_passed(server):
    body = b"a" * 300_000
    # With a token (unknown): a body from someone giving no credentials is not read at all (401).
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Authorization: Token unknown\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    answer = raw_request(server, head, chunked)
    assert status_of(answer) == 413


def test_a_stalled_body_is_answered_408(server, settings):
    settings.LLMGW_BODY_TIMEOUT_SECONDS = 0.5
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Authorization: Token unknown\r\nContent-Length: 1000\r\n\r\n").encode()
    answer = raw_request(server, head, b'{"node": "gp')  # then nothing more
    assert status_of(answer) == 408
    assert b"not received within 0.5 seconds" in answer


def test_a_body_from_someone_giving_no_credentials_is_answered_401_unread(server):
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n").encode()
    answer = raw_request(server, head, b'{"node": "gp')  # the rest never comes, and is never waited for
    assert status_of(answer) == 401
    assert b"connection: close" in answer.lower()


def test_an_oversize_body_elsewhere_is_413_too(server):
    head = (b"POST /api/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000000\r\n\r\n")
    assert status_of(raw_request(server, head, b"{")) == 413


# -- console sockets -------------------------------------------------------------------------------------


def socket_to(path: str, user) -> WebsocketCommunicator:
    from channels.routing import URLRouter

    from llmgw.routing import websocket_urlpatterns

    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    return communicator


@pytest.mark.parametrize(
    "name", ["gp%C3%BC01", "gpu%2001", "gpu%2201", "a" * 300], ids=["non-ascii", "space", "quote", "300-chars"]
)
def test_a_node_socket_for_a_name_no_node_can_have_is_refused(make_user, name):
    user, _ = make_user("viewer1", "viewer")

    async def run():
        communicator = socket_to(f"/ws/nodes/{name}/", user)
        connected, code = await communicator.connect()
        await communicator.disconnect()
        return connected, code

    assert async_to_sync(run)() == (False, 4404)


@pytest.mark.parametrize("path", ["/ws/zzz", "/ws/nodes", "/ws/nodes/a/b/", "/"])
def test_a_socket_path_the_console_has_no_socket_for_is_refused(make_user, path):
    user, _ = make_user("viewer1", "viewer")

    async def run():
        communicator = socket_to(path, user)
        connected, code = await communicator.connect()
        await communicator.disconnect()
        return connected, code

    assert async_to_sync(run)() == (False, 4404)


def test_a_node_socket_for_a_long_node_name_gets_its_panels(make_user):
    from agents.events import node_changed
    from agents.simulator.cluster import heartbeat_for

    name = "n" * 120  # a valid node name, longer than a group name may be
    heartbeat_record(node_name=name, heartbeat=heartbeat_for(node_spec(name, rack="r1", gpus=0)))
    user, _ = make_user("viewer1", "viewer")

    async def run():
        from asgiref.sync import sync_to_async

        communicator = socket_to(f"/ws/nodes/{name}/", user)
        assert (await communicator.connect())[0]
        await sync_to_async(node_changed)(name)
        html = await communicator.receive_from(timeout=5)
        assert await communicator.receive_nothing(0.3)  # one change, one render
        await communicator.disconnect()
        return html

    assert 'id="node-live"' in async_to_sync(run)()


def test_a_viewer_sending_garbage_on_the_nodes_socket_is_ignored(make_user):
    from agents.events import node_changed
    from agents.simulator.cluster import heartbeat_for

    heartbeat_record(node_name="gpu01", heartbeat=heartbeat_for(node_spec("gpu01", rack="r1")))
    user, _ = make_user("viewer1", "viewer")

    async def run():
        from asgiref.sync import sync_to_async

        communicator = socket_to("/ws/nodes/", user)
        assert (await communicator.connect())[0]
        for garbage in ["[" * 100_000, "x" * 300_000, "{" * 10 + "}" * 10, "not json"]:
            await communicator.send_to(text_data=garbage)
        await communicator.send_json_to({"shown": "gpu01", "HEADERS": {}})
        await communicator.receive_nothing(0.2)
        await sync_to_async(node_changed)("gpu01")
        html = await communicator.receive_from(timeout=5)  # still alive, still serving its page
        await communicator.disconnect()
        return html

    assert async_to_sync(run)().startswith('<tr id="node-gpu01"')


# -- property: random input never gives a 5xx nor costs another node its readings -------------------------

_SETTERS = [
    lambda hb, v: hb.__setitem__("agent_version", v),
    lambda hb, v: hb.__setitem__("interval_seconds", v),
    lambda hb, v: hb.__setitem__("inventory", v),
    lambda hb, v: hb["inventory"].__setitem__("hostname", v),
    lambda hb, v: hb["inventory"]["gpus"][0].__setitem__("uuid", v),
    lambda hb, v: hb["inventory"]["gpus"][0].__setitem__("memory_gib", v),
    lambda hb, v: hb.__setitem__("labels", v),
    lambda hb, v: hb["labels"].__setitem__("llmgw.io/rack", v),
    lambda hb, v: hb.__setitem__("sensors", v),
    lambda hb, v: hb["sensors"]["gpus"][0].__setitem__("uuid", v),
    lambda hb, v: hb["sensors"]["gpus"][0].__setitem__("power_watts", v),
    lambda hb, v: hb["sensors"]["gpus"][0].__setitem__("throttle_reasons", v),
    lambda hb, v: hb["sensors"].__setitem__("cpu_temperature_celsius", v),
    lambda hb, v: hb.__setitem__("replicas", v),
    lambda hb, v: with_replica(hb, message=v),
    lambda hb, v: with_replica(hb, state=v),
    lambda hb, v: with_replica(hb, id=v),
]
_MARK = "\x01POISON\x01"
_texts = st.one_of(
    st.text(max_size=30),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=10),  # lone surrogates too
    st.sampled_from(["\x00", "\ud800", "r1-01\n", "a" * 300, "u" * 150, "ready", "GPU-0"]),
)
_numbers = st.one_of(
    st.integers(), st.integers(min_value=10**300, max_value=10**400), st.floats(), st.sampled_from([-0.0, 1e308]),
)
_values = st.recursive(
    st.one_of(st.none(), st.booleans(), _numbers, _texts),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_texts, inner, max_size=3)),
    max_leaves=12,
)
_deep = st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n)


@st.composite
def poisoned_bodies(draw) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=3000))
    hb = SimNode(node_spec("bad01", rack="r1")).heartbeat(2.0)
    setter = draw(st.sampled_from(_SETTERS))
    if draw(st.booleans()):
        setter(hb, _MARK)
        return json.dumps(hb).replace(json.dumps(_MARK), draw(_deep)).encode()
    setter(hb, draw(_values))
    return json.dumps(hb).encode("utf-8", "surrogatepass")


@pytest.mark.slow
def test_random_heartbeats_never_give_a_5xx_nor_cost_another_node_its_readings():
    bad_token, _ = joined("bad01")
    good_token, good = joined("good01")
    count = iter(range(10**6))

    @hsettings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=poisoned_bodies(), through_lane=st.booleans())
    def check(body: bytes, through_lane: bool):
        status, _ = (lane if through_lane else django)(body, bad_token)
        assert status < 500, body[:300]
        i = next(count)
        hb = good.heartbeat(2.0)
        hb["sensors"]["cpu_temperature_celsius"] = 20.0 + i / 1000
        assert django(json.dumps(hb).encode(), good_token)[0] == 200  # stored in the request (FLUSH_SECONDS 0)
        assert Node.objects.get(name="good01").sensors["cpu_temperature_celsius"] == 20.0 + i / 1000

    check()


@pytest.mark.parametrize("watts", [(None, None), (None, 300.0)], ids=["none-measured", "one-measured"])
def test_a_readings_batch_with_nodes_that_measure_no_power_is_written(monkeypatch, watts):
    from agents.services import report_digest
    from agents.simulator.cluster import heartbeat_for

    names = ("gpu01", "gpu02")
    digests = {}
    for name in names:
        hb = heartbeat_for(node_spec(name, rack="r1"))
        heartbeat_record(node_name=name, heartbeat=hb)
        digests[name] = report_digest(hb)
    monkeypatch.setattr(readings, "FLUSH_SECONDS", 3600)  # both rows wait in one batch
    now = Node.objects.get(name="gpu01").last_heartbeat_at
    for name, watt in zip(names, watts, strict=True):
        sensors = {"cpu_temperature_celsius": 50.5}
        assert readings.buffer_readings(name, digests[name], at=now, sensors=sensors, watts=watt, interval=10)
    timer = readings._timer
    try:
        assert readings.flush() == 2
    finally:
        timer.cancel()
    stored = dict(Node.objects.filter(name__in=names).values_list("name", "measured_watts"))
    assert stored == dict(zip(names, watts, strict=True))
    assert all(n.sensors == {"cpu_temperature_celsius": 50.5} for n in Node.objects.filter(name__in=names))
