"""The guarded commit of one replica's plan, with its two SQL backends (PostgreSQL, portable).

The shape of a placement:

1. plan on plain reads (a :class:`placement.index.PlacementIndex` built once per reconcile run);
2. in one transaction (a savepoint when nested): lock the replica, then the Budget rows of every
   domain its shards count against in sorted order, then the chosen nodes sorted by name; re-check
   against the locked rows (node ready, not cordoned, not held; domain power from the locked
   figures; GPUs through the unique (node, card) of GpuBooking, cores and memory through the guarded
   write of NodeBooking); write shards, GPU bookings, node bookings;
3. a failed re-check is a lost race: the transaction (savepoint) rolls back, the node is excluded, the
   index takes the fresh view of what changed, and the replica is planned again, at most
   :data:`MAX_ATTEMPTS` times.

Locking budgets, not just nodes, is what keeps two shards on two nodes of one rack from both taking
its last kilowatt. On SQLite (the embedded default) ``select_for_update`` is a no-op and the
IMMEDIATE transaction mode serialises writers instead.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone

from agents.models import GPU, Node, NodeDomain, heartbeat_is_fresh, measured_fresh_seconds
from facility.domains import domains_of as domains_of_labels
from facility.models import Budget, Hold
from facility.power import Budget as BudgetFigures
from facility.power import node_draw_sql, node_use_added_watts
from llmgw.sqlin import sql_in
from placement import snapshot
from placement.explain import pending_explain, placed_explain
from placement.index import PlacementIndex
from placement.models import GpuBooking, NodeBooking, Replica, ReplicaState, Shard
from placement.planner import FacilityView, NoFit, Plan, ReplicaRequest, power_rejection_in
from placement.signals import placement_changed_on_commit

MAX_ATTEMPTS = 3

log = logging.getLogger(__name__)

# A replica to place: its model instance, or what a reconcile loads of a pending one.
Pending = Replica | snapshot.PendingReplica


_collector_lock = threading.Lock()
_collector_pauses = 0
_collector_was_enabled = False
_collected_at = 0.0
# Runs that overlap without end (threads of one served process) still collect this often.
COLLECT_EVERY_SECONDS = 30.0


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a placement run, back as it was after the last of
    nested (or concurrent) runs ends.

    A run allocates a tuple or two per node it ranks and per plan it makes, and every few thousand
    allocations the collector walks every object the process holds (the index, Django's models and
    querysets): 10-15 % of a batched run at 1,000 nodes (bench/placements.py, 564-581/s with it,
    630-685/s without). What is freed by reference counting is freed as ever; only cycles made during
    the run wait for the collector's next pass after it, and runs that keep overlapping (threads of one
    process) collect once every COLLECT_EVERY_SECONDS as each ends.
    """
    global _collector_pauses, _collector_was_enabled, _collected_at
    with _collector_lock:
        if _collector_pauses == 0:
            _collector_was_enabled = gc.isenabled()
            _collected_at = time.monotonic()
            gc.disable()
        _collector_pauses += 1
    try:
        yield
    finally:
        collect = False
        with _collector_lock:
            _collector_pauses -= 1
            if _collector_pauses == 0:
                if _collector_was_enabled:
                    gc.enable()
            elif _collector_was_enabled and time.monotonic() - _collected_at >= COLLECT_EVERY_SECONDS:
                _collected_at = time.monotonic()
                collect = True
        if collect:
            gc.collect()


class ReplicaGone(Exception):
    """The replica was placed or removed by someone else while this plan was made: nothing to write."""


class LostRace(Exception):
    """A re-check against the locked rows failed: someone else took what the plan counted on."""

    def __init__(self, node: str, reason: str, refresh: Iterable[str] = ()):
        super().__init__(reason)
        self.node = node
        self.reason = reason
        # Nodes whose view the index must take afresh (the node, or a domain's members).
        self.refresh = {node, *refresh}


