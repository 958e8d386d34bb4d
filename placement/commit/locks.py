"""The locks a commit takes, in the one order (budgets sorted by domain, then nodes by name), and what it reads under them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from agents.models import Node, NodeDomain, measured_fresh_seconds
from facility.models import Budget, Hold
from facility.power import node_draw_sql
from llmgw.sqlin import sql_in
from placement.models import NodeBooking
from placement.planner import FacilityView


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
