"""The locks a commit takes, in the one order (budgets sorted by domain, then nodes by name), and what it reads under them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from agents.models import Node, NodeDomain, measured_fresh_seconds
from facility.models import Budget, Hold
from facility.power import node_draw_sql
from llmgw.lock_order import lock_clause
from llmgw.sqlin import sql_in
from placement.index import PlacementIndex
from placement.models import NodeBooking
from placement.planner import FacilityView, NodeView


@dataclass(frozen=True)
class Scope:
    """What a commit of some plans touches: its nodes (sorted), the index's view of each (what the plans
    were made on), each one's domains, and every domain they are in (sorted: the budgets' lock order)."""

    names: list[str]
    views: dict[str, NodeView]
    domains_of: dict[str, list[str]]
    touched: list[str]


def scope_of(nodes: Iterable[str], index: PlacementIndex) -> Scope:
    """The :class:`Scope` of a commit whose shards go to ``nodes``."""
    names = sorted(set(nodes))
    views = {name: index.node(name) for name in names}
    domains_of = {name: [str(d) for d in view.domains] for name, view in views.items()}
    return Scope(names, views, domains_of, sorted({d for ds in domains_of.values() for d in ds}))


LockedState = tuple[
    dict[str, tuple], dict[str, tuple[float, float]], dict[str, str], dict[str, float], dict[str, tuple[float, float]]
]


def _locked_state(cursor, names: list[str], touched: list[str], facility: FacilityView, now: datetime) -> LockedState:
    """Lock the budgets (sorted by domain), then the nodes (sorted by name); read them, holds and use.

    Returns (node rows by name, budgets (cap, other) by domain, holds by domain, each locked budget's
    domain use, each node's (placed, max(placed, fresh measured)) when a budget is touched). Raw SQL:
    this is the hot path of every placement. The budgets' lock (_budgets_sql), on PostgreSQL the nodes'
    (_members_sql), then the read (_read_sql).
    """
    budget_rows: list[tuple] = []
    if touched:
        cursor.execute(*_budgets_sql(touched))
        budget_rows = cursor.fetchall()
    if connection.features.has_select_for_update:
        cursor.execute(*_members_sql(names, touched))
        cursor.execute(*_read_sql(names, touched, now))
    else:
        cursor.execute(*_read_sql_unlocked(names, sorted(row[0] for row in budget_rows), now))
    return _state_of(budget_rows, cursor.fetchall(), facility)


def _budgets_sql(touched: list[str]) -> tuple[str, list[Any]]:
    """Lock the touched domains' budget rows, sorted by domain: (domain, effective cap, other watts)."""
    where, params = sql_in("domain", touched)
    # The effective cap (Budget.effective_cap_watts): a written cap never above the feeds'.
    # The replica row is not locked here: the write's guarded UPDATE of it (state still pending) is
    # the check, and saves a round trip on every placement.
    return (
        f"SELECT domain, CASE WHEN feed_cap_watts IS NOT NULL AND feed_cap_watts < cap_watts "
        f"THEN feed_cap_watts ELSE cap_watts END, other_watts FROM {Budget._meta.db_table} "
        f"WHERE {where}{lock_clause(Budget)}",
        params,
    )


def _members_sql(names: list[str], touched: list[str]) -> tuple[str, list[Any]]:
    """PostgreSQL, once the budgets' locks are held (after _budgets_sql, in the same transaction): lock
    the chosen nodes and every member of the touched domains that have a budget, by name.

    A statement of its own, before the read (the three may go out together in pipeline mode): the read's
    snapshot is taken once these locks are held, so it sees every change committed to these nodes, and
    to which domains they are in. Locked and read in one statement, the rows were the latest but the
    domains they are in were the snapshot's from before the wait: a member relabelled into the domain
    while the lock waited for it (a node moved to its rack's other PDU) went uncounted, and the commit
    could carry that PDU past its limit.
    """
    return (f"SELECT id FROM {Node._meta.db_table} WHERE {_MEMBERS}{lock_clause(Node)}", [touched, names])


# The nodes a commit locks and reads (its parameters: the touched domains, then the chosen names): every
# member of a touched domain that has a budget, found through the domains' index, and the chosen nodes.
_MEMBERS = (
    f"id = ANY(ARRAY(SELECT node_id FROM {NodeDomain._meta.db_table} WHERE domain = ANY(ARRAY("
    f"SELECT domain FROM {Budget._meta.db_table} WHERE domain = ANY(CAST(%b AS text[])))) "
    f"UNION SELECT id FROM {Node._meta.db_table} WHERE name = ANY(CAST(%b AS text[]))))"
)


def _read_sql(names: list[str], touched: list[str], now: datetime) -> tuple[str, list[Any]]:
    """PostgreSQL, run once the budgets' and nodes' locks are held (after _budgets_sql and _members_sql,
    in the same transaction): read the chosen nodes, the holds, each budgeted domain's use and the chosen
    nodes' draws.

    A heartbeat raising a member's measured draw, or a relabel moving a member, waits for this commit, or
    committed before the lock was granted; either way this statement's snapshot, taken once the locks
    are held, sees it. So does it every placement into those domains committed before (the placed watts).
    A node relabelled into a domain after the members were locked is read too, once committed.
    """
    node_table, domain_table, booking_table = Node._meta.db_table, NodeDomain._meta.db_table, NodeBooking._meta.db_table
    fresh_after = connection.ops.adapt_datetimefield_value(now - timedelta(seconds=measured_fresh_seconds()))
    # node_watts (added by _state_of, per member) + the larger of placed and fresh measured draw: the rule
    # of facility.power.node_use_watts, as the SQL that module builds from the same figures (its one
    # parameter, the oldest fresh reading's time, read from p: each parameter goes out once).
    draw = node_draw_sql("n", placed="COALESCE(b.placed_watts, 0)")
    assert draw.count("%s") == 1, draw
    draw = draw.replace("%s", "p.fresh")
    # The budgeted domains as arrays (InitPlans): each member found through the domain's index, not by a
    # join the planner may make a scan of every node's domains. PostgreSQL compares `= ANY(array)` with
    # a non-constant array element by element, each member's domains against every budgeted domain of a
    # batch and each locked member against every chosen name. The budgeted domains are a set (bd, a
    # hashed semi-join), and the chosen nodes are picked out of the locked rows by id (integers, not
    # names); each member's draw is worked out once (drew), for its domains' sums and its own row.
    # The read opens with "WITH locked", the locked nodes' rows (tests wait for it to move in between the
    # read and the write); the lists it needs again are read from p.
    sql = (
        f"WITH locked AS MATERIALIZED (SELECT id, name, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"labels, fabric, measured_peak_watts, sensors_at FROM {node_table} WHERE {_MEMBERS}), "
        f"p AS (SELECT CAST(%b AS text[]) AS touched, CAST(%b AS text[]) AS names, "
        f"CAST(%s AS timestamptz) AS fresh), "
        f"bd AS MATERIALIZED (SELECT domain FROM {Budget._meta.db_table} "
        f"WHERE domain = ANY(CAST((SELECT touched FROM p) AS text[]))), "
        f"drew AS MATERIALIZED (SELECT n.id, COALESCE(b.placed_watts, 0) AS placed, {draw} AS drawn "
        f"FROM locked n CROSS JOIN p LEFT JOIN {booking_table} b ON b.node_id = n.id), "
        f"chosen AS (SELECT n.*, d.placed, d.drawn FROM locked n JOIN drew d ON d.id = n.id "
        f"WHERE n.id = ANY(ARRAY(SELECT id FROM {node_table} WHERE name = ANY(CAST((SELECT names FROM p) AS text[]))))) "
        f"SELECT 'node', name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"CAST(labels AS text), fabric, CAST(NULL AS double precision) FROM chosen"
        f" UNION ALL SELECT 'hold', domain, NULL, NULL, NULL, NULL, reason, NULL, NULL "
        f"FROM {Hold._meta.db_table} WHERE domain IN (SELECT unnest(touched) FROM p)"
        f" UNION ALL SELECT 'use', nd.domain, COUNT(*), NULL, NULL, NULL, NULL, NULL, SUM(d.drawn) "
        f"FROM {domain_table} nd JOIN drew d ON d.id = nd.node_id "
        f"WHERE nd.domain IN (SELECT domain FROM bd) GROUP BY nd.domain"
        f" UNION ALL SELECT 'placed', name, NULL, NULL, NULL, NULL, NULL, NULL, placed FROM chosen"
        f" UNION ALL SELECT 'drawn', name, NULL, NULL, NULL, NULL, NULL, NULL, drawn FROM chosen"
    )
    return sql, [touched, names, touched, names, fresh_after]