def _locked_state(
    cursor, names: list[str], touched: list[str], facility: FacilityView, now: datetime
) -> tuple[
    dict[str, tuple], dict[str, tuple[float, float]], dict[str, str], dict[str, float], dict[str, tuple[float, float]]
]:
    """Lock the budgets (sorted by domain), then the nodes (sorted by name); read them, holds and use.

    Returns (node rows by name, budgets (cap, other) by domain, holds by domain, each locked budget's
    domain use, each node's (placed, max(placed, fresh measured)) when a budget is touched). Raw SQL:
    this is the hot path of every placement.
    """
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    # The replica row is not locked here: the write's guarded UPDATE of it (state still pending) is
    # the check, and saves a round trip on every placement.
    budgets: dict[str, tuple[float, float]] = {}
    if touched:
        where, params = sql_in("domain", touched)
        cursor.execute(
            # The effective cap (Budget.effective_cap_watts): a written cap never above the feeds'.
            f"SELECT domain, CASE WHEN feed_cap_watts IS NOT NULL AND feed_cap_watts < cap_watts "
            f"THEN feed_cap_watts ELSE cap_watts END, other_watts FROM {Budget._meta.db_table} "
            f"WHERE {where} ORDER BY domain{lock}",
            params,
        )
        budgets = {domain: (cap, other) for domain, cap, other in cursor.fetchall()}
    if budgets and lock:
        # Every member of the budgeted domains too, by name (the one node order): a heartbeat raising a
        # member's measured draw waits for this commit, or has committed before the sums below are
        # read; else a drift landing between the read and the commit could carry the domain past its
        # limit with fresh data at the commit. The chosen nodes are among them.
        named, named_params = sql_in("name", names)
        member, member_params = sql_in("domain", sorted(budgets))
        cursor.execute(
            f"SELECT 1 FROM {Node._meta.db_table} WHERE {named} OR id IN "
            f"(SELECT node_id FROM {NodeDomain._meta.db_table} WHERE {member}) "
            f"ORDER BY name{lock}",
            [*named_params, *member_params],
        )
    # One statement for the rest: it starts after the budget locks are held, so the members' draws it
    # sums include every placement committed into those domains before us. The nodes are locked in it,
    # by name, before the sums are read.
    node_table = Node._meta.db_table
    named, named_params = sql_in("name", names)
    sql = (
        f"WITH locked AS MATERIALIZED (SELECT name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"labels FROM {node_table} WHERE {named} ORDER BY name{lock}) "
        f"SELECT 'node', name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"CAST(labels AS text), CAST(NULL AS double precision) FROM locked"
    )
    params: list[Any] = list(named_params)
    domains = sorted(budgets)
    if touched:
        held, held_params = sql_in("domain", touched)
        sql += (
            f" UNION ALL SELECT 'hold', domain, NULL, NULL, NULL, NULL, reason, NULL "
            f"FROM {Hold._meta.db_table} WHERE {held}"
        )
        params += held_params
    if domains:
        # node_watts (added below, per member) + the larger of placed and fresh measured draw: the rule
        # of facility.power.node_use_watts, as the SQL that module builds from the same figures.
        fresh_after = now - timedelta(seconds=measured_fresh_seconds())
        sql += (
            f" UNION ALL SELECT 'use', nd.domain, COUNT(*), NULL, NULL, NULL, NULL, "
            f"SUM({node_draw_sql('n', placed='COALESCE(b.placed_watts, 0)')}) "
            f"FROM {NodeDomain._meta.db_table} nd JOIN {node_table} n ON n.id = nd.node_id "
            f"LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE {sql_in('nd.domain', domains)[0]} GROUP BY nd.domain"
        )
        params += [connection.ops.adapt_datetimefield_value(fresh_after), *sql_in("", domains)[1]]
        # Each placed node's placed draw and its term less node_watts, by the same SQL rule: the check
        # is on the use after the shard, max(placed + shard, measured), as facility.power says it.
        sql += (
            f" UNION ALL SELECT 'placed', n.name, NULL, NULL, NULL, NULL, NULL, COALESCE(b.placed_watts, 0) "
            f"FROM {node_table} n LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE {sql_in('n.name', names)[0]}"
            f" UNION ALL SELECT 'drawn', n.name, NULL, NULL, NULL, NULL, NULL, "
            f"{node_draw_sql('n', placed='COALESCE(b.placed_watts, 0)')} "
            f"FROM {node_table} n LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE {sql_in('n.name', names)[0]}"
        )
        params += [*named_params, connection.ops.adapt_datetimefield_value(fresh_after), *named_params]
    cursor.execute(sql, params)
    nodes: dict[str, tuple] = {}
    holds: dict[str, str] = {}
    node_watts = facility.settings.node_watts or 0
    use = {domain: budgets[domain][1] for domain in domains}
    draws: dict[str, list[float]] = {}
    for kind, key, a, b, c, d, reason, drawn in cursor.fetchall():
        if kind == "node":
            # The labels are the locked row's latest: a relabel committed since the plan is seen here.
            nodes[key] = (key, a, b, c, d, reason)
        elif kind == "hold":
            holds[key] = reason
        elif kind == "use":
            use[key] += a * node_watts + (drawn or 0)
        else:
            draws.setdefault(key, [0.0, 0.0])[kind == "drawn"] = drawn or 0.0
    return nodes, budgets, holds, use, {name: (placed, drawn) for name, (placed, drawn) in draws.items()}


class _Locked:
    """What _locked_state read under the locks, and what the plans checked so far take from it.

    The plans of one batch are checked in turn: each one's shards count against the domains and nodes
    with what the plans before it took (``taken`` per domain, ``extra`` placed watts per node).
    """

    def __init__(self, nodes, budget_rows, held, use, draws) -> None:
        self.nodes, self.held, self.use, self.draws = nodes, held, use, draws
        self.budgets = {
            d: BudgetFigures(snapshot.domain_of(d), cap, other) for d, (cap, other) in budget_rows.items()
        }
        self.taken: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.extra: dict[str, float] = defaultdict(float)
        self.refusals: dict[str, str | None] = {}
        self.budgeted: dict[str, list[str]] = {}  # each node's budgeted domains, in level order

    def _node_refusal(self, name: str, domains: list[str], now: datetime) -> str | None:
        """Why the locked row of a chosen node refuses any shard (gone, cordoned, not ready, moved, held)."""
        row = self.nodes.get(name)
        if row is None:
            return f"{name}: the node is gone"
        if row[2]:
            return f"{name}: cordoned meanwhile"
        if not _is_ready(row[3], row[4], now):
            return f"{name}: not ready any more"
        if _location_of(row[5] or "{}") != tuple(sorted(domains)):  # the labels as text (CAST in the SQL)
            return f"{name}: its location changed meanwhile"
        for domain in domains:
            if domain in self.held:
                return f"{name}: {domain.replace(':', ' ', 1)} is held: {self.held[domain]}"
        return None

    def check(self, shards, domains_of: dict[str, list[str]], facility: FacilityView, now: datetime) -> None:
        """Re-check one plan against the locked rows; raises LostRace. Once it passes, it is counted."""
        for shard in shards:
            name = shard.node
            # The node's own verdict, once per node for all the plans of a batch (the rows do not move).
            if name not in self.refusals:
                self.refusals[name] = self._node_refusal(name, domains_of[name], now)
            if self.refusals[name] is not None:
                raise LostRace(name, self.refusals[name])
        if not self.budgets:
            return
        # This plan's own shards count with one another (a replica over two nodes of one rack), and
        # with what the plans checked before it in this transaction took.
        # Counted into self.taken and self.extra only once every shard passed.
        taken = self.taken
        mine_taken: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        mine_extra: dict[str, float] = defaultdict(float)
        for shard in shards:
            mine = self.budgeted.get(shard.node)
            if mine is None:
                mine = self.budgeted[shard.node] = _level_sorted(
                    tuple(d for d in domains_of[shard.node] if d in self.budgets)
                )
            placed, drawn = self.draws.get(shard.node, (0.0, 0.0))
            # The SQL gives max(placed, measured): a measurement counts where it passes the placed.
            measured = drawn if drawn > placed else None
            before = placed + self.extra.get(shard.node, 0.0) + mine_extra[shard.node]
            added = node_use_added_watts(before, measured, shard.draw_watts, facility.settings)
            reason = power_rejection_in(
                [
                    (self.budgets[d], self.use[d] + (taken[d][0] if d in taken else 0.0), *mine_taken[d])
                    for d in mine
                ],
                shard.draw_watts,
                added,
                facility.settings.margin,
            )
            if reason is not None:
                raise LostRace(shard.node, f"{shard.node}: {reason}", refresh=snapshot.members_of(mine))
            for d in mine:
                mine_taken[d][0] += added
                mine_taken[d][1] += shard.draw_watts or 0
            mine_extra[shard.node] += shard.draw_watts or 0
        for d, (added, draw) in mine_taken.items():
            self.taken[d][0] += added
            self.taken[d][1] += draw
        for name, watts in mine_extra.items():
            self.extra[name] += watts


