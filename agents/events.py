"""Live updates: what changed, sent to the channel layer for the console's open pages."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

NODES_GROUP = "nodes"
# The Facility and Models pages: told when placement or the facility changed (replicas, drains, budgets).
PLACEMENT_GROUP = "placement"


# After a send that found the layer's Redis down or out of reach, live updates are dropped for this long:
# a request that sends several then waits for one, not for each.
LAYER_DOWN_SECONDS = 5.0
_layer_down_until = 0.0


async def _group_send_all(layer, messages: list[tuple[str, dict]]) -> None:
    """The sends, bounded in time: with Redis down or out of reach a live update is dropped (the console
    catches up on the next one) after LLMGW_REDIS_TIMEOUT at most, never holding up the heartbeat or the
    write that caused it."""
    global _layer_down_until
    from django.conf import settings

    if time.monotonic() < _layer_down_until:
        return
    try:
        async with asyncio.timeout(settings.LLMGW_REDIS_TIMEOUT_SECONDS):
            for group, message in messages:
                await layer.group_send(group, message)
    except Exception as exc:  # a console update never fails the write that caused it
        if isinstance(exc, TimeoutError | OSError) or type(exc).__module__.startswith("redis"):
            _layer_down_until = time.monotonic() + LAYER_DOWN_SECONDS
        log.warning("live update to %s not sent: %s", ", ".join(sorted({g for g, _ in messages})),
                    str(exc) or type(exc).__name__)


def _send(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    try:
        if loop is not None:
            # Called from code running inside an event loop (a sync write under an async caller): send later.
            loop.create_task(_group_send_all(layer, [(group, message)]))
        else:
            async_to_sync(_group_send_all)(layer, [(group, message)])
    except Exception:  # a console update never fails the write that caused it
        log.warning("live update to %s not sent", group, exc_info=True)


def node_changed(name: str) -> None:
    """A node's sensors, labels, state or replicas changed. One message to the nodes group, the node
    named in it: the Nodes page and each node's page are in that group (they hear holds and budgets
    there too) and take the nodes they show."""
    _send(NODES_GROUP, {"type": "node.changed", "node": name})


def nodes_changed() -> None:
    """Something that touches many nodes changed (a hold, a budget)."""
    _send(NODES_GROUP, {"type": "nodes.changed"})
    _send(PLACEMENT_GROUP, {"type": "placement.changed"})


def placement_changed() -> None:
    """Replicas, shards or facility figures changed (a placement, a drain's step, a budget): the Facility
    and Models pages render again. Sent by the interface layer's receivers of placement's and the
    facility's signals (llmgw.apps), on commit."""
    _send(PLACEMENT_GROUP, {"type": "placement.changed"})


# Sensor readings arrive with every heartbeat of every node; sending one update per heartbeat would cost
# more than storing it. They are gathered and sent at most once a second: at once after a quiet second,
# else by a flush armed on the server's event loop for the end of the second.
SENSOR_FLUSH_SECONDS = 1.0
_pending_sensors: set[str] = set()
_pending_lock = threading.Lock()
_last_flush = 0.0
# When the armed flush should have run (monotonic), or 0 when none is armed. A flush armed on a loop
# that stopped before running it never clears this itself, so one overdue by a second counts as gone.
_trailing_due = 0.0


def sensors_changed(name: str) -> None:
    """A node's readings changed (and nothing else): the console hears of it within about a second."""
    sensors_changed_many([name])


def sensors_changed_many(names: list[str]) -> None:
    """Readings of these nodes changed (the heartbeat fast path's batch, written together): gathered
    with the others of the second under one lock, and sent as one message."""
    global _trailing_due
    if not names:
        return
    with _pending_lock:
        _pending_sensors.update(names)
        now = time.monotonic()
        wait = SENSOR_FLUSH_SECONDS - (now - _last_flush)
        if wait > 0:
            # Within the second: gathered, and sent by a flush armed for its end (the last readings of a
            # burst must not wait for the next heartbeat). With no event loop to arm it on, sent now.
            armed = bool(_trailing_due) and now < _trailing_due + SENSOR_FLUSH_SECONDS
            if not armed and _arm_flush(wait):
                _trailing_due, armed = now + wait, True
            if armed:
                return
        pending = _take_pending()
    _send_sensors(pending)


def _take_pending() -> list[str]:
    """The gathered node names, emptied; the caller holds the lock."""
    global _last_flush
    _last_flush = time.monotonic()
    names = sorted(_pending_sensors)
    _pending_sensors.clear()
    return names


def _flush_pending() -> None:
    global _trailing_due
    with _pending_lock:
        _trailing_due = 0.0
        names = _take_pending()
    _send_sensors(names)


def _arm_flush(delay: float) -> bool:
    """Run _flush_pending after `delay` on the event loop serving this process; False when there is none."""
    try:
        asyncio.get_running_loop().call_later(delay, _flush_pending)
        return True
    except RuntimeError:
        pass
    # A sync view or service under ASGI runs in a thread that asgiref ties to the server's loop.
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is None or not loop.is_running() or getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) != os.getpid():
        return False
    loop.call_soon_threadsafe(loop.call_later, delay, _flush_pending)
    return True


# Node names in one `nodes.readings` message at most: a message stays small for the channel layer.
READINGS_MESSAGE_NODES = 500


def _send_sensors(names: list[str]) -> None:
    """One `nodes.readings` message to the nodes group for the gathered names (a few, for many nodes):
    every page that shows nodes is in that group and picks its own. A message per node, and another to
    each node's own group, cost the event loop two channel-layer round trips per node a second, which
    it owes to the heartbeats it answers."""
    _send_many(
        [
            (NODES_GROUP, {"type": "nodes.readings", "nodes": names[i : i + READINGS_MESSAGE_NODES]})
            for i in range(0, len(names), READINGS_MESSAGE_NODES)
        ]
    )


def _send_many(messages: list[tuple[str, dict]]) -> None:
    """Several group sends in one pass through the event loop."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return

    async def send_all() -> None:
        await _group_send_all(layer, messages)

    try:
        asyncio.get_running_loop().create_task(send_all())
        return
    except RuntimeError:
        pass
    loop = server_loop()
    try:
        if loop is not None and not _in_request_thread():
            # A thread of our own (the readings' batch writer): hand the sends to the server's loop, where
            # the in-memory layer's queues live.
            asyncio.run_coroutine_threadsafe(send_all(), loop)
        else:
            async_to_sync(send_all)()
    except Exception:  # a console update never fails the write that caused it
        log.warning("live updates not sent", exc_info=True)


_server_loop: asyncio.AbstractEventLoop | None = None


def _in_request_thread() -> bool:
    return getattr(SyncToAsync.threadlocal, "main_event_loop", None) is not None


def remember_server_loop() -> None:
    """Called from a request (its thread, or the loop itself): note the server's event loop for sends
    from other threads."""
    global _server_loop
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is not None:
        _server_loop = loop


def server_loop() -> asyncio.AbstractEventLoop | None:
    loop = _server_loop
    return loop if loop is not None and loop.is_running() else None
