"""The writes of placed replicas: shards, GPU bookings (unique per node and card) and node bookings, on
PostgreSQL in one statement per batch and portably (SQLite) one replica at a time."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F

from agents.models import GPU, Node
from facility.models import Hold
from placement.commit.locks import _budgets_sql, _locked_state, _members_sql, _read_sql, _state_of, scope_of
from placement.commit.outcomes import LostRace, ReplicaGone
from placement.commit.recheck import _Locked
from placement.index import PlacementIndex
from placement.models import GpuBooking, NodeBooking, Replica, ReplicaState, Shard
from placement.planner import Plan, ReplicaRequest

# What a commit begun by hand sends (the connection stays in autocommit for Django): READ COMMITTED said,
# not left to the server's default — the read under the locks takes its snapshot once they are held.
BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
# Sent right after BEGIN: the commit's statements (and the booking triggers' own) run on their prepared
# generic plans. Left to the server (plan_cache_mode auto), the lock of the budgeted domains' members is
# planned afresh on every execution (its generic plan is costed above its custom ones, so auto never
# switches). Their arrays and ids are alike from one commit to the next: one plan suits them all.
GENERIC_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"


def generic_plans(cursor, own: bool) -> None:
    """GENERIC_PLANS, on PostgreSQL, in a transaction the commit began itself (``own``): SET LOCAL would
    last to the end of a caller's."""
    if own and connection.vendor == "postgresql":
        cursor.execute(GENERIC_PLANS)


def _commit(
    replica_id: int, plan: Plan, index: PlacementIndex, explain: dict[str, Any], now: datetime,
    request: ReplicaRequest, *, own: bool = False,
) -> bool:
    """Lock, re-check and write one plan; False when the replica is no longer pending. Raises LostRace.
    ``own``: the transaction it runs in is the commit's own (generic_plans)."""
    shards = sorted(plan.shards, key=lambda s: s.node)
    scope = scope_of(plan.nodes, index)
    names, touched, facility = scope.names, scope.touched, index.facility
    with connection.cursor() as cursor:
        generic_plans(cursor, own)
        locked = _Locked(*_locked_state(cursor, names, touched, facility, now))
        locked.check(shards, scope.domains_of, facility, now, views=scope.views, request=request)
        ids = {name: locked.nodes[name][1] for name in names}
        if connection.vendor == "postgresql":
            return _write_postgresql(cursor, replica_id, shards, ids, explain, now, touched)
        return _write_portable(replica_id, shards, ids, explain, now)


def _commit_pipelined(
    replica_id: int, plan: Plan, index: PlacementIndex, explain: dict[str, Any], now: datetime,
    request: ReplicaRequest,
) -> bool | None:
    """_commit on PostgreSQL outside any transaction, in two round trips: BEGIN, the budgets' locks, the
    nodes' locks and the read go out together; the plan is checked; the write (strict) and COMMIT go out together.
    False when the replica is no longer pending; raises LostRace from the check. None when the strict
    write found a lost race: the database rolled it all back, and the caller commits the plan again the
    plain way (_commit), which finds the race again with its words, or commits.

    The transaction is begun by hand (the connection stays in autocommit for Django); whatever goes
    wrong, it is rolled back before this returns or raises.
    """
    import psycopg  # PostgreSQL only, as this path is: SQLite's processes never load it
    from psycopg.pq import TransactionStatus

    shards = sorted(plan.shards, key=lambda s: s.node)
    scope = scope_of(plan.nodes, index)
    names, touched, facility = scope.names, scope.touched, index.facility
    connection.ensure_connection()
    pg = connection.connection
    try:
        with connection.wrap_database_errors, pg.cursor() as budgets, pg.cursor() as members, pg.cursor() as cursor:
            with pg.pipeline():
                cursor.execute(BEGIN)
                cursor.execute(GENERIC_PLANS)
                if touched:
                    budgets.execute(*_budgets_sql(touched))
                members.execute(*_members_sql(names, touched))
                cursor.execute(*_read_sql(names, touched, now))
            locked = _Locked(*_state_of(budgets.fetchall() if touched else [], cursor.fetchall(), facility))
            locked.check(shards, scope.domains_of, facility, now, views=scope.views, request=request)
            ids = {name: locked.nodes[name][1] for name in names}
            try:
                with pg.pipeline():
                    cursor.execute(*_batch_write([(replica_id, shards, explain)], ids, now, touched, strict=True))
                    pg.execute("COMMIT")
            except psycopg.Error as exc:
                if getattr(exc, "sqlstate", None) == LOST_RACE:
                    return None
                raise
            gone, raced = _batch_written(cursor.fetchone(), [(replica_id, shards, explain)], ids)
    finally:
        if not pg.closed and pg.info.transaction_status != TransactionStatus.IDLE:
            pg.execute("ROLLBACK")
    if raced:  # the strict statement raises first; a row saying otherwise is a fault of this code
        raise RuntimeError(f"a strict write committed with lost races: {raced}")
    return not gone


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
    # Each list goes out once (a parameter is dumped each time it is named): the replica ids and the hold
    # guard are read from the first CTEs wherever they are needed.
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
    return (
        _batch_write_sql(held_guard=bool(touched), strict=strict),
        [
            replica_ids,
            *guard_params,
            *params,
            ReplicaState.PLACED.value,
            explains,
            now,
            ReplicaState.PENDING.value,
            ReplicaState.PLACED.value,
            now,
        ],
    )


@functools.cache
def _batch_write_sql(*, held_guard: bool, strict: bool) -> str:
    """_batch_write's statement, made once for each of its four forms, each line's indent taken off: the
    driver converts a text over 4,096 characters again on every execute (it caches shorter ones), so the
    text stays under that, strict form included."""
    hold_guard = f"NOT EXISTS (SELECT 1 FROM {Hold._meta.db_table} WHERE domain = ANY(%b::text[]))" if held_guard else "TRUE"
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
    sql = f"""
        WITH p AS (SELECT CAST(%b AS bigint[]) AS ids, {hold_guard} AS unheld),
        v(replica_id, node_id, gpus, cores, mem, draw) AS (
            SELECT replica_id, node_id, CAST(gpus AS int[]), cores, mem, draw
            FROM unnest(%b::bigint[], %b::bigint[], %b::text[], %b::int[], %b::float8[], %b::float8[])
                AS u(replica_id, node_id, gpus, cores, mem, draw)
        ),
        r AS (
            -- First, and the rest hangs on it: a replica another placer took meanwhile (this UPDATE
            -- waits for its commit, then finds it no longer pending) writes nothing at all. Found by
            -- the ids alone (an index condition) and given its explain by its place among them: joined
            -- to a list instead, a replica table whose statistics lag a bulk change (a lost room's
            -- replacements) may be read whole or matched row by row, most of a batch's write.
            UPDATE {Replica._meta.db_table} AS rep SET state = %s, reason = '',
                explain = CAST((%b::text[])[array_position(CAST((SELECT ids FROM p) AS bigint[]), rep.id)] AS jsonb),
                placed_at = %s, ready_since = NULL
            WHERE rep.id = ANY(CAST((SELECT ids FROM p) AS bigint[])) AND rep.state = %s AND (SELECT unheld FROM p) RETURNING rep.id
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
                ARRAY(SELECT node_id FROM n) AS counted, ARRAY(SELECT id FROM r), (SELECT unheld FROM p) AS unheld
        ) AS o
        """
    return "\n".join(line.strip() for line in sql.splitlines() if line.strip())


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