# A fleet's locked rows repeat from batch to batch: each stored labels text (and each node's set of
# budgeted domains) is worked out once, not once a batch (a tenth of a batch's check at 1,000 nodes).
# Both are kept within bounds: a labels text may be ~130 KB (256 labels), so only the short ones are
# kept, 16,384 of them (16 MiB at most); a set of budgeted domains is a rack's and its PDUs'.
_LABELS_TEXT_KEPT = 1024


def _location_parsed(labels_text: str) -> tuple[str, ...]:
    """The domains a node's stored labels (its row's JSON text) put it in, as sorted texts."""
    return tuple(sorted(str(d) for d in domains_of_labels(json.loads(labels_text))))


_location_kept = functools.lru_cache(maxsize=16384)(_location_parsed)


def _location_of(labels_text: str) -> tuple[str, ...]:
    """_location_parsed, kept for the texts of a usual size."""
    if len(labels_text) > _LABELS_TEXT_KEPT:
        return _location_parsed(labels_text)
    return _location_kept(labels_text)


@functools.lru_cache(maxsize=4096)
def _level_sorted(domains: tuple[str, ...]) -> tuple[str, ...]:
    """snapshot.level_sorted, kept."""
    return tuple(snapshot.level_sorted(domains))


def _is_ready(last_heartbeat_at: datetime | str | None, interval: float, now: datetime) -> bool:
    """Node.is_ready on the locked row's columns (raw SQL: SQLite answers with naive text)."""
    if isinstance(last_heartbeat_at, str):
        last_heartbeat_at = datetime.fromisoformat(last_heartbeat_at)
    if last_heartbeat_at is not None and timezone.is_naive(last_heartbeat_at):
        last_heartbeat_at = timezone.make_aware(last_heartbeat_at, UTC)
    return heartbeat_is_fresh(last_heartbeat_at, interval, now)


def _commit(
    replica_id: int, plan: Plan, index: PlacementIndex, explain: dict[str, Any], now: datetime
) -> bool:
    """Lock, re-check and write one plan; False when the replica is no longer pending. Raises LostRace."""
    shards = sorted(plan.shards, key=lambda s: s.node)
    names = [s.node for s in shards]
    facility = index.facility
    domains_of = {name: [str(d) for d in index.node(name).domains] for name in names}
    touched = sorted({d for ds in domains_of.values() for d in ds})
    with connection.cursor() as cursor:
        locked = _Locked(*_locked_state(cursor, names, touched, facility, now))
        locked.check(shards, domains_of, facility, now)
        ids = {name: locked.nodes[name][1] for name in names}
        if connection.vendor == "postgresql":
            return _write_postgresql(cursor, replica_id, shards, ids, explain, now, touched)
        return _write_portable(replica_id, shards, ids, explain, now)


def _write_postgresql(
    cursor, replica_id: int, shards, ids: dict[str, int], explain, now: datetime, touched: list[str]
) -> bool:
    """One replica's writes: the batch statement with one plan in it."""
    gone, lost = _write_postgresql_batch(cursor, [(replica_id, shards, explain)], ids, now, touched)
    if lost:
        raise lost[0]
    if gone:
        raise ReplicaGone()
    return True


def _write_postgresql_batch(
    cursor, plans: list[tuple[int, list, dict]], ids: dict[str, int], now: datetime, touched: list[str]
) -> tuple[set[int], list[LostRace]]:
    """The batch statement, run and read (see _batch_write)."""
    cursor.execute(*_batch_write(plans, ids, now, touched))
    return _batch_written(cursor.fetchone(), plans, ids)


# The SQLSTATE of placement_lost_race() (migration 0005): a batch statement sent with strict=True found
# a lost race, and its transaction is aborted.
LOST_RACE = "LL001"


