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

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agents.models import GPU, Node, NodeDomain, heartbeat_is_fresh, measured_fresh_seconds
from facility.domains import domains_of as domains_of_labels
from facility.models import Budget, Hold
from facility.power import Budget as BudgetFigures
from facility.power import node_draw_sql, node_use_added_watts
from placement import snapshot
from placement.explain import pending_explain, placed_explain
from placement.index import PlacementIndex
from placement.models import GpuBooking, NodeBooking, Replica, ReplicaState, Shard
from placement.planner import FacilityView, NoFit, Plan, ReplicaRequest, power_rejection_in
from placement.signals import placement_changed_on_commit

MAX_ATTEMPTS = 3


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

def placeholders(values: list) -> str:
    return ", ".join(["%s"] * len(values))


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
        cursor.execute(
            f"SELECT domain, cap_watts, other_watts FROM {Budget._meta.db_table} "
            f"WHERE domain IN ({placeholders(touched)}) ORDER BY domain{lock}",
            touched,
        )
        budgets = {domain: (cap, other) for domain, cap, other in cursor.fetchall()}
    # One statement for the rest: it starts after the budget locks are held, so the members' draws it
    # sums include every placement committed into those domains before us. The nodes are locked in it,
    # by name, before the sums are read.
    node_table = Node._meta.db_table
    sql = (
        f"WITH locked AS MATERIALIZED (SELECT name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"labels FROM {node_table} WHERE name IN ({placeholders(names)}) ORDER BY name{lock}) "
        f"SELECT 'node', name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"CAST(labels AS text), CAST(NULL AS double precision) FROM locked"
    )
    params: list[Any] = list(names)
    domains = sorted(budgets)
    if touched:
        sql += (
            f" UNION ALL SELECT 'hold', domain, NULL, NULL, NULL, NULL, reason, NULL "
            f"FROM {Hold._meta.db_table} WHERE domain IN ({placeholders(touched)})"
        )
        params += touched
    if domains:
        # node_watts (added below, per member) + the larger of placed and fresh measured draw: the rule
        # of facility.power.node_use_watts, as the SQL that module builds from the same figures.
        fresh_after = now - timedelta(seconds=measured_fresh_seconds())
        sql += (
            f" UNION ALL SELECT 'use', nd.domain, COUNT(*), NULL, NULL, NULL, NULL, "
            f"SUM({node_draw_sql('n', placed='COALESCE(b.placed_watts, 0)')}) "
            f"FROM {NodeDomain._meta.db_table} nd JOIN {node_table} n ON n.id = nd.node_id "
            f"LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE nd.domain IN ({placeholders(domains)}) GROUP BY nd.domain"
        )
        params += [connection.ops.adapt_datetimefield_value(fresh_after), *domains]
        # Each placed node's placed draw and its term less node_watts, by the same SQL rule: the check
        # is on the use after the shard, max(placed + shard, measured), as facility.power says it.
        sql += (
            f" UNION ALL SELECT 'placed', n.name, NULL, NULL, NULL, NULL, NULL, COALESCE(b.placed_watts, 0) "
            f"FROM {node_table} n LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE n.name IN ({placeholders(names)})"
            f" UNION ALL SELECT 'drawn', n.name, NULL, NULL, NULL, NULL, NULL, "
            f"{node_draw_sql('n', placed='COALESCE(b.placed_watts, 0)')} "
            f"FROM {node_table} n LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE n.name IN ({placeholders(names)})"
        )
        params += [*names, connection.ops.adapt_datetimefield_value(fresh_after), *names]
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
        nodes, budget_rows, held, use, draws = _locked_state(cursor, names, touched, facility, now)
        for name in names:
            row = nodes.get(name)
            if row is None:
                raise LostRace(name, f"{name}: the node is gone")
            if row[2]:
                raise LostRace(name, f"{name}: cordoned meanwhile")
            if not _is_ready(row[3], row[4], now):
                raise LostRace(name, f"{name}: not ready any more")
            labels = json.loads(row[5]) if isinstance(row[5], str) else (row[5] or {})
            if sorted(str(d) for d in domains_of_labels(labels)) != sorted(domains_of[name]):
                raise LostRace(name, f"{name}: its location changed meanwhile")
            for domain in domains_of[name]:
                if domain in held:
                    label = domain.replace(":", " ", 1)
                    raise LostRace(name, f"{name}: {label} is held: {held[domain]}")
        if budget_rows:
            budgets = {
                d: BudgetFigures(snapshot.domain_of(d), cap, other) for d, (cap, other) in budget_rows.items()
            }
            taken: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            for shard in shards:
                mine = snapshot.level_sorted(d for d in domains_of[shard.node] if d in budgets)
                placed, drawn = draws.get(shard.node, (0.0, 0.0))
                # The SQL gives max(placed, measured): a measurement counts where it passes the placed.
                measured = drawn if drawn > placed else None
                added = node_use_added_watts(placed, measured, shard.draw_watts, facility.settings)
                reason = power_rejection_in(
                    [(budgets[d], use[d], *taken[d]) for d in mine], shard.draw_watts, added, facility.settings.margin
                )
                if reason is not None:
                    raise LostRace(shard.node, f"{shard.node}: {reason}", refresh=snapshot.members_of(mine))
                for d in mine:
                    taken[d][0] += added
                    taken[d][1] += shard.draw_watts or 0
        ids = {name: nodes[name][1] for name in names}
        if connection.vendor == "postgresql":
            return _write_postgresql(cursor, replica_id, shards, ids, explain, now, touched)
        return _write_portable(replica_id, shards, ids, explain, now)


