"""The heartbeat fast path: a node that says nothing new but its readings costs no transaction.

Each web process remembers, per node, the fingerprint of the last full heartbeat it stored. A heartbeat
with the same fingerprint from a node still ready only carries readings: they are kept in memory and
written for all such nodes at once, one statement at most every FLUSH_SECONDS, by a timer thread. The
answer (the node's replicas) comes from a map of every node's assignments read at most once a second,
and read again at once after a placement change in this process. What is lost if the process dies is
under a second of readings; anything new (inventory, labels, replica states, a node coming back) is
written at once through the full path.

Kept in one module: the fingerprints, the batched writes and the assignments' map share one cache
and one lock; splitting them would spread that state over modules.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError, close_old_connections, connection, transaction

from agents.node.protocol import implausible_readings, implausible_text
from llmgw.lock_order import lock_clause, rows_locked

log = logging.getLogger(__name__)

# 0: write in the request (tests). Short: the batch is built in a thread under the GIL the event loop needs,
# so its size is a pause in every heartbeat's answer; a short interval keeps each batch, and so each pause,
# small.
FLUSH_SECONDS = 0.1
ASSIGNMENTS_SECONDS = 1.0
# How old a map the lane answers from while the refresher's next read is under way: one heartbeat at the
# protocol's longest interval, so an assignment reaches a node at most one beat later than a fresh map says.
MAP_KEPT_SECONDS = 10.0

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
            _facts.clear()
        else:
            _known.pop(node_name, None)
            _facts.pop(node_name, None)


def learn_ready_nodes() -> int:
    """Remember the nodes ready in the database that this process has not seen, with their stored
    report's fingerprint, as if it had stored that report itself; how many.

    A process that starts (or is added) beside a running fleet would otherwise send every node's next
    heartbeat through Django's full path at once, a wave far slower than the fleet's pace, in which
    nodes pass their ready window and go through it again. The batch write still writes a row only
    while its stored report is the one remembered, so a report stored elsewhere meanwhile is not hidden.
    """
    from datetime import timedelta

    from django.utils import timezone

    from agents.models import Node, ready_window_seconds
    from agents.node.protocol import INTERVAL_MAX

    wall = timezone.now()
    with _lock:
        seen = set(_known)
    since = wall - timedelta(seconds=ready_window_seconds(INTERVAL_MAX))
    if connection.vendor == "postgresql":
        # Only the nodes this process has not seen: after the first learning, a handful, not the fleet
        # (reading every node's row every few seconds, in a thread, would hold the GIL the event loop
        # needs, and every heartbeat's answer would wait on it).
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT name, report_digest, last_heartbeat_at, heartbeat_interval_seconds, max_draw_watts FROM "
                f"{Node._meta.db_table} WHERE last_heartbeat_at >= %s AND report_digest <> '' "
                # a change of cards waiting for an operator: its readings are judged by its accepted cards,
                # which the full path reads
                f"AND pending_inventory IS NULL "
                # binary: escaping every name as text would hold the GIL the heartbeats' event loop needs
                f"AND NOT (name = ANY(%b::text[]))",
                [since, list(seen)],
            )
            rows = cursor.fetchall()
    else:
        rows = (
            Node.objects.filter(last_heartbeat_at__gte=since, pending_inventory__isnull=True)
            .exclude(report_digest="")
            .values_list("name", "report_digest", "last_heartbeat_at", "heartbeat_interval_seconds", "max_draw_watts")
        )
    now = time.monotonic()
    learned = {}
    ceilings = {}
    for name, digest, at, interval, max_draw in rows:
        age = max((wall - at).total_seconds(), 0.0)
        if name not in seen and age <= ready_window_seconds(interval):
            learned[name] = (digest, now - age)
            ceilings[name] = max_draw
    with _lock:
        for name, entry in learned.items():
            if name not in _known:
                _known[name] = entry
                _facts.setdefault(name, (ceilings[name], None))
    return len(learned)


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
    """Keep the readings for the next batch if the node is known and its report unchanged; False otherwise.

    A node this process has not heard from within its ready window is kept too: the batch write sees
    from the stored row that it had gone quiet and tells placement it came back (``nodes_changed``), as
    the full path would. Sending it through the full path instead made an overload feed itself: a
    heartbeat that had queued past its node's window took Django's path, several times slower, so
    more queued past theirs, and the lane never won them back under the same load.

    `on_event_loop`: the caller may not touch the database (the fast lane): the batch is always
    written by the timer thread.
    """
    global _timer
    from agents.events import remember_server_loop

    remember_server_loop()
    now = time.monotonic()
    with _lock:
        known = _known.get(node_name)
        if known is None or known[0] != digest:
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
        if _timer is not None:
            _timer.cancel()  # called before it fired: it would find nothing left to write
        _timer = None
    if not batch:
        return 0
    try:
        written, came_back = _write(batch)
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
    if came_back:
        from agents import signals
        from agents.models import Node

        # Not ready until this write (quiet past their window): a node back, as the full path says it.
        signals.nodes_changed.send(sender=Node, node_names=tuple(sorted(came_back)), heartbeat=True)
    return len(written)


def _write(batch: dict[str, tuple[datetime, dict, float | None, str]]) -> tuple[set[str], set[str]]:
    """Write the batch in one statement; if it fails, row by row, so one bad row costs no other node.
    Returns the nodes written, and those of them that were not ready before this write.

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
            return set(), set()
        log.warning("readings batch of %d nodes failed: writing them one by one", len(batch), exc_info=True)
    written: set[str] = set()
    came_back: set[str] = set()
    for name, row in batch.items():
        try:
            one, back = _write_rows({name: row})
        except (OperationalError, InterfaceError):
            raise
        except Exception:
            log.exception("readings of node %s not written: dropped", name)
            continue
        written |= one
        came_back |= back
    return written, came_back