def _batch_write(
    plans: list[tuple[int, list, dict]], ids: dict[str, int], now: datetime, touched: list[str], *, strict: bool = False
) -> tuple[str, list[Any]]:
    """Shards, GPU bookings, node counters and the replicas of several plans in one statement: its SQL
    and parameters.

    ``plans`` are (replica id, shards, explain). The guards are in the statement's WHERE clauses. Its
    row (_batch_written) says which replicas were no longer pending, which wrote nothing, and the lost
    races: any lost race means the caller must roll the statement back, as it wrote the rest. Holds are checked again
    here: hold_create locks the domain's nodes before it writes, so a hold that raced the read before
    the node locks has committed by the time this statement starts, and is seen.
    """
    # Every list travels as one array parameter, so the statement's text is the same whatever the batch
    # (parsed once and prepared), in binary (%b: no escaping of the explain texts); a shard's cards as
    # the text of an int[] ('{0,1}'), arrays being square.
    hold_guard = f"NOT EXISTS (SELECT 1 FROM {Hold._meta.db_table} WHERE domain = ANY(%b::text[]))" if touched else "TRUE"
    rows = [(replica_id, s) for replica_id, shards, _ in plans for s in shards]
    params: list[Any] = [
        [replica_id for replica_id, _ in rows],
        [ids[s.node] for _, s in rows],
        ["{" + ",".join(str(i) for i in s.gpu_indices) + "}" for _, s in rows],
        [s.cpu_cores for _, s in rows],
        [s.memory_gib for _, s in rows],
        [s.draw_watts for _, s in rows],
    ]
    replica_ids = [replica_id for replica_id, _, _ in plans]
    explains = [json.dumps(explain) for _, _, explain in plans]
    guard_params = [list(touched)] if touched else []
    # Strict, a lost race raises (placement_lost_race): the transaction is aborted whatever follows it,
    # so a COMMIT sent behind the statement without waiting for it rolls back instead. Lost: held
    # meanwhile, a card not booked (taken, or gone), a node's cores or memory not counted.
    strict_check = (
        ", CASE WHEN NOT o.unheld"
        " OR cardinality(o.booked) <> (SELECT COALESCE(SUM(cardinality(v.gpus)), 0) FROM v JOIN r ON r.id = v.replica_id)"
        " OR cardinality(o.counted) <> (SELECT count(DISTINCT v.node_id) FROM v JOIN r ON r.id = v.replica_id)"
        " THEN placement_lost_race() END"
        if strict else ""
    )
    return (
        f"""
        WITH v(replica_id, node_id, gpus, cores, mem, draw) AS (
            SELECT replica_id, node_id, CAST(gpus AS int[]), cores, mem, draw
            FROM unnest(%b::bigint[], %b::bigint[], %b::text[], %b::int[], %b::float8[], %b::float8[])
                AS u(replica_id, node_id, gpus, cores, mem, draw)
        ),
        r AS (
            -- First, and the rest hangs on it: a replica another placer took meanwhile (this UPDATE
            -- waits for its commit, then finds it no longer pending) writes nothing at all. Found by
            -- the ids alone (an index condition) and given its explain by its place among them: joined
            -- to a list instead, a replica table whose statistics lag a bulk change (a lost room's
            -- replacements) was read whole or matched row by row, 9 of a batch's 20 ms.
            UPDATE {Replica._meta.db_table} AS rep SET state = %s, reason = '',
                explain = CAST((%b::text[])[array_position(%b::bigint[], rep.id)] AS jsonb),
                placed_at = %s, ready_since = NULL
            WHERE rep.id = ANY(%b::bigint[]) AND rep.state = %s AND {hold_guard} RETURNING rep.id
        ),
        s AS (
            INSERT INTO {Shard._meta.db_table}
                (replica_id, node_id, gpu_indices, cpu_cores, memory_gib, draw_watts, state, restarts, message,
                 created_at)
            SELECT r.id, v.node_id, to_jsonb(v.gpus), v.cores, v.mem, v.draw, %s, 0, '', %s
            FROM v JOIN r ON r.id = v.replica_id
            RETURNING id, node_id, replica_id
        ),
        g AS (
            -- A card booked already (by a commit before this one, or one waited for) is a conflict on
            -- the unique (node, index): not inserted, so not counted.
            INSERT INTO {GpuBooking._meta.db_table} AS gb (shard_id, node_id, index)
            SELECT s.id, s.node_id, gpu.index FROM s JOIN v ON v.node_id = s.node_id AND v.replica_id = s.replica_id
            JOIN {GPU._meta.db_table} AS gpu ON gpu.node_id = s.node_id AND gpu.index = ANY(v.gpus) AND gpu.present
            ON CONFLICT (node_id, index) DO NOTHING
            RETURNING gb.shard_id
        ),
        a AS (
            -- One row per node (an upsert may touch a row once): the shards of the plans written.
            SELECT v.node_id, SUM(v.cores) AS cores, SUM(v.mem) AS mem, SUM(COALESCE(v.draw, 0)) AS draw
            FROM v JOIN r ON r.id = v.replica_id GROUP BY v.node_id
        ),
        n AS (
            -- The node's first shard makes its booking row; later ones add to it. Either way the
            -- guard is the node's capacity against what is booked with these shards.
            INSERT INTO {NodeBooking._meta.db_table} AS nb (node_id, cpu_cores, memory_gib, placed_watts)
            SELECT a.node_id, a.cores, a.mem, a.draw
            FROM a JOIN {Node._meta.db_table} AS node ON node.id = a.node_id
            WHERE node.cpu_cores >= a.cores AND node.memory_gib >= a.mem - 1e-9
            ON CONFLICT (node_id) DO UPDATE SET
                cpu_cores = nb.cpu_cores + EXCLUDED.cpu_cores,
                memory_gib = nb.memory_gib + EXCLUDED.memory_gib,
                placed_watts = nb.placed_watts + EXCLUDED.placed_watts
            WHERE (SELECT node.cpu_cores >= nb.cpu_cores + EXCLUDED.cpu_cores
                          AND node.memory_gib >= nb.memory_gib + EXCLUDED.memory_gib - 1e-9
                   FROM {Node._meta.db_table} AS node WHERE node.id = nb.node_id)
            RETURNING nb.node_id
        )
        SELECT o.*{strict_check} FROM (
            SELECT ARRAY(SELECT shard_id FROM g) AS booked, ARRAY(SELECT ARRAY[id, node_id, replica_id] FROM s),
                ARRAY(SELECT node_id FROM n) AS counted, ARRAY(SELECT id FROM r), {hold_guard} AS unheld
        ) AS o
        """,
        [
            *params,
            ReplicaState.PLACED.value,
            explains,
            replica_ids,
            now,
            replica_ids,
            ReplicaState.PENDING.value,
            *guard_params,
            ReplicaState.PLACED.value,
            now,
            *guard_params,
        ],
    )


def _batch_written(
    row: tuple, plans: list[tuple[int, list, dict]], ids: dict[str, int]
) -> tuple[set[int], list[LostRace]]:
    """What the batch statement's row says: the replicas no longer pending, and the lost races."""
    booked, written, counted, placed, unheld, *_ = row
    if not unheld:
        node = plans[0][1][0].node
        return set(), [LostRace(node, f"{node}: a domain it is in was held meanwhile")]
    gone = {replica_id for replica_id, _, _ in plans} - set(placed)
    per_shard = Counter(booked)
    shard_of = {(replica_id, node_id): shard_id for shard_id, node_id, replica_id in written}
    lost: list[LostRace] = []
    counted = set(counted)
    for replica_id, shards, _ in plans:
        if replica_id in gone:
            continue
        for s in shards:
            node_id = ids[s.node]
            if per_shard[shard_of[(replica_id, node_id)]] != len(s.gpu_indices):
                lost.append(LostRace(s.node, f"{s.node}: GPUs {_indices(s.gpu_indices)} were booked meanwhile"))
            elif node_id not in counted:
                lost.append(LostRace(s.node, f"{s.node}: its cores or memory were booked meanwhile"))
    return gone, lost


