"""The heartbeat's map of assignments: read at server start, kept fresh off the requests' path, read
again per node when a change names its nodes, and never hiding a change made while it was read."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agents import readings
from agents.asgi import AssignmentsLifespan

pytestmark = pytest.mark.django_db(transaction=True)


class Provider:
    """What placement would answer, and every call it got (None: all nodes)."""

    def __init__(self):
        self.map = {"a": [{"id": 1}], "b": [{"id": 2}]}
        self.calls: list[list[str] | None] = []
        self.during_read = None  # something to do while a read is under way (a concurrent change)

    def __call__(self, nodes=None):
        self.calls.append(None if nodes is None else list(nodes))
        if self.during_read is not None:
            self.during_read()
        wanted = self.map if nodes is None else {n: self.map[n] for n in nodes if n in self.map}
        return {n: list(items) for n, items in wanted.items()}


@pytest.fixture
def provider():
    from placement.selectors import all_assignments

    fake = Provider()
    readings.register_assignments_provider(fake)
    yield fake
    readings.refresher_stop()
    readings.register_assignments_provider(all_assignments)


def wait_for(check) -> None:
    deadline = time.monotonic() + 30  # a bound on a loaded machine, not a figure
    while not check():
        assert time.monotonic() < deadline, "the refresher did not get there"
        time.sleep(0.01)


def test_a_change_naming_nodes_stales_only_them(provider):
    assert readings.assignments("a") == [{"id": 1}]
    assert provider.calls == [None]
    readings.invalidate_assignments(nodes=["a"])
    assert readings.cached_assignments("a") is None
    assert readings.cached_assignments("b") == [{"id": 2}]
    provider.calls.clear()
    provider.map["a"] = [{"id": 7}]
    assert readings.assignments("a") == [{"id": 7}]
    assert provider.calls == [["a"]]  # that node alone read again
    readings.invalidate_assignments()
    assert readings.cached_assignments("b") is None


def test_a_change_made_during_a_read_stays_stale(provider):
    readings.assignments("a")
    provider.map["b"] = [{"id": 3}]
    provider.during_read = lambda: readings.invalidate_assignments(nodes=["b"])
    readings.invalidate_assignments(nodes=["a"])
    readings.assignments("a")  # reads every node again; b changes meanwhile
    assert readings.cached_assignments("a") == [{"id": 1}]
    assert readings.cached_assignments("b") is None


def test_the_lifespan_reads_the_map_at_start_and_the_refresher_reads_named_nodes_alone(provider, monkeypatch):
    # The refresher's full read every ASSIGNMENTS_SECONDS would, on a loaded machine, come between the
    # change and its named read and answer for it: the test is about the named read alone.
    monkeypatch.setattr(readings, "ASSIGNMENTS_SECONDS", 600)
    messages = asyncio.Queue()
    sent: list[str] = []

    async def send(message):
        sent.append(message["type"])

    async def serve():
        task = asyncio.ensure_future(AssignmentsLifespan()({"type": "lifespan"}, messages.get, send))
        await messages.put({"type": "lifespan.startup"})
        while not sent:
            await asyncio.sleep(0.01)
        # Started: the map was read before the first request could come.
        assert sent == ["lifespan.startup.complete"]
        assert provider.calls[-1] is None
        assert readings.cached_assignments("b") == [{"id": 2}]
        provider.calls.clear()
        provider.map["a"] = [{"id": 9}]
        readings.invalidate_assignments(nodes=["a"])
        await asyncio.to_thread(wait_for, lambda: readings.cached_assignments("a") == [{"id": 9}])
        assert ["a"] in provider.calls
        await messages.put({"type": "lifespan.shutdown"})
        await task

    asyncio.run(serve())
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert readings._refresher is None


def test_with_the_refresher_a_stale_node_is_read_alone(provider):
    readings.refresher_start()
    provider.calls.clear()
    gate = threading.Event()
    # The refresher's read blocks: the heartbeat must not wait on it.
    provider.during_read = lambda: gate.wait() if threading.current_thread().name == "llmgw-assignments" else None
    provider.map["b"] = [{"id": 5}]  # written before the node is marked stale: the refresher may read it at once
    readings.invalidate_assignments(nodes=["b"])
    try:
        assert readings.assignments("b") == [{"id": 5}]
    finally:
        gate.set()
    assert ["b"] in provider.calls


def test_cached_node_tokens_are_checked_again_off_the_request():
    from agents import authentication
    from agents.models import NodeToken
    from agents.services import node_token_create

    key = node_token_create(node_name="gpu01")
    valid, gone = NodeToken.hash_key(key), NodeToken.hash_key("a token replaced since")
    authentication._token_cache.update({valid: ("gpu01", time.monotonic() - 1), gone: ("gpu02", time.monotonic() + 5)})
    assert authentication.cached_node_for(f"Token {key}") is None  # aged: a heartbeat would go to Django
    authentication.node_tokens_recheck()
    assert authentication.cached_node_for(f"Token {key}") == "gpu01"
    assert gone not in authentication._token_cache