def _read_sql_unlocked(names: list[str], domains: list[str], now: datetime) -> tuple[str, list[Any]]:
    """The read of _read_sql where rows are not locked (SQLite: its IMMEDIATE transactions serialise the
    writers instead), for the budgeted ``domains``."""
    node_table = Node._meta.db_table
    named, named_params = sql_in("name", names)
    sql = (
        f"WITH locked AS MATERIALIZED (SELECT name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"labels, fabric FROM {node_table} WHERE {named} ORDER BY name) "
        f"SELECT 'node', name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"CAST(labels AS text), fabric, CAST(NULL AS double precision) FROM locked"
    )
    params: list[Any] = list(named_params)
    if domains:
        held, held_params = sql_in("domain", domains)
        sql += (
            f" UNION ALL SELECT 'hold', domain, NULL, NULL, NULL, NULL, reason, NULL, NULL "
            f"FROM {Hold._meta.db_table} WHERE {held}"
        )
        params += held_params
        fresh_after = connection.ops.adapt_datetimefield_value(now - timedelta(seconds=measured_fresh_seconds()))
        sql += (
            f" UNION ALL SELECT 'use', nd.domain, COUNT(*), NULL, NULL, NULL, NULL, NULL, "
            f"SUM({node_draw_sql('n', placed='COALESCE(b.placed_watts, 0)')}) "
            f"FROM {NodeDomain._meta.db_table} nd JOIN {node_table} n ON n.id = nd.node_id "
            f"LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE {sql_in('nd.domain', domains)[0]} GROUP BY nd.domain"
        )
        params += [fresh_after, *sql_in("", domains)[1]]
        sql += (
            f" UNION ALL SELECT 'placed', n.name, NULL, NULL, NULL, NULL, NULL, NULL, COALESCE(b.placed_watts, 0) "
            f"FROM {node_table} n LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE {sql_in('n.name', names)[0]}"
            f" UNION ALL SELECT 'drawn', n.name, NULL, NULL, NULL, NULL, NULL, NULL, "
            f"{node_draw_sql('n', placed='COALESCE(b.placed_watts, 0)')} "
            f"FROM {node_table} n LEFT JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id "
            f"WHERE {sql_in('n.name', names)[0]}"
        )
        params += [*named_params, fresh_after, *named_params]
    return sql, params