def _write_portable(replica_id: int, shards, ids: dict[str, int], explain, now: datetime) -> bool:
    """The same writes and guards, one statement each (SQLite, where writers are serialised anyway)."""
    if not Replica.objects.filter(pk=replica_id, state=ReplicaState.PENDING).update(
        state=ReplicaState.PLACED, reason="", explain=explain, placed_at=now, ready_since=None
    ):
        return False
    created = Shard.objects.bulk_create(
        [
            Shard(
                replica_id=replica_id,
                node_id=ids[s.node],
                gpu_indices=list(s.gpu_indices),
                cpu_cores=s.cpu_cores,
                memory_gib=s.memory_gib,
                draw_watts=s.draw_watts,
            )
            for s in shards
        ]
    )
    for shard, row in zip(shards, created, strict=True):
        node_id = ids[shard.node]
        if shard.gpu_indices:
            present = list(
                GPU.objects.filter(node_id=node_id, index__in=shard.gpu_indices, present=True).values_list(
                    "index", flat=True
                )
            )
            # A card booked already is a conflict on the unique (node, index): left as it was.
            GpuBooking.objects.bulk_create(
                [GpuBooking(shard_id=row.pk, node_id=node_id, index=i) for i in present], ignore_conflicts=True
            )
            if GpuBooking.objects.filter(shard_id=row.pk).count() != len(shard.gpu_indices):
                raise LostRace(
                    shard.node, f"{shard.node}: GPUs {_indices(shard.gpu_indices)} were booked meanwhile"
                )
        NodeBooking.objects.bulk_create([NodeBooking(node_id=node_id)], ignore_conflicts=True)
        updated = NodeBooking.objects.filter(
            node_id=node_id,
            node__cpu_cores__gte=F("cpu_cores") + shard.cpu_cores,
            node__memory_gib__gte=F("memory_gib") + shard.memory_gib - 1e-9,
        ).update(
            cpu_cores=F("cpu_cores") + shard.cpu_cores,
            memory_gib=F("memory_gib") + shard.memory_gib,
            placed_watts=F("placed_watts") + (shard.draw_watts or 0),
        )
        if updated != 1:
            raise LostRace(shard.node, f"{shard.node}: its cores or memory were booked meanwhile")
    return True


def _indices(indices: Iterable[int]) -> str:
    from placement.selectors import gpus_text

    return gpus_text(indices)


@dataclass
class Placement:
    """The outcome of placing one replica: the plan committed, or the reason it stays pending."""

    plan: Plan | None = None
    reason: str = ""
    gone: bool = False


def replica_place(
    *, replica: Pending, request: ReplicaRequest, index: PlacementIndex, now: datetime | None = None
) -> Placement:
    """Plan and commit one pending replica through the guarded commit; record why when it cannot go."""
    now = now or timezone.now()
    exclude: set[str] = set()
    conflicts: list[str] = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = index.plan(request, exclude=frozenset(exclude))
        if isinstance(result, NoFit):
            if conflicts:
                # The nodes it lost races for are excluded: say so, rather than a bare no-fit.
                return replica_pending(replica, result.summary, pending_explain(result) | {"conflicts": conflicts})
            return replica_pending(replica, result.summary, pending_explain(result))
        explain = placed_explain(result, attempts=attempt, conflicts=conflicts)
        try:
            with transaction.atomic():
                committed = _commit(replica.pk, result, index, explain, now)
        except ReplicaGone:
            committed = False
        except LostRace as race:
            conflicts.append(race.reason)
            exclude.add(race.node)
            for view in snapshot.node_views(names=race.refresh, now=now):
                index.update_node(view)
            continue
        if not committed:
            return Placement(gone=True)
        index.apply(result)
        replica.state = ReplicaState.PLACED
        placement_changed_on_commit(nodes=result.nodes)
        return Placement(plan=result)
    reason = f"Unschedulable after {MAX_ATTEMPTS} conflicting attempts: {'; '.join(conflicts)}"
    return replica_pending(replica, reason, {"summary": reason, "conflicts": conflicts, "rejections": []})


def replicas_pending_mark(replicas: list[Pending], reason: str, explain: dict | None) -> None:
    """Record why these pending replicas wait, where that changed (what replica_pending does, in bulk)."""
    changed = [r.pk for r in replicas if r.reason != reason or r.explain != explain]
    for start in range(0, len(changed), 500):  # SQLite takes a bounded number of parameters
        Replica.objects.filter(pk__in=changed[start : start + 500], state=ReplicaState.PENDING).update(
            reason=reason, explain=explain
        )
    for replica in replicas:
        replica.reason, replica.explain = reason, explain


def replica_pending(replica: Pending, reason: str, explain: dict[str, Any]) -> Placement:
    """Record why a replica waits (only when that changed); the pending outcome."""
    if replica.reason != reason or replica.explain != explain:
        Replica.objects.filter(pk=replica.pk, state=ReplicaState.PENDING).update(
            reason=reason, explain=explain
        )
        replica.reason, replica.explain = reason, explain
    return Placement(reason=reason)


# Plans committed together in one transaction by replicas_place (PostgreSQL): the commit, not the
# plan, is what one placement at a time waits on. A batch locks the members of the budgeted domains it
# touches (most of a small cluster's nodes, whatever its size): 128 plans a batch placed 1,143/s at
# 1,000 nodes where 64 placed 840/s (bench/placements.py), each transaction still well under a second.
BATCH = 128


@dataclass
class _Pending:
    """A replica of a batch: its tries so far, what it lost, the nodes excluded since."""

    replica: Pending
    attempt: int = 1
    conflicts: list[str] = field(default_factory=list)
    exclude: set[str] = field(default_factory=set)
    plan: Plan | None = None
    explain: dict[str, Any] | None = None
    tried: bool = False  # planned once at least: counted against a run's bound on tries


@dataclass
class Lane:
    """One model's pending replicas in a placement run (:func:`lanes_place`), and what became of them.

    ``outcomes`` has each replica tried, by id; ``stopped`` is the replica nothing fitted (the ones after
    it were not tried: they ask the same and get the same); ``cut`` says the run's bound on tries came
    first; ``error`` is what its placement raised (the run stops there: the caller decides the rest).
    """

    replicas: list[Pending]
    request: ReplicaRequest
    outcomes: dict[int, Placement] = field(default_factory=dict)
    stopped: Pending | None = None
    cut: bool = False
    error: Exception | None = None
    queue: list[_Pending] = field(init=False, repr=False)
    existing: list[frozenset[str]] = field(init=False, repr=False)  # the model's replicas, as planned
    held: NoFit | None = field(default=None, init=False, repr=False)  # its no-fit, behind the batch in flight

    def __post_init__(self) -> None:
        self.queue = [_Pending(r) for r in self.replicas]
        self.existing = list(self.request.existing)

    def tried(self) -> list[tuple[Pending, Placement]]:
        """Each replica tried with its outcome, in order."""
        return [(r, self.outcomes[r.pk]) for r in self.replicas if r.pk in self.outcomes]

    def counts(self) -> Placed:
        """The replicas tried, placed, and left pending so far."""
        counts = Placed(tried=len(self.outcomes))
        for outcome in self.outcomes.values():
            if outcome.plan is not None:
                counts.placed += 1
            elif not outcome.gone:
                counts.pending += 1
        return counts

    def untried(self) -> list[Pending]:
        """The replicas with no outcome, in order: after the stop, past the bound, or left by an error."""
        return [r for r in self.replicas if r.pk not in self.outcomes]


