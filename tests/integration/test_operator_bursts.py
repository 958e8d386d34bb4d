"""An operator's burst never starves heartbeats: costly parses run in a few slots per web process (past
them, 429 with Retry-After), and heartbeats take their database connections from a pool of their own."""

from __future__ import annotations

import contextvars
import threading

import pytest

from llmgw import parselimit
from llmgw.dependencies import heartbeat_lane, is_database_unavailable

SERVER_YAML = "facility:\n  margin: 0.2\n"


class SlotsTaken:
    """Every parsing slot held by other threads (each a parse in progress) until the ``with`` ends."""

    def __init__(self, slots: int):
        self.slots = slots
        self.release = threading.Event()
        self.holding = threading.Barrier(slots + 1)

    def _hold(self):
        with parselimit.parse_slot("other.yaml"):
            self.holding.wait()
            self.release.wait(30)

    def __enter__(self):
        self.threads = [threading.Thread(target=self._hold, daemon=True) for _ in range(self.slots)]
        for thread in self.threads:
            thread.start()
        self.holding.wait(10)
        return self

    def __exit__(self, *exc):
        self.release.set()
        for thread in self.threads:
            thread.join(10)


@pytest.fixture
def two_slots(monkeypatch):
    monkeypatch.setattr(parselimit, "PARSE_WAIT_SECONDS", 0.2)
    parselimit.configure(2)
    yield
    parselimit.configure(None)


@pytest.mark.django_db(transaction=True)
def test_past_the_parsing_slots_an_operators_document_is_429_with_retry_after(admin_client, two_slots):
    from facility.models import FacilitySettings

    with SlotsTaken(2):
        answer = admin_client.post("/api/v1/facility/apply", {"text": SERVER_YAML}, content_type="application/json")
        assert answer.status_code == 429
        assert answer["Retry-After"] == "2"
        assert answer.json() == {
            "detail": "body: this server is parsing 2 other documents now; try again in 2 seconds", "field": None,
        }
    assert not FacilitySettings.objects.filter(margin=0.2).exists(), "nothing of it was applied"
    # A slot free: the same document is applied, its scenario files parsed in the same slot.
    answer = admin_client.post("/api/v1/facility/apply", {"text": SERVER_YAML}, content_type="application/json")
    assert answer.status_code == 200, answer.content


@pytest.mark.django_db(transaction=True)
def test_a_yaml_document_parsed_past_the_slots_is_refused_naming_it(two_slots):
    from llmgw.errors import LlmgwError
    from llmgw.yamldoc import load_documents

    with SlotsTaken(2), pytest.raises(LlmgwError) as refused:
        load_documents(SERVER_YAML, "server.yaml")
    assert refused.value.status == 429
    assert refused.value.message == "server.yaml: this server is parsing 2 other documents now; try again in 2 seconds"


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_takes_no_parsing_slot(node_client, two_slots):
    from agents.simulator.cluster import heartbeat_for
    from tests.conftest import node_spec

    with SlotsTaken(2):
        answer = node_client("n1").post("/api/v1/agents/heartbeat", heartbeat_for(node_spec("n1", rack="r1")),
                                        format="json")
    assert answer.status_code == 200, answer.content


def _in_thread(function, *, heartbeat: bool):
    """``function()`` in a thread of its own (its own connection), on the heartbeat's lane or not: what it
    returned, or the exception it raised."""
    from django.db import connection

    result: list = []

    def run():
        if heartbeat:
            heartbeat_lane.set(True)
        try:
            result.append(function())
        except Exception as exc:
            result.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,))
    thread.start()
    thread.join(30)
    return result[0]


def _count_nodes() -> int:
    from agents.models import Node

    return Node.objects.count()


@pytest.mark.django_db(transaction=True)
def test_with_every_connection_of_the_pool_held_a_heartbeat_still_reaches_the_database():
    from django.db import connection

    pool = connection.pool
    assert pool is not None, "the test runs on PostgreSQL with the pool (LLMGW_DB_POOL)"
    held = []
    try:
        pool.open()
        held = [pool.getconn(timeout=10) for _ in range(pool.max_size)]  # an operator's burst holds them all
        refused = _in_thread(_count_nodes, heartbeat=False)
        assert isinstance(refused, Exception) and is_database_unavailable(refused)  # that request: a 503
        assert _in_thread(_count_nodes, heartbeat=True) == 0
    finally:
        for conn in held:
            pool.putconn(conn)


@pytest.mark.parametrize(("path", "lane"), [("/api/v1/agents/heartbeat", True), ("/api/v1/facility/apply", False)])
def test_a_heartbeats_request_runs_on_the_heartbeat_lane(path, lane):
    import asyncio

    from llmgw.bodies import BoundedBodies

    seen = []

    async def app(scope, receive, send):
        seen.append(heartbeat_lane.get())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        pass

    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
             "headers": [(b"content-length", b"2"), (b"authorization", b"Token x")]}
    asyncio.run(BoundedBodies(app)(scope, receive, send))
    assert seen == [lane]
    assert heartbeat_lane.get() is False  # the request's own context only
