"""The heartbeat's fast lane, in front of Django: a known node saying nothing new is answered from memory.

A heartbeat from a node whose token is known to this process, that validates, and that says nothing but
new readings (agents.readings: same fingerprint as the last one stored, node still ready) is answered
here, on the event loop: its readings join the next batch write and its answer comes from the map of
assignments. Everything else — an unknown token, a refusal to explain, a node that joins, changes or
comes back, a map that is stale — goes to Django unchanged, through the full path (the DRF view and
agents.services.heartbeat_record), which also fills the caches this lane reads. Both answer the same.
Without this lane each heartbeat would cross from the event loop into a thread and back, which costs
more than storing it.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.utils import timezone

from agents import readings
from agents.authentication import cached_node_for
from agents.node.protocol import HeartbeatError, validate_heartbeat

HEARTBEAT_PATH = "/api/v1/agents/heartbeat"


class HeartbeatFastLane:
    """ASGI middleware: take the fast heartbeats, pass everything else to `app` untouched."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != HEARTBEAT_PATH or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body, complete = await _read_body(receive, settings.LLMGW_HEARTBEAT_MAX_BYTES)
        answer = self.answer(scope, body) if complete else None
        if answer is None:
            return await self.app(scope, _replay(body, receive, complete), send)
        payload = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    def answer(self, scope, body: bytes) -> dict[str, Any] | None:
        """The answer when the fast lane can give it, else None (Django answers)."""
        node_name = cached_node_for(_header(scope, b"authorization"))
        if node_name is None:
            return None
        try:
            heartbeat = validate_heartbeat(json.loads(body))
        except (ValueError, HeartbeatError):
            return None
        if heartbeat["node"] != node_name:
            return None
        replicas = readings.cached_assignments(node_name)
        if replicas is None:
            return None
        from agents.services import measured_watts, report_digest

        sensors = heartbeat.get("sensors") or {}
        if not readings.buffer_readings(
            node_name,
            report_digest(heartbeat),
            at=timezone.now(),
            sensors=sensors,
            watts=measured_watts(sensors),
            interval=heartbeat.get("interval_seconds") or 10,
            on_event_loop=True,
        ):
            return None
        return {"node": node_name, "interval_seconds": heartbeat.get("interval_seconds", 10), "replicas": replicas}


def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


async def _read_body(receive, limit: int) -> tuple[bytes, bool]:
    """The request body, up to `limit` bytes; (what was read, whether it is all of it)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), False
        if not message.get("more_body"):
            return b"".join(chunks), True


def _replay(body: bytes, receive, complete: bool):
    """A `receive` that gives Django the body read already, then whatever is left."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replayed