def replicas_place(
    *,
    replicas: list[Pending],
    request: ReplicaRequest,
    index: PlacementIndex,
    now: datetime | None = None,
    batch: int = BATCH,
) -> tuple[list[tuple[Pending, Placement]], Pending | None]:
    """Plan and commit one model's pending replicas in order, up to ``batch`` in each transaction
    (:func:`lanes_place` with one lane). Returns each replica tried with its outcome, in order, and the
    replica it stopped at, if it did: the one nothing fits (the replicas after it were not tried)."""
    lane = Lane(replicas, request)
    lanes_place(lanes=[lane], index=index, now=now, batch=batch)
    return lane.tried(), lane.stopped


@collector_paused()
def lanes_place(
    *,
    lanes: list[Lane],
    index: PlacementIndex,
    now: datetime | None = None,
    batch: int = BATCH,
    max_tries: int | None = None,
) -> None:
    """Plan and commit several models' pending replicas, lane by lane, each lane's in order, up to
    ``batch`` of one lane in each transaction; at most ``max_tries`` replicas tried in all (the lanes
    past it are ``cut``). Outcomes go into the lanes.

    Each plan is made on the index with the plans before it applied; the batch is checked against the
    locked rows in one transaction with the guards of the single commit (budgets, then nodes,
    re-checked, then the guarded writes). A plan that loses is left out and planned again (at most
    MAX_ATTEMPTS times, as one at a time); the others commit. On SQLite, one at a time.

    While a batch's write and COMMIT are on their way (pipeline mode, see _InFlight), the next batch —
    the same lane's, or the next lane's: a reconcile's models follow one another without a wait — is
    planned on the index with the sent plans applied. If the sent batch did not all commit, the next
    batch's plans are taken back and planned again after its outcome, as if they had waited. A lane
    whose next replica finds that nothing fits behind a batch in flight stops there only once that
    batch committed whole, and the next lane plans meanwhile.

    An error is raised as it came, with the lane it came from marked (``Lane.error``); the lanes before
    it are settled, the ones after it untouched, the index to be built afresh.
    """
    now = now or timezone.now()
    if connection.vendor != "postgresql" or batch <= 1:
        _lanes_one_by_one(lanes, index, now, max_tries)
        return
    # Outside a transaction, a batch with more to plan after it has its write and COMMIT sent in
    # pipeline mode, and the next batch is planned while PostgreSQL works on them (the planner's CPU
    # and the database's overlap). The last batch commits waiting, as there is nothing to overlap.
    overlap = settings.LLMGW_COMMIT_PIPELINE and not connection.in_atomic_block
    in_flight: tuple[Lane, list[_Pending], _InFlight] | None = None
    # The stops' reasons, written together once nothing is in flight at the end (a reconcile's models
    # each stop once: a statement and a commit each, a tenth of a run of twenty models' turns).
    marks: list[tuple[Lane, Pending, str, dict[str, Any]]] = []
    started = 0
    blame = lanes[0] if lanes else None
    failing = False

    def can_go(lane: Lane) -> bool:
        if not lane.queue or lane.stopped is not None or lane.held is not None:
            return False
        return lane.queue[0].tried or max_tries is None or started < max_tries

    def stop_at(lane: Lane, nofit: NoFit) -> None:
        """The replica first in the lane's queue waits, with why; the ones after it are not tried."""
        item = lane.queue.pop(0)
        explain = pending_explain(nofit)
        if item.conflicts:
            explain |= {"conflicts": item.conflicts}
        replica = item.replica
        if replica.reason != nofit.summary or replica.explain != explain:
            marks.append((lane, replica, nofit.summary, explain))
            replica.reason, replica.explain = nofit.summary, explain
        lane.outcomes[replica.pk] = Placement(reason=nofit.summary)
        lane.stopped = replica

    def plan_batch(lane: Lane, planned: list[_Pending]) -> NoFit | None:
        """Plan up to ``batch`` of the lane's replicas into ``planned``; the no-fit of its first, if it
        met one (one met later is planned again after the batch: what the batch takes may not commit)."""
        nonlocal started
        while lane.queue and len(planned) < batch:
            item = lane.queue[0]
            if not item.tried:
                if max_tries is not None and started >= max_tries:
                    break
                item.tried = True
                started += 1
            result = index.plan(
                dataclasses.replace(lane.request, existing=tuple(lane.existing)), exclude=frozenset(item.exclude)
            )
            if isinstance(result, NoFit):
                return None if planned else result
            lane.queue.pop(0)
            item.plan = result
            item.explain = placed_explain(result, attempts=item.attempt, conflicts=item.conflicts)
            index.apply(result)
            lane.existing.append(result.nodes)
            planned.append(item)
        return None

    try:
        while True:
            planned: list[_Pending] = []
            lane: Lane | None = None
            while not planned:
                lane = next((candidate for candidate in lanes if can_go(candidate)), None)
                if lane is None:
                    break
                blame = lane
                nofit = plan_batch(lane, planned)
                if nofit is None:
                    continue
                if in_flight is None:
                    stop_at(lane, nofit)
                else:
                    # Nothing fits behind a batch in flight: that stands if the batch commits whole, as
                    # it was planned on; meanwhile the next lane plans (a reconcile's models each end so).
                    lane.held = nofit
            if not planned and in_flight is None:
                break
            if in_flight is not None:
                sent_lane, sent, flight = in_flight
                in_flight = None
                blame = sent_lane
                committed = flight.finish()
                clean = committed is not None and committed.clean
                if committed is None:
                    # The write met a lost race and the database rolled the batch back: committed again
                    # the waiting way, which finds out which plans lost and plans them again.
                    again = _commit_batch(sent, index, now, sent_lane)
                else:
                    again = _settle_batch(sent, committed, index, now, sent_lane)
                if planned and not clean:
                    # Not all of it committed: what was planned on top of it is planned again after it
                    # (its nodes read again once the sent batch is settled: the index then has it right).
                    blame = lane
                    _take_back(planned, index, now, lane)
                    lane.queue[:0] = planned
                    planned = []
                sent_lane.queue[:0] = again
                for waiting in lanes:
                    nofit, waiting.held = waiting.held, None
                    if nofit is not None and clean:
                        stop_at(waiting, nofit)  # the index was as it was planned on: the same answer
            if not planned:
                continue
            blame = lane
            if overlap and any(can_go(candidate) for candidate in lanes):  # a next batch to plan meanwhile
                flight = _InFlight.send(planned, index, now)
                if flight.committed is None:
                    in_flight = (lane, planned, flight)
                else:  # every plan lost at the check: nothing went out
                    lane.queue[:0] = _settle_batch(planned, flight.committed, index, now, lane)
            else:
                lane.queue[:0] = _commit_batch(planned, index, now, lane)
    except Exception as exc:
        failing = True
        if blame is not None and blame.error is None:
            blame.error = exc
        raise
    finally:
        try:
            if in_flight is not None:
                # Whatever stopped the run, a batch on its way is waited for, and what it committed recorded.
                sent_lane, sent, flight = in_flight
                try:
                    committed = flight.finish()
                    if committed is not None:
                        _settle_batch(sent, committed, index, now, sent_lane)
                except Exception as exc:
                    failing = True
                    if sent_lane.error is None:
                        sent_lane.error = exc
                    raise
        finally:
            try:
                _marks_write([(replica, reason, explain) for _, replica, reason, explain in marks])
            except DatabaseError as exc:
                if not failing:
                    if marks[0][0].error is None:
                        marks[0][0].error = exc  # the first of the lanes whose stops it was writing
                    raise
                log.warning(
                    "the reasons of %d stopped replicas were not written; the next reconcile writes them", len(marks)
                )
    for lane in lanes:
        lane.cut = bool(lane.queue) and lane.stopped is None