def _state_of(budget_rows: list[tuple], rows: list[tuple], facility: FacilityView) -> LockedState:
    """_locked_state's answer from the budgets' rows and the read's."""
    budgets = {domain: (cap, other) for domain, cap, other in budget_rows}
    nodes: dict[str, tuple] = {}
    holds: dict[str, str] = {}
    node_watts = facility.settings.node_watts or 0
    use = {domain: other for domain, (_, other) in budgets.items()}
    draws: dict[str, list[float]] = {}
    for kind, key, a, b, c, d, reason, fabric, drawn in rows:
        if kind == "node":
            # The labels and fabric are the locked row's latest: a relabel committed since the plan is
            # seen here. (name, id, cordoned, last heartbeat, interval, labels as JSON text, fabric)
            nodes[key] = (key, a, b, c, d, reason, fabric)
        elif kind == "hold":
            holds[key] = reason
        elif kind == "use":
            if key in use:  # a domain without a budget row (PostgreSQL's read finds only budgeted ones)
                use[key] += a * node_watts + (drawn or 0)
        elif budgets:
            draws.setdefault(key, [0.0, 0.0])[kind == "drawn"] = drawn or 0.0
    return nodes, budgets, holds, use, {name: (placed, drawn) for name, (placed, drawn) in draws.items()}
