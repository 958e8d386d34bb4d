"""The heartbeat fast path: a node that says nothing new but its readings costs no transaction.

Each web process remembers, per node, the fingerprint of the last full heartbeat it stored. A heartbeat
with the same fingerprint from a node still ready only carries readings: they are kept in memory and
written for all such nodes at once, one statement at most every FLUSH_SECONDS, by a timer thread. The
answer (the node's replicas) comes from a map of every node's assignments read at most once a second,
and read again at once after a placement change in this process. What is lost if the process dies is
under a second of readings; anything new (inventory, labels, replica states, a node coming back) is
written at once through the full path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError, close_old_connections, connection, transaction

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.5  # 0: write in the request (tests)
ASSIGNMENTS_SECONDS = 1.0

_lock = threading.Lock()
_known: dict[str, tuple[str, float]] = {}  # node → (fingerprint of its last full heartbeat, monotonic time seen)
_buffer: dict[str, tuple[datetime, dict, float | None, str]] = {}
_timer: threading.Timer | None = None


def remember(node_name: str, digest: str) -> None:
    """The full path stored this fingerprint for the node: its next same heartbeat may take the fast path."""
    with _lock:
        _known[node_name] = (digest, time.monotonic())


def forget(node_name: str | None = None) -> None:
    with _lock:
        if node_name is None:
            _known.clear()
        else:
            _known.pop(node_name, None)


def buffer_readings(
    node_name: str,
    digest: str,
    *,
    at: datetime,
    sensors: Mapping[str, Any],
    watts: float | None,
    interval: float,
    on_event_loop: bool = False,
) -> bool:
    """Keep the readings for the next batch if the node is known, unchanged and ready; False otherwise.

    `on_event_loop`: the caller may not touch the database (the fast lane): the batch is always
    written by the timer thread.
    """
    global _timer
    from agents.events import remember_server_loop
    from agents.models import ready_window_seconds

    remember_server_loop()
    now = time.monotonic()
    with _lock:
        known = _known.get(node_name)
        window = ready_window_seconds(interval)
        if known is None or known[0] != digest or now - known[1] > window:
            return False
        _known[node_name] = (digest, now)
        _buffer[node_name] = (at, dict(sensors), watts, digest)
        inline = FLUSH_SECONDS <= 0 and not on_event_loop
        if not inline and _timer is None:
            _timer = threading.Timer(max(FLUSH_SECONDS, 0.01), _flush_in_thread)
            _timer.daemon = True
            _timer.start()
    if inline:  # tests: written before the request returns
        flush()
    return True


def _flush_in_thread() -> None:
    try:
        flush()
    except Exception:
        log.exception("readings not written")
    finally:
        close_old_connections()
        connection.close()


def flush() -> int:
    """Write every buffered reading now, in one statement; nodes that are gone are forgotten."""
    global _timer
    with _lock:
        batch = dict(_buffer)
        _buffer.clear()
        _timer = None
    if not batch:
        return 0
    try:
        written = _write(batch)
    except Exception:
        # Not stored: these nodes' next heartbeats take the full path, which writes or says why.
        with _lock:
            for name in batch:
                _known.pop(name, None)
        raise
    missing = set(batch) - written
    if missing:
        # Deleted meanwhile, or another process stored a newer report since this one remembered it:
        # their next heartbeat takes the full path.
        with _lock:
            for name in missing:
                _known.pop(name, None)
    from agents.events import sensors_changed_many

    sensors_changed_many(sorted(written))
    return len(written)


def _write(batch: dict[str, tuple[datetime, dict, float | None, str]]) -> set[str]:
    """Write the batch in one statement; if it fails, row by row, so one bad row costs no other node.

    A row that fails alone is dropped and logged (its node's next heartbeat takes the full path, which
    stores it or says why).
    """
    try:
        return _write_rows(batch)
    except (OperationalError, InterfaceError):
        raise  # the database, not a row: no row would go through alone either
    except Exception:
        if len(batch) == 1:
            log.exception("readings of node %s not written: dropped", next(iter(batch)))
            return set()
        log.warning("readings batch of %d nodes failed: writing them one by one", len(batch), exc_info=True)
    written: set[str] = set()
    for name, row in batch.items():
        try:
            written |= _write_rows({name: row})
        except (OperationalError, InterfaceError):
            raise
        except Exception:
            log.exception("readings of node %s not written: dropped", name)
    return written


def _write_rows(batch: dict[str, tuple[datetime, dict, float | None, str]]) -> set[str]:
    """One UPDATE for the rows (a transaction of its own, or a savepoint inside the caller's); a row is
    written only while its stored report is the one remembered."""
    from agents.models import Node, measured_peak_of, measured_window_seconds
    from facility.power import measured_peak_sql

    if connection.vendor == "postgresql":
        table = Node._meta.db_table
        # The peak buckets are updated in the same UPDATE, from the row's own: one statement still.
        buckets_sql, peak_sql = measured_peak_sql("n.measured_peaks", "v.at", "v.watts", measured_window_seconds())
        rows = [(name, at, json.dumps(sensors), watts, digest) for name, (at, sensors, watts, digest) in batch.items()]
        values = ", ".join(["(%s, %s::timestamptz, %s::jsonb, %s::double precision, %s)"] * len(rows))
        params = [p for row in rows for p in row]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS n SET last_heartbeat_at = v.at, sensors_at = v.at, sensors = v.sensors, "
                f"measured_watts = v.watts, measured_peaks = {buckets_sql}, measured_peak_watts = {peak_sql} "
                f"FROM (VALUES {values}) AS v(name, at, sensors, watts, digest) "
                f"WHERE n.name = v.name AND n.report_digest = v.digest RETURNING n.name",
                params,
            )
            return {row[0] for row in cursor.fetchall()}
    written = set()
    with transaction.atomic():
        for name, (at, sensors, watts, digest) in batch.items():
            stored = Node.objects.select_for_update().filter(name=name).values_list("measured_peaks", flat=True).first()
            buckets, peak = measured_peak_of(stored, watts, at)
            if Node.objects.filter(name=name, report_digest=digest).update(
                last_heartbeat_at=at,
                sensors_at=at,
                sensors=sensors,
                measured_watts=watts,
                measured_peaks=buckets,
                measured_peak_watts=peak,
            ):
                written.add(name)
    return written


# -- assignments -----------------------------------------------------------------------------------------

_assignments: dict[str, list[dict]] = {}
_assignments_at = -1e9
_assignments_generation = 0  # moved on by every invalidation, so a read begun before one is not kept
_assignments_lock = threading.Lock()
# Who answers "what must each node run": registered by the layer that owns assignments (placement, in
# its AppConfig.ready), so the node layer never imports it. None: nothing to run anywhere.
_assignments_provider: Callable[[], dict[str, list[dict]]] | None = None


# Who answers "which GPU capping must each node hold" (agents.node.protocol's `capping` block, by node
# name; a node absent from the map holds its defaults): registered by the layer that decides caps. Read
# with the assignments, in the same refresh, so the fast lane's answer is never older than its replicas.
_capping: dict[str, dict] = {}
_capping_provider: Callable[[], Mapping[str, dict]] | None = None


def register_capping_provider(provider: Callable[[], Mapping[str, dict]] | None) -> None:
    """Set the function that reads every node's wanted capping block in one go (node name → block).

    It runs at most once a second per web process, and at once after invalidate_assignments (call that,
    or send placement_changed, when a decision changes). None: no capping anywhere.
    """
    global _capping_provider
    _capping_provider = provider
    invalidate_assignments()


def wanted_capping(node_name: str) -> dict | None:
    """The capping block the node's answer carries, from the map read with the assignments; None: defaults.

    Read it after `assignments` or a fresh `cached_assignments`: both answer from the same refresh.
    """
    return _capping.get(node_name)


def answer_for(node_name: str, interval: float, replicas: list[dict]) -> dict[str, Any]:
    """The heartbeat answer: the node, its interval, its replicas and, when one is wanted, its capping."""
    answer: dict[str, Any] = {"node": node_name, "interval_seconds": interval, "replicas": replicas}
    capping = wanted_capping(node_name)
    if capping is not None:
        answer["capping"] = capping
    return answer


def register_assignments_provider(provider: Callable[[], dict[str, list[dict]]]) -> None:
    """Set the function that reads every node's assignments in one go (node name → list)."""
    global _assignments_provider
    _assignments_provider = provider
    invalidate_assignments()


def invalidate_assignments(**_: Any) -> None:
    """A placement changed in this process: the next heartbeat reads the map again."""
    global _assignments_at, _assignments_generation
    with _assignments_lock:
        _assignments_at = -1e9
        _assignments_generation += 1


def cached_assignments(node_name: str) -> list[dict] | None:
    """The node's assignments from the map if it is fresh, else None; never reads the database."""
    if time.monotonic() - _assignments_at > ASSIGNMENTS_SECONDS:
        return None
    return _assignments.get(node_name, [])


def assignments(node_name: str) -> list[dict]:
    """What the node must run, from a map of all nodes read at most once a second.

    The read happens with no lock held: a request thread waiting on a lock while it holds a pooled
    connection, behind one that needs a connection to finish its read, would starve the pool.
    """
    global _assignments, _assignments_at, _capping
    if time.monotonic() - _assignments_at > ASSIGNMENTS_SECONDS:
        generation = _assignments_generation
        read_at = time.monotonic()
        fresh = _assignments_provider() if _assignments_provider is not None else {}
        capping = dict(_capping_provider()) if _capping_provider is not None else {}
        with _assignments_lock:
            if generation == _assignments_generation:
                _assignments, _assignments_at, _capping = fresh, read_at, capping
        return fresh.get(node_name, [])
    return _assignments.get(node_name, [])
