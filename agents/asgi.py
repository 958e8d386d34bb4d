"""The heartbeat's fast lane, in front of Django: a known node saying nothing new is answered from memory.

A heartbeat from a node whose token is known to this process, that validates, and that says nothing but
new readings (agents.readings: same fingerprint as the last one this process stored or learned) is
answered here, on the event loop: its readings join the next batch write and its answer comes from the
map of assignments. A node that had gone quiet past its ready window is answered here too; the batch
write sees it and tells placement it came back. Everything else — an unknown token, a refusal to explain,
a node that joins or changes, a map that is stale — goes to Django unchanged, through the full path (the
DRF view and agents.services.heartbeat_record), which also fills the caches this lane reads. Both answer
the same.
Without this lane each heartbeat would cross from the event loop into a thread and back, which costs
more than storing it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from typing import Any

from django.conf import settings
from django.utils import timezone

from agents import readings
from agents.authentication import TOKEN_CACHE_SECONDS, cached_node_for, node_tokens_learn, node_tokens_recheck
from agents.node.protocol import HeartbeatError, validate_heartbeat
from llmgw.bodies import HEARTBEAT_PATH, bounded_body, send_json, whole
from llmgw.jsonguard import MAX_JSON_DEPTH, json_depth_exceeds, unique_keys

log = logging.getLogger(__name__)

# How often a served process learns the running nodes it has not seen (their tokens and stored reports).
LEARN_SECONDS = 5.0

# Heartbeats that may wait for the full path, for each of its connections.
WAITING_PER_CONNECTION = 4
FULL_PATH_BUSY_TEXT = (
    "this server is taking as many joining or changed nodes as its heartbeat connections allow; "
    "try again in a few seconds"
)


def learn_running_nodes() -> None:
    """The node tokens and the ready nodes' stored reports this process has not seen: their next
    heartbeat here takes the fast lane rather than Django's full path (agents.readings.learn_ready_nodes)."""
    node_tokens_learn()
    readings.learn_ready_nodes()


class AssignmentsLifespan:
    """The ASGI lifespan of a served process: at start-up the map of assignments is read before the
    first request (no first heartbeat waits on it) and a thread keeps it fresh from then on
    (agents.readings.Refresher), and the node tokens the lane knows are checked again there before
    their cache entries age; what start-up made is frozen out of the garbage collector's reach
    (gc.freeze); at shutdown the thread stops."""

    async def __call__(self, scope, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # Node tokens checked again in the same thread, before their cache entries age; the
                # running nodes learned at start and as they join.
                every = [(TOKEN_CACHE_SECONDS / 2, node_tokens_recheck), (LEARN_SECONDS, learn_running_nodes)]
                await asyncio.to_thread(readings.refresher_start, every)
                # What start-up made (modules, settings, the map) lives as long as the process: kept out
                # of the collector's full passes, which would otherwise walk it all, on the event loop,
                # in the middle of some heartbeat.
                gc.collect()
                gc.freeze()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(readings.refresher_stop)
                await send({"type": "lifespan.shutdown.complete"})
                return


class HeartbeatFastLane:
    """ASGI middleware: take the fast heartbeats, pass everything else to `app` untouched.

    Behind llmgw.bodies.BoundedBodies, a body comes whole and within its limits; in front of anything
    else the lane bounds it the same way (413 too large, 408 too slow) rather than wait for more.
    """

    def __init__(self, app):
        self.app = app
        # Heartbeats on Django's full path at once: no more than the heartbeats' own pool has connections.
        # Each request runs in a thread of its own; past the pool's size the threads waited for a connection,
        # and past LLMGW_DB_POOL_TIMEOUT were answered 503 "database not reachable" while it was up (a
        # thousand nodes joining). The others wait here, on the event loop, for a turn.
        self.full_path: asyncio.Semaphore | None = None
        self.waiting = 0  # heartbeats waiting for their turn

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != HEARTBEAT_PATH or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body = await bounded_body(scope, receive, send)
        if body is None:
            return None
        answer = self.answer(scope, body)
        if answer is None:
            return await self.full_path_turn(scope, whole(body, receive), send)
        await send_json(send, 200, answer)

    async def full_path_turn(self, scope, receive, send) -> None:
        """Django's full path once a heartbeat connection is free; a heartbeat that waited
        LLMGW_HEARTBEAT_WAIT_SECONDS for one is answered 503 with Retry-After (its agent sends again)."""
        size = max(1, settings.LLMGW_DB_HEARTBEAT_POOL_SIZE)
        if self.full_path is None:
            self.full_path = asyncio.Semaphore(size)
        # Past WAITING_PER_CONNECTION waiting a connection each, one more is answered at once: a queue that
        # grows without end serves every heartbeat only after its bound, each of them then refused (a
        # thousand nodes joining: not one got through for minutes), where a short one serves those it holds.
        if self.full_path.locked() and self.waiting >= size * WAITING_PER_CONNECTION:
            return await self.busy(send)
        self.waiting += 1
        try:
            await asyncio.wait_for(self.full_path.acquire(), settings.LLMGW_HEARTBEAT_WAIT_SECONDS)
        except TimeoutError:
            return await self.busy(send)
        finally:
            self.waiting -= 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.full_path.release()

    @staticmethod
    async def busy(send) -> None:
        from llmgw.dependencies import RETRY_AFTER_SECONDS

        await send_json(send, 503, {"detail": FULL_PATH_BUSY_TEXT, "field": None},
                        headers=((b"retry-after", str(RETRY_AFTER_SECONDS).encode()),))

    def answer(self, scope, body: bytes) -> dict[str, Any] | None:
        """The answer when the fast lane can give it, else None (Django answers)."""
        node_name = cached_node_for(_header(scope, b"authorization"))
        if node_name is None:
            return None
        # A body not sent as JSON: Django's parsers refuse it (415), whatever it holds.
        if _header(scope, b"content-type").partition(";")[0].strip().lower() != "application/json":
            return None
        # Too deep, not JSON, or refused: Django answers, and says why. The depth is checked first,
        # without recursion, so the parser never recurses past MAX_JSON_DEPTH.
        if json_depth_exceeds(body, MAX_JSON_DEPTH):
            return None
        try:
            heartbeat = validate_heartbeat(json.loads(body, object_pairs_hook=unique_keys))
        except (ValueError, HeartbeatError):  # HeartbeatError is a ValueError too
            return None
        if heartbeat["node"] != node_name:
            return None
        replicas = readings.cached_assignments(node_name)
        if replicas is None:
            return None
        checked = readings.plausible_heartbeat(heartbeat, on_event_loop=True)
        if checked is None:
            return None
        heartbeat, warnings = checked
        from agents.services import NodeWattsUnknown, node_measured_watts, report_digest

        sensors = heartbeat.get("sensors") or {}
        try:
            watts = node_measured_watts(sensors, on_event_loop=True)
        except NodeWattsUnknown:  # the BMC's figure needs node_watts, not read lately: Django's path reads it
            return None
        if not readings.buffer_readings(
            node_name,
            report_digest(heartbeat),
            at=timezone.now(),
            sensors=sensors,
            watts=watts,
            interval=heartbeat.get("interval_seconds") or 10,
            on_event_loop=True,
        ):
            return None
        return readings.answer_for(node_name, heartbeat.get("interval_seconds", 10), replicas, warnings)


def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return ""