def _marks_write(marks: list[tuple[Pending, str, dict[str, Any]]]) -> None:
    """Each replica's reason to wait, in one transaction (only pending replicas take it)."""
    if not marks:
        return
    with transaction.atomic():
        for replica, reason, explain in marks:
            Replica.objects.filter(pk=replica.pk, state=ReplicaState.PENDING).update(reason=reason, explain=explain)


@dataclass
class Placed:
    """What placing a lane did: replicas tried, placed, and left pending (with their reasons)."""

    tried: int = 0
    placed: int = 0
    pending: int = 0


def lane_rest_mark(lane: Lane) -> Placed:
    """The replicas after the lane's stop marked with its reason (they ask the same and get the same
    answer), in a few statements rather than one per replica (thousands); what the lane did, counted."""
    counts = lane.counts()
    if lane.stopped is not None:
        later = lane.untried()
        replicas_pending_mark(later, lane.stopped.reason, lane.stopped.explain)
        counts.pending += len(later)
    return counts


def _lanes_one_by_one(lanes: list[Lane], index: PlacementIndex, now: datetime, max_tries: int | None) -> None:
    """lanes_place one replica per transaction (SQLite, whose writers are serialised anyway)."""
    started = 0
    for lane in lanes:
        try:
            while lane.queue:
                if max_tries is not None and started >= max_tries:
                    lane.cut = True
                    break
                started += 1
                replica = lane.queue.pop(0).replica
                request = dataclasses.replace(lane.request, existing=tuple(lane.existing))
                outcome = lane.outcomes[replica.pk] = replica_place(
                    replica=replica, request=request, index=index, now=now
                )
                if outcome.plan is not None:
                    lane.existing.append(outcome.plan.nodes)
                elif not outcome.gone and not outcome.reason.startswith("Unschedulable"):
                    lane.stopped = replica
                    break
        except Exception as exc:
            lane.error = exc
            raise


class _BatchLost(Exception):
    """The batch statement found lost races: roll it all back; these are the plans that lost."""

    def __init__(self, lost: dict[int, LostRace]):
        super().__init__(f"{len(lost)} lost")
        self.lost = lost


def _commit_batch(planned: list[_Pending], index: PlacementIndex, now: datetime, lane: Lane) -> list[_Pending]:
    """Commit the planned replicas together, waiting for it; record the outcomes; the ones to plan
    again, in order."""
    names, domains_of, touched = _batch_scope(planned, index)
    facility = index.facility
    lost: dict[int, LostRace] = {}
    gone: set[int] = set()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            locked = _Locked(*_locked_state(cursor, names, touched, facility, now))
            lost, writes = _checked(planned, locked, domains_of, facility, now)
            if writes:
                ids = {name: row[1] for name, row in locked.nodes.items()}
                gone, raced = _write_postgresql_batch(cursor, writes, ids, now, touched)
                if raced:
                    by_node = {race.node: race for race in raced}
                    for item in planned:
                        race = next((by_node[n] for n in sorted(item.plan.nodes) if n in by_node), None)
                        if race is not None:
                            lost[item.replica.pk] = race
                    raise _BatchLost(lost)
    except _BatchLost:
        return _settle_batch(planned, _Committed(lost, set(), True), index, now, lane)
    return _settle_batch(planned, _Committed(lost, gone, False), index, now, lane)


def _batch_scope(planned: list[_Pending], index: PlacementIndex) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """The batch's nodes (sorted), each one's domains, and every domain they touch (sorted)."""
    names = sorted({s.node for item in planned for s in item.plan.shards})
    domains_of = {name: [str(d) for d in index.node(name).domains] for name in names}
    return names, domains_of, sorted({d for ds in domains_of.values() for d in ds})


def _checked(
    planned: list[_Pending], locked: _Locked, domains_of: dict[str, list[str]], facility: FacilityView, now: datetime
) -> tuple[dict[int, LostRace], list[tuple[int, list, dict]]]:
    """The plans checked in turn against the locked rows: the ones that lost, and the writes of the rest."""
    lost: dict[int, LostRace] = {}
    writes = []
    for item in planned:
        shards = sorted(item.plan.shards, key=lambda s: s.node)
        try:
            locked.check(shards, domains_of, facility, now)
        except LostRace as race:
            lost[item.replica.pk] = race
            continue
        writes.append((item.replica.pk, shards, item.explain))
    return lost, writes


@dataclass
class _Committed:
    """What a batch's transaction did: the plans that lost (with the race), the replicas gone, and
    whether it rolled back as a whole (a lost race found by the write)."""

    lost: dict[int, LostRace]
    gone: set[int]
    rolled_back: bool

    @property
    def clean(self) -> bool:
        """Every plan committed: what was planned on top of them stands."""
        return not (self.lost or self.gone or self.rolled_back)


