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
@pytest.mark.slow
def test_with_every_connection_of_the_pool_held_a_heartbeat_still_reaches_the_database():
    from django.db import connection

    pool = connection.pool
    assert pool is not None, "the test runs on PostgreSQL with the pool (LLMGW_DB_POOL)"
    held = []
    connection.close()  # this test's own connection back to the pool: the burst below takes every one
    try:
        pool.open()
        # An operator's burst holds every one the pool can give (each kept, so all are given back): until the
        # pool has none left, whatever another thread of this worker may hold for a moment.
        from psycopg_pool import PoolTimeout

        while len(held) < pool.max_size:
            try:
                held.append(pool.getconn(timeout=3))
            except PoolTimeout:
                break
        assert held, "the pool gave no connection"
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


# Merge keys of merge keys: refused at the 500,000th value, after seconds of one process's CPU.
MERGE_BOMB = "a: &a {" + ", ".join(f"k{i}: 1" for i in range(9)) + "}\n" + "".join(
    f"{name}: &{name} {{<<: [{', '.join([f'*{prev}'] * 9)}]}}\n" for prev, name in zip("abcdef", "bcdefg", strict=True)
)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_served_process_answers_heartbeats_while_an_operators_bombs_hold_its_pool(tmp_path, make_user):
    """A real `llmgw serve` with a pool of one connection: operators' costly documents hold it for seconds,
    and a heartbeat that needs the database (a token not cached) is still answered by it, not 503."""
    import httpx

    from tests.integration.test_deploy_units import served_llmgw

    _, key = make_user("op", "operator")
    with served_llmgw(tmp_path, "web", LLMGW_DB_POOL_SIZE="1", LLMGW_DB_POOL_TIMEOUT="1") as address:
        url = f"http://{address}"
        bombs = []

        def bomb():
            bombs.append(httpx.post(f"{url}/api/v1/facility/apply", json={"text": MERGE_BOMB}, timeout=60,
                                    headers={"Authorization": f"Token {key}"}).status_code)

        threads = [threading.Thread(target=bomb) for _ in range(3)]
        for thread in threads:
            thread.start()
        beats = []
        for _ in range(10):
            answer = httpx.post(f"{url}/api/v1/agents/heartbeat", json={"node": "n1"}, timeout=30,
                                headers={"Authorization": "Token not-a-known-one"})
            beats.append((answer.status_code, answer.json()["detail"]))
        for thread in threads:
            thread.join(60)
    assert set(beats) == {(401, "unknown node token (make one with: llmgw ctl node token NODE)")}
    # The operators share the one connection among themselves: one is refused its document, the others may
    # wait past the pool's timeout (503) or find no parsing slot (429).
    assert 400 in bombs and set(bombs) <= {400, 429, 503}