def _write_rows(batch: dict[str, tuple[datetime, dict, float | None, str]]) -> tuple[set[str], set[str]]:
    """One UPDATE for the rows (a transaction of its own, or a savepoint inside the caller's); a row is
    written only while its stored report is the one remembered. Returns the names written, and those
    whose stored heartbeat was past its ready window (by ``heartbeat_is_fresh``'s rule) before it."""
    from django.conf import settings

    from agents.models import Node, heartbeat_is_fresh, measured_peak_of, measured_window_seconds
    from facility.power import measured_peak_sql

    if connection.vendor == "postgresql":
        table = Node._meta.db_table
        # The peak buckets are updated in the same UPDATE, from the row's own: one statement still.
        buckets_sql, peak_sql = measured_peak_sql("n.measured_peaks", "v.at", "v.watts", measured_window_seconds())
        names = sorted(batch)
        # Columns as arrays (unnest): the statement's text is the same for any number of rows, so the
        # driver does not parse a new one of thousands of placeholders for every batch (which held the
        # GIL the heartbeats' event loop needs) and the server can keep it prepared. In binary (%b): as
        # text, each sensors document would be escaped for the array's syntax, node by node in the
        # flushing thread, holding the GIL the event loop needs.
        columns = [
            names,
            [batch[name][0] for name in names],
            [json.dumps(batch[name][1]) for name in names],
            [batch[name][2] for name in names],
            [batch[name][3] for name in names],
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            # Readings may be lost (under a second of them, see above): the commit does not wait for
            # the WAL to reach the disk, which on a busy disk held the rows' locks (and the full-path
            # heartbeats waiting on them) for hundreds of milliseconds.
            cursor.execute("SET LOCAL synchronous_commit = off")
            # The rows locked first, in name order (the CTE), still one statement: two processes'
            # batches share nodes (a node's heartbeats reach either), and an UPDATE … FROM alone locks
            # in its join's order, which deadlocked them (found only after deadlock_timeout, a second
            # in the tail).
            # The locked rows' heartbeat before this write says who had gone quiet: ready_window_seconds'
            # rule (interval × LLMGW_MISSED_HEARTBEATS) in SQL, against the new heartbeat's time.
            cursor.execute(
                f"WITH locked AS (SELECT id, last_heartbeat_at, heartbeat_interval_seconds FROM {table} "
                f"WHERE name = ANY(%b::text[]){lock_clause(Node)}) "
                f"UPDATE {table} AS n SET last_heartbeat_at = v.at, sensors_at = v.at, sensors = v.sensors, "
                f"measured_watts = v.watts, measured_peaks = {buckets_sql}, measured_peak_watts = {peak_sql} "
                f"FROM unnest(%b::text[], %b::timestamptz[], %b::text[]::jsonb[], %b::double precision[], %b::text[]) "
                f"AS v(name, at, sensors, watts, digest), locked "
                f"WHERE n.id = locked.id AND n.name = v.name AND n.report_digest = v.digest "
                f"RETURNING n.name, locked.last_heartbeat_at IS NULL OR EXTRACT(EPOCH FROM v.at - "
                f"locked.last_heartbeat_at) > locked.heartbeat_interval_seconds * %s",
                [names, *columns, settings.LLMGW_MISSED_HEARTBEATS],
            )
            rows = cursor.fetchall()
            return {row[0] for row in rows}, {row[0] for row in rows if row[1]}
    written = set()
    came_back = set()
    with transaction.atomic():
        for name, (at, sensors, watts, digest) in batch.items():
            stored = (
                rows_locked(Node.objects.filter(name=name))
                .values_list("measured_peaks", "last_heartbeat_at", "heartbeat_interval_seconds")
                .first()
            )
            if stored is None:
                continue
            buckets, peak = measured_peak_of(stored[0], watts, at)
            if Node.objects.filter(name=name, report_digest=digest).update(
                last_heartbeat_at=at,
                sensors_at=at,
                sensors=sensors,
                measured_watts=watts,
                measured_peaks=buckets,
                measured_peak_watts=peak,
            ):
                written.add(name)
                if not heartbeat_is_fresh(stored[1], stored[2], at):
                    came_back.add(name)
    return written, came_back


# -- assignments -----------------------------------------------------------------------------------------

_assignments: dict[str, list[dict]] = {}
_assignments_at = -1e9
_assignments_lock = threading.Lock()  # held for swaps only, never across a read of the database
# Nodes named by invalidations since the map was read (None: all of them): their entries are not
# answered from the map until read again.
_stale_nodes: set[str] | None = set()
# Who answers "what must each node run": registered by the layer that owns assignments (placement, in
# its AppConfig.ready), so the node layer never imports it. Called with no argument it reads every
# node; with `nodes`, only those (a refresh after a change that named them). None: nothing to run.
_assignments_provider: Callable[..., dict[str, list[dict]]] | None = None


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


def answer_for(
    node_name: str, interval: float, replicas: list[dict], warnings: list[str] | None = None
) -> dict[str, Any]:
    """The heartbeat answer: the node, its interval, its replicas and, when one is wanted, its capping;
    `warnings` when some of what the heartbeat said was not taken (implausible readings)."""
    answer: dict[str, Any] = {"node": node_name, "interval_seconds": interval, "replicas": replicas}
    capping = wanted_capping(node_name)
    if capping is not None:
        answer["capping"] = capping
    if warnings:
        answer["warnings"] = warnings
    return answer


# -- plausibility of readings ----------------------------------------------------------------------------
#
# The draws the facility assumes of a card without a limit and of a node's own part (server.yaml's
# gpu_watts and node_watts) judge whether a reading is one the node can draw; read through a function the
# facility app registers (this layer may not import facility's models), kept DRAWS_SECONDS. The fast
# lane, on the event loop, never reads them: past that age its heartbeat goes through Django's path,
# which reads them again.
DRAWS_SECONDS = 10.0
_draws_reader: Callable[[], tuple[float | None, float | None]] | None = None
_draws: tuple[tuple[float | None, float | None], float] | None = None  # (gpu_watts, node_watts), when read
# The fields of each node's last dropped readings, so a log line says each change once, not every heartbeat.
_implausible_fields: dict[str, frozenset[str]] = {}
_implausible_lock = threading.Lock()


def register_draws_reader(reader: Callable[[], tuple[float | None, float | None]] | None) -> None:
    """Set the function that reads (gpu_watts, node_watts); None: nothing judged but each card's own limit."""
    global _draws_reader
    _draws_reader = reader
    forget_draws()


def forget_draws() -> None:
    """The settings changed: read the draws again at the next heartbeat that needs them."""
    global _draws
    _draws = None


def assumed_draws(*, on_event_loop: bool = False) -> tuple[float | None, float | None] | None:
    """(gpu_watts, node_watts) as the facility assumes them; None on the event loop when not read lately."""
    global _draws
    held = _draws
    if held is not None and time.monotonic() - held[1] < DRAWS_SECONDS:
        return held[0]
    if on_event_loop:
        return None
    draws = _draws_reader() if _draws_reader is not None else (None, None)
    _draws = (draws, time.monotonic())
    return draws


# Per node, what the control plane knows of it that judges its readings, as its full path last read it:
# (its max_draw_watts, its accepted cards where its heartbeat's inventory waits for an operator, else None).
# The fast lane judges only nodes it holds here; a change (an inventory accepted, a ceiling set) clears the
# node's stored report, so every process's next heartbeat of it takes the full path, which reads them again.
NodeFacts = tuple[float | None, list[dict] | None]
_facts: dict[str, NodeFacts] = {}


def node_facts_set(node_name: str, facts: NodeFacts) -> None:
    """What the full path read of the node (see _facts)."""
    with _lock:
        _facts[node_name] = facts


def node_facts(node_name: str, digest: str | None = None) -> NodeFacts | None:
    """The node's facts as this process holds them; with ``digest``, only while its last stored report is
    that one (a heartbeat saying nothing new: what judged the last judges it)."""
    with _lock:
        if digest is not None and (_known.get(node_name) or ("",))[0] != digest:
            return None
        return _facts.get(node_name)


def plausible_heartbeat(
    heartbeat: Mapping[str, Any], *, on_event_loop: bool = False, facts: NodeFacts | None = None
) -> tuple[Mapping[str, Any], list[str]] | None:
    """The heartbeat with the readings the node cannot have read dropped, and a line for each
    (agents.node.protocol.implausible_readings); the node is flagged in the sensors it stores
    (`implausible`: each reading, its value, why and its kind; absent when all was believed). The one check
    of both write paths, the fast lane and Django's. ``facts``: the node's (see _facts), read by the caller;
    else this process's. None on the event loop when the facility's draws or the node's facts are not at
    hand."""
    draws = assumed_draws(on_event_loop=on_event_loop)
    if draws is None:
        return None
    if facts is None:
        facts = _facts.get(heartbeat["node"])
        if facts is None:
            if on_event_loop:
                return None
            facts = (None, None)
    sensors, dropped = implausible_readings(
        heartbeat, gpu_watts=draws[0], node_watts=draws[1], known_gpus=facts[1], max_draw_watts=facts[0]
    )
    warnings = [implausible_text(entry) for entry in dropped]
    _log_implausible(heartbeat["node"], dropped, warnings)
    if not dropped:
        return heartbeat, []
    return {**heartbeat, "sensors": sensors}, warnings


def _log_implausible(node_name: str, dropped: list[dict], warnings: list[str]) -> None:
    fields = frozenset(entry["reading"] for entry in dropped)
    with _implausible_lock:
        if _implausible_fields.get(node_name, frozenset()) == fields:
            return
        if fields:
            _implausible_fields[node_name] = fields
        else:
            _implausible_fields.pop(node_name, None)
    if dropped:
        log.warning("node %s: implausible readings dropped: %s", node_name, "; ".join(warnings))
    else:
        log.info("node %s: its readings are plausible again", node_name)


def register_assignments_provider(provider: Callable[..., dict[str, list[dict]]]) -> None:
    """Set the function that reads every node's assignments in one go (node name → list), or with
    `nodes=` only those nodes'."""
    global _assignments_provider
    _assignments_provider = provider
    invalidate_assignments()


def invalidate_assignments(*, nodes: Iterable[str] | None = None, **_: Any) -> None:
    """A placement changed in this process: the map is read again (only `nodes`' entries, when named).

    With the refresher running (a served process) the read happens there, at once; without it, the next
    heartbeat that needs the map reads it.
    """
    global _stale_nodes
    named = None if nodes is None else set(nodes)
    with _assignments_lock:
        _stale_nodes = None if named is None or _stale_nodes is None else _stale_nodes | named
        for read in _reads:
            read.changed(named)
    if _refresher is not None:
        _refresher.wake()


def _max_age() -> float:
    # With the refresher reading every ASSIGNMENTS_SECONDS, a map is kept past that while the next read is
    # under way, up to MAP_KEPT_SECONDS, rather than sending every heartbeat of that moment down the full
    # path. A read is slow when the process is short of CPU, and the full path costs far more than the
    # lane: a map dropped after a few seconds sent the heartbeats of known nodes down the full path just
    # when the process could least afford it, and it fell further behind (nodes joining at once). This
    # process's own changes still make their nodes' entries stale at once.
    return max(ASSIGNMENTS_SECONDS, MAP_KEPT_SECONDS) if _refresher is not None else ASSIGNMENTS_SECONDS


def cached_assignments(node_name: str) -> list[dict] | None:
    """The node's assignments from the map if it is fresh, else None; never reads the database."""
    if time.monotonic() - _assignments_at > _max_age():
        return None
    stale = _stale_nodes
    if stale is None or node_name in stale:
        return None
    return _assignments.get(node_name, [])


class _Read:
    """One read of the map under way: what was invalidated while it ran (None: everything) stays stale."""

    def __init__(self):
        self.since: set[str] | None = set()

    def changed(self, nodes: set[str] | None) -> None:
        self.since = None if nodes is None or self.since is None else self.since | nodes


_reads: list[_Read] = []


def _read(nodes: set[str] | None) -> None:
    """Read the map (all of it, or `nodes`' entries) and swap it in; what changed during the read stays
    stale, so a change is never hidden by a read that began before it, and a storm of changes still
    lets every read make progress."""
    global _assignments, _assignments_at, _capping, _stale_nodes
    read = _Read()
    with _assignments_lock:
        _reads.append(read)
    try:
        read_at = time.monotonic()
        provider = _assignments_provider
        if provider is None:
            fresh: dict[str, list[dict]] = {}
        else:
            fresh = provider() if nodes is None else provider(nodes=sorted(nodes))
        capping = dict(_capping_provider()) if _capping_provider is not None else {}
    finally:
        with _assignments_lock:
            _reads.remove(read)
    with _assignments_lock:
        if nodes is None:
            _assignments, _assignments_at, _stale_nodes = fresh, read_at, read.since
        else:
            merged = dict(_assignments)
            for name in nodes:
                merged[name] = fresh.get(name, [])
            _assignments = merged
            if _stale_nodes is not None:
                kept = nodes if read.since is None else nodes & read.since
                _stale_nodes = (_stale_nodes - nodes) | kept
        _capping = capping


def assignments(node_name: str) -> list[dict]:
    """What the node must run, from a map of all nodes read at most once a second.

    The read happens with no lock held: a request thread waiting on a lock while it holds a pooled
    connection, behind one that needs a connection to finish its read, would starve the pool. Where
    the refresher keeps the map (a served process), a node the map cannot answer for yet is read
    alone: its heartbeat never waits on a read of every node.
    """
    cached = cached_assignments(node_name)
    if cached is not None:
        return cached
    if _refresher is not None and _assignments_at > 0:
        _refresher.wake()
        if _assignments_provider is None:
            return []
        return _assignments_provider(nodes=[node_name]).get(node_name, [])
    stale = _stale_nodes
    if stale is not None and time.monotonic() - _assignments_at <= _max_age():
        _read(stale | {node_name})  # the map is fresh but for the nodes changes named: read those alone
    else:
        _read(None)
    return _assignments.get(node_name, [])


class Refresher:
    """A thread that keeps the map of assignments fresh off the requests' path: it reads every
    ASSIGNMENTS_SECONDS, and at once when woken by a change (only the named nodes when it names them).
    It also runs `every`'s (seconds, function) pairs at their pace: other caches the fast lane reads."""

    def __init__(self, every: Iterable[tuple[float, Callable[[], None]]] = ()):
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="llmgw-assignments", daemon=True)
        self._every = [[seconds, task, time.monotonic() + seconds] for seconds, task in every]

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop:
            woken = self._wake.wait(ASSIGNMENTS_SECONDS)
            self._wake.clear()
            if self._stop:
                break
            stale = _stale_nodes
            due = time.monotonic() - _assignments_at >= ASSIGNMENTS_SECONDS
            try:
                if due or stale is None:
                    _read(None)
                elif woken and stale:
                    _read(set(stale))
                for entry in self._every:
                    seconds, task, at = entry
                    if time.monotonic() >= at:
                        entry[2] = time.monotonic() + seconds
                        task()
            except Exception:
                log.exception("map of assignments not read; trying again")
            finally:
                close_old_connections()
                connection.close()


_refresher: Refresher | None = None


def refresher_start(every: Iterable[tuple[float, Callable[[], None]]] = ()) -> None:
    """Read the map now and run `every`'s functions once (the server's start: no first heartbeat waits on
    them), then keep it fresh in a thread, which also runs `every` at its pace (see Refresher). Called by
    the ASGI lifespan's startup (agents.asgi)."""
    global _refresher
    every = list(every)
    try:
        _read(None)
        for _, task in every:
            task()
    except Exception:  # the database not up yet: the refresher reads it as soon as it can
        log.warning("map of assignments not read at start", exc_info=True)
    finally:
        close_old_connections()
        connection.close()
    if _refresher is None:
        _refresher = Refresher(every)
        _refresher.start()


def refresher_stop() -> None:
    global _refresher
    refresher, _refresher = _refresher, None
    if refresher is not None:
        refresher.stop()