class _InFlight:
    """A batch whose write and COMMIT went out in pipeline mode, unanswered yet: the caller plans the
    next batch meanwhile, touching nothing of the database, then asks ``finish``.

    The transaction is begun by hand (the connection stays in autocommit for Django): BEGIN, the locks
    and the read, answered, then the checks, then the strict write and COMMIT sent together. A lost
    race found by the write aborts the transaction, so the COMMIT behind it rolls back.
    """

    def __init__(self) -> None:
        self.committed: _Committed | None = None  # known at once: nothing was sent
        self._stack = ExitStack()
        self._cursor = None
        self._lost: dict[int, LostRace] = {}
        self._writes: list[tuple[int, list, dict]] = []
        self._ids: dict[str, int] = {}
        self._rolled_back = False  # the write's lost race came back while it was being sent

    @classmethod
    def send(cls, planned: list[_Pending], index: PlacementIndex, now: datetime) -> _InFlight:
        flight = cls()
        names, domains_of, touched = _batch_scope(planned, index)
        facility = index.facility
        connection.ensure_connection()
        cursor = connection.cursor()
        try:
            cursor.execute("BEGIN")
            locked = _Locked(*_locked_state(cursor, names, touched, facility, now))
            flight._lost, flight._writes = _checked(planned, locked, domains_of, facility, now)
            if not flight._writes:
                cursor.execute("COMMIT")
                cursor.close()
                flight.committed = _Committed(flight._lost, set(), False)
                return flight
            flight._ids = {name: row[1] for name, row in locked.nodes.items()}
            flight._stack.enter_context(connection.connection.pipeline())
            with connection.wrap_database_errors:
                cursor.execute(*_batch_write(flight._writes, flight._ids, now, touched, strict=True))
                connection.connection.execute("COMMIT")
        except DatabaseError as exc:
            flight._abandon()
            cursor.close()
            if _lost_race(exc):
                # The write's answer was back before the COMMIT went out (psycopg reads what has come
                # back as it sends): the race is known now rather than at finish, and rolled back all
                # the same.
                flight._rolled_back = True
                return flight
            raise
        except BaseException:
            flight._abandon()
            cursor.close()
            raise
        flight._cursor = cursor
        return flight

    def finish(self) -> _Committed | None:
        """What committed; None when the write found a lost race (the database rolled it all back)."""
        if self.committed is not None:
            return self.committed
        if self._rolled_back:
            return None
        try:
            with connection.wrap_database_errors:
                self._stack.close()  # the pipeline's sync: the write's answer and the COMMIT's
        except DatabaseError as exc:
            self._abandon()
            self._cursor.close()
            if _lost_race(exc):
                return None
            raise
        finally:
            self._stack = ExitStack()
        with connection.wrap_database_errors:
            row = self._cursor.fetchone()
        self._cursor.close()
        gone, raced = _batch_written(row, self._writes, self._ids)
        if raced:  # the strict statement raises first; a row saying otherwise is a fault of this code
            raise RuntimeError(f"a strict batch committed with lost races: {raced}")
        self.committed = _Committed(self._lost, gone, False)
        return self.committed

    def _abandon(self) -> None:
        """Out of pipeline mode, and the transaction begun by hand rolled back."""
        try:
            self._stack.close()
        except Exception:  # noqa: BLE001 - the error that brought us here is the one to raise
            pass
        from psycopg.pq import TransactionStatus  # PostgreSQL only, as this class is

        pg = connection.connection
        if pg is not None and not pg.closed and pg.info.transaction_status != TransactionStatus.IDLE:
            pg.execute("ROLLBACK")


def _lost_race(exc: DatabaseError) -> bool:
    """Whether the database refused a strict batch write for a lost race (placement_lost_race())."""
    return getattr(exc.__cause__, "sqlstate", None) == LOST_RACE


def _settle_batch(
    planned: list[_Pending], result: _Committed, index: PlacementIndex, now: datetime, lane: Lane
) -> list[_Pending]:
    """Record a batch's outcomes in its lane and tell the index what did not happen; the ones to plan
    again, in order."""
    lost, gone, rolled_back = result.lost, result.gone, result.rolled_back
    outcomes, existing = lane.outcomes, lane.existing
    again: list[_Pending] = []
    refresh: set[str] = set()
    for item in planned:
        pk = item.replica.pk
        race = lost.get(pk)
        if rolled_back or race is not None or pk in gone:
            # Its plan is not in the database: the index forgets it, and so does the model's spread.
            refresh |= item.plan.nodes
            existing.remove(item.plan.nodes)
        if pk in gone:
            outcomes[pk] = Placement(gone=True)
        elif race is not None:
            refresh |= race.refresh
            item.conflicts.append(race.reason)
            item.exclude.add(race.node)
            if item.attempt >= MAX_ATTEMPTS:
                reason = f"Unschedulable after {MAX_ATTEMPTS} conflicting attempts: {'; '.join(item.conflicts)}"
                explain = {"summary": reason, "conflicts": item.conflicts, "rejections": []}
                outcomes[pk] = replica_pending(item.replica, reason, explain)
            else:
                item.attempt += 1
                again.append(item)
        elif rolled_back:
            again.append(item)  # it lost nothing: planned again as it was, with the others' news
        else:
            item.replica.state = ReplicaState.PLACED
            item.replica.reason, item.replica.explain = "", item.explain
            outcomes[pk] = Placement(plan=item.plan)
    # Only the nodes given shards have new assignments: the heartbeats' map reads just their entries
    # again (a lost room's thousands of replacements would otherwise send it all to the database, and
    # every heartbeat of a served process down the full path meanwhile, once per batch).
    placed = {
        name for item in planned if outcomes.get(item.replica.pk, Placement()).plan is not None
        for name in item.plan.nodes
    }
    if placed:
        placement_changed_on_commit(nodes=placed)
    if refresh:
        for view in snapshot.node_views(names=refresh, now=now):
            index.update_node(view)
    return again


def _take_back(planned: list[_Pending], index: PlacementIndex, now: datetime, lane: Lane) -> None:
    """Plans applied to the index but never sent: the index reads their nodes again and the model's
    spread forgets them; each replica keeps its tries and exclusions, to be planned again."""
    if not planned:
        return
    nodes: set[str] = set()
    for item in planned:
        nodes |= item.plan.nodes
        lane.existing.remove(item.plan.nodes)
        item.plan = item.explain = None
    for view in snapshot.node_views(names=nodes, now=now):
        index.update_node(view)