def _write_postgresql(
    cursor, replica_id: int, shards, ids: dict[str, int], explain, now: datetime, touched: list[str]
) -> bool:
    """Shards, GPU bookings, node counters and the replica in one statement; the guards in its WHERE clauses.

    Holds are checked again here: hold_create locks the domain's nodes before it writes, so a hold that
    raced the read before the node locks has committed by the time this statement starts, and is seen.
    """
    hold_guard = (
        f"NOT EXISTS (SELECT 1 FROM {Hold._meta.db_table} WHERE domain IN ({placeholders(touched)}))"
        if touched
        else "TRUE"
    )
    values = ", ".join(["(%s::bigint, %s::int[], %s::int, %s::float8, %s::float8)"] * len(shards))
    params: list[Any] = []
    for s in shards:
        params += [ids[s.node], list(s.gpu_indices), s.cpu_cores, s.memory_gib, s.draw_watts]
    cursor.execute(
        f"""
        WITH v(node_id, gpus, cores, mem, draw) AS (VALUES {values}),
        r AS (
            -- First, and the rest hangs on it: a replica another placer took meanwhile (this UPDATE
            -- waits for its commit, then finds it no longer pending) writes nothing at all.
            UPDATE {Replica._meta.db_table} SET state = %s, reason = '', explain = %s::jsonb, placed_at = %s,
                ready_since = NULL
            WHERE id = %s AND state = %s AND {hold_guard} RETURNING id
        ),
        s AS (
            INSERT INTO {Shard._meta.db_table}
                (replica_id, node_id, gpu_indices, cpu_cores, memory_gib, draw_watts, state, restarts, message,
                 created_at)
            SELECT r.id, v.node_id, to_jsonb(v.gpus), v.cores, v.mem, v.draw, %s, 0, '', %s FROM v, r
            RETURNING id, node_id
        ),
        g AS (
            -- A card booked already (by a commit before this one, or one waited for) is a conflict on
            -- the unique (node, index): not inserted, so not counted.
            INSERT INTO {GpuBooking._meta.db_table} AS gb (shard_id, node_id, index)
            SELECT s.id, s.node_id, gpu.index FROM s JOIN v ON v.node_id = s.node_id
            JOIN {GPU._meta.db_table} AS gpu ON gpu.node_id = s.node_id AND gpu.index = ANY(v.gpus) AND gpu.present
            ON CONFLICT (node_id, index) DO NOTHING
            RETURNING gb.node_id
        ),
        n AS (
            -- The node's first shard makes its booking row; later ones add to it. Either way the
            -- guard is the node's capacity against what is booked with this shard.
            INSERT INTO {NodeBooking._meta.db_table} AS nb (node_id, cpu_cores, memory_gib, placed_watts)
            SELECT v.node_id, v.cores, v.mem, COALESCE(v.draw, 0)
            FROM v JOIN {Node._meta.db_table} AS node ON node.id = v.node_id, r
            WHERE node.cpu_cores >= v.cores AND node.memory_gib >= v.mem - 1e-9
            ON CONFLICT (node_id) DO UPDATE SET
                cpu_cores = nb.cpu_cores + EXCLUDED.cpu_cores,
                memory_gib = nb.memory_gib + EXCLUDED.memory_gib,
                placed_watts = nb.placed_watts + EXCLUDED.placed_watts
            WHERE (SELECT node.cpu_cores >= nb.cpu_cores + EXCLUDED.cpu_cores
                          AND node.memory_gib >= nb.memory_gib + EXCLUDED.memory_gib - 1e-9
                   FROM {Node._meta.db_table} AS node WHERE node.id = nb.node_id)
            RETURNING nb.node_id
        )
        SELECT ARRAY(SELECT node_id FROM g), ARRAY(SELECT node_id FROM n), (SELECT COUNT(*) FROM r), {hold_guard}
        """,
        [
            *params,
            ReplicaState.PLACED.value,
            json.dumps(explain),
            now,
            replica_id,
            ReplicaState.PENDING.value,
            *touched,
            ReplicaState.PLACED.value,
            now,
            *touched,
        ],
    )
    booked, counted, replicas, unheld = cursor.fetchone()
    if not unheld:
        node = shards[0].node
        raise LostRace(node, f"{node}: a domain it is in was held meanwhile")
    if not replicas:
        raise ReplicaGone()
    per_node = Counter(booked)
    for s in shards:
        node_id = ids[s.node]
        if per_node[node_id] != len(s.gpu_indices):
            raise LostRace(s.node, f"{s.node}: GPUs {_indices(s.gpu_indices)} were booked meanwhile")
        if node_id not in counted:
            raise LostRace(s.node, f"{s.node}: its cores or memory were booked meanwhile")
    return True


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
    *, replica: Replica, request: ReplicaRequest, index: PlacementIndex, now: datetime | None = None
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
        placement_changed_on_commit()
        return Placement(plan=result)
    reason = f"Unschedulable after {MAX_ATTEMPTS} conflicting attempts: {'; '.join(conflicts)}"
    return replica_pending(replica, reason, {"summary": reason, "conflicts": conflicts, "rejections": []})


def replica_pending(replica: Replica, reason: str, explain: dict[str, Any]) -> Placement:
    """Record why a replica waits (only when that changed); the pending outcome."""
    if replica.reason != reason or replica.explain != explain:
        Replica.objects.filter(pk=replica.pk, state=ReplicaState.PENDING).update(
            reason=reason, explain=explain
        )
        replica.reason, replica.explain = reason, explain
    return Placement(reason=reason)
