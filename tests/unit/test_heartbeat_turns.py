"""Heartbeats that take Django's full path (a node joining or changing) run at most as many at once as the
heartbeats' own pool has connections; the others wait their turn on the event loop rather than for a
connection (past the pool's timeout that was a 503 "database not reachable" while it was up)."""

from __future__ import annotations

import asyncio
import json

from agents.asgi import FULL_PATH_BUSY_TEXT, WAITING_PER_CONNECTION, HeartbeatFastLane

SCOPE = {"type": "http", "path": "/api/v1/agents/heartbeat", "method": "POST", "headers": []}


class Django:
    """Django's full path, held open until the test lets each heartbeat finish."""

    def __init__(self):
        self.running = 0
        self.most = 0
        self.done = asyncio.Event()

    async def __call__(self, scope, receive, send):
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.done.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
        finally:
            self.running -= 1


def answers() -> tuple[list[dict], object]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    return sent, send


def test_no_more_heartbeats_on_the_full_path_than_the_pool_has_connections(settings):
    settings.LLMGW_DB_HEARTBEAT_POOL_SIZE = 2
    settings.LLMGW_HEARTBEAT_WAIT_SECONDS = 60

    async def scenario():
        django = Django()
        lane = HeartbeatFastLane(django)
        outs = [answers() for _ in range(5)]
        turns = [asyncio.ensure_future(lane.full_path_turn(SCOPE, None, send)) for _, send in outs]
        for _ in range(10):
            await asyncio.sleep(0)
        running_while_held = django.running
        django.done.set()
        await asyncio.gather(*turns)
        return running_while_held, django.most, [sent[0]["status"] for sent, _ in outs]

    running, most, statuses = asyncio.run(scenario())
    assert (running, most) == (2, 2)
    assert statuses == [200] * 5  # every one answered in its turn, none refused


def test_a_heartbeat_that_waited_its_bound_is_answered_503_with_retry_after(settings):
    settings.LLMGW_DB_HEARTBEAT_POOL_SIZE = 1
    settings.LLMGW_HEARTBEAT_WAIT_SECONDS = 0.01

    async def scenario():
        lane = HeartbeatFastLane(Django())  # never lets its heartbeat finish: the one turn stays taken
        held = asyncio.ensure_future(lane.full_path_turn(SCOPE, None, answers()[1]))
        await asyncio.sleep(0)
        sent, send = answers()
        await lane.full_path_turn(SCOPE, None, send)
        held.cancel()
        return sent

    start, body = asyncio.run(scenario())
    assert start["status"] == 503
    assert (b"retry-after", b"5") in start["headers"]
    assert json.loads(body["body"]) == {"detail": FULL_PATH_BUSY_TEXT, "field": None}


def test_past_the_waiting_room_a_heartbeat_is_answered_at_once_and_those_waiting_are_served(settings):
    settings.LLMGW_DB_HEARTBEAT_POOL_SIZE = 1
    settings.LLMGW_HEARTBEAT_WAIT_SECONDS = 60

    async def scenario():
        django = Django()
        lane = HeartbeatFastLane(django)
        held = [answers() for _ in range(1 + WAITING_PER_CONNECTION)]  # one running, the rest waiting
        turns = [asyncio.ensure_future(lane.full_path_turn(SCOPE, None, send)) for _, send in held]
        for _ in range(10):
            await asyncio.sleep(0)
        sent, send = answers()
        await lane.full_path_turn(SCOPE, None, send)  # returns without waiting for any of them
        refused_while_full = sent[0]["status"]
        django.done.set()
        await asyncio.gather(*turns)
        return refused_while_full, [s[0]["status"] for s, _ in held]

    refused, served = asyncio.run(scenario())
    assert refused == 503
    assert served == [200] * (1 + WAITING_PER_CONNECTION)
