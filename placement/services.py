"""Writes of placement: models (apply, delete), the guarded commit of a replica, freeing, reconcile.

Every interface (ctl, API, console, admin, the reconcile task) calls these. The shape of a placement:

1. plan on plain reads (a :class:`placement.index.PlacementIndex` built once per reconcile run);
2. in one transaction (a savepoint when nested): lock the replica, then the Budget rows of every
   domain its shards count against in sorted order, then the chosen nodes sorted by name; re-check
   against the locked rows (node ready, not cordoned, not held; domain power from the locked
   figures; GPUs, cores and memory through guarded UPDATEs); write shards, GPU bookings, counters;
3. a failed re-check is a lost race: the transaction (savepoint) rolls back, the node is excluded, the
   index takes the fresh view of what changed, and the replica is planned again, at most
   :data:`MAX_ATTEMPTS` times.

Locking budgets, not just nodes, is what keeps two shards on two nodes of one rack from both taking
its last kilowatt. On SQLite (the embedded default) ``select_for_update`` is a no-op and the
IMMEDIATE transaction mode serialises writers instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from agents.models import GPU, Node, NodeDomain
from facility.domains import KEEP_WITHIN_LEVELS
from facility.domains import domains_of as domains_of_labels
from facility.models import Budget, Hold
from facility.power import Budget as BudgetFigures
from llmgw.errors import InvalidInput, NotFound
from llmgw.yamldoc import Document, dotted, load_documents, read_text
from placement import snapshot
from placement.index import PlacementIndex
from placement.models import Model, Replica, ReplicaState, Shard
from placement.planner import FacilityView, NoFit, Plan, ReplicaRequest, power_rejection_in
from placement.selector import SelectorError, parse_selector

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
# What a replica keeps of the rejections at the moment it was placed (or found no node).
KEPT_REJECTIONS = 20
SUMMARY_GROUPS = 5
MODEL_KEYS = ("kind", "name", "replicas", "profile")
PROFILE_KEYS = (
    "gpus",
    "nodes",
    "cpu_cores",
    "memory_gib",
    "power_watts",
    "keep_within",
    "node_selector",
    "command",
    "health_path",
    "min_ready_seconds",
)
# The order the issue names them in; KEEP_WITHIN_LEVELS is the same set.
KEEP_WITHIN_CHOICES = ("rack", "row", "room", "site")
assert set(KEEP_WITHIN_CHOICES) == set(KEEP_WITHIN_LEVELS)
# \Z, not $: `$` also matches before a trailing newline, and "name\n" is not a name.
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?\Z")
MAX_REPLICAS = 10_000


# -- model documents ---------------------------------------------------------------------------------------


class _Bad(Exception):
    """A refusal found while reading a document: the path of the field and what is wrong with it."""

    def __init__(self, path: tuple[str | int, ...], message: str, *, whole: str | None = None):
        super().__init__(message)
        self.path = path
        self.message = message
        # A message that already names the field its own way (a selector's parse error).
        self.whole = whole


def _count(value: Any, path: tuple[str, ...], *, minimum: int = 0, maximum: int = 100_000) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(path, f"must be a whole number, not {value!r}")
    if value < minimum:
        if minimum == 0:
            raise _Bad(path, f"must not be negative (got {value})")
        raise _Bad(path, f"must be at least {minimum} (got {value})")
    if value > maximum:
        raise _Bad(path, f"must be at most {maximum} (got {value})")
    return value


def _number(value: Any, path: tuple[str, ...], unit: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad(path, f"must be a number of {unit}, not {value!r}")
    if value < 0:
        raise _Bad(path, f"must not be negative (got {value:g})")
    return float(value)


def _text(value: Any, path: tuple[str, ...], *, max_length: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Bad(path, f"must be text, not {value!r}")
    if len(value) > max_length:
        raise _Bad(path, f"at most {max_length} characters")
    return value


def parse_model_document(data: Any) -> dict[str, Any]:
    """Check one ``kind: Model`` document whole; the values to store, or _Bad naming the field."""
    if not isinstance(data, Mapping):
        raise _Bad((), "a model document is a mapping with kind: Model, name, replicas and profile")
    for key in data:
        if key not in MODEL_KEYS:
            raise _Bad((str(key),), f"unknown key; a Model takes: {', '.join(MODEL_KEYS)}")
    if "kind" not in data:
        raise _Bad(("kind",), "required; write kind: Model")
    if data["kind"] != "Model":
        raise _Bad(("kind",), f"unknown kind {data['kind']!r}; llmgw ctl apply takes kind: Model")
    name = data.get("name")
    if name is None:
        raise _Bad(("name",), "required")
    if not isinstance(name, str) or not MODEL_NAME_RE.match(name):
        raise _Bad(
            ("name",), f"{name!r} is not a model name (letters, digits, '.', '_' and '-', at most 200)"
        )
    replicas = _count(data.get("replicas", 1), ("replicas",), maximum=MAX_REPLICAS)
    profile = data.get("profile")
    if profile is None:
        raise _Bad(("profile",), "required: gpus per node at least (gpus: 0 for a CPU-only profile)")
    if not isinstance(profile, Mapping):
        raise _Bad(("profile",), "must be a mapping")
    for key in profile:
        if key not in PROFILE_KEYS:
            raise _Bad(("profile", str(key)), f"unknown key; a profile takes: {', '.join(PROFILE_KEYS)}")
    if "gpus" not in profile:
        raise _Bad(("profile", "gpus"), "required (0 for a CPU-only profile)")
    values: dict[str, Any] = {
        "name": name,
        "replicas": replicas,
        "gpus": _count(profile["gpus"], ("profile", "gpus"), maximum=64),
        "nodes": _count(profile.get("nodes", 1), ("profile", "nodes"), minimum=1, maximum=1024),
        "cpu_cores": _count(profile.get("cpu_cores", 0), ("profile", "cpu_cores"), maximum=16384),
        "memory_gib": _number(profile.get("memory_gib", 0), ("profile", "memory_gib"), "GiB"),
        "power_watts": _number(
            profile.get("power_watts"), ("profile", "power_watts"), "watts", allow_none=True
        ),
        "command": _text(profile.get("command"), ("profile", "command"), max_length=2000),
        "health_path": _text(
            profile.get("health_path", "/health"), ("profile", "health_path"), max_length=200
        )
        or "/health",
        "min_ready_seconds": _count(
            profile.get("min_ready_seconds", 10), ("profile", "min_ready_seconds"), maximum=86_400
        ),
    }
    keep_within = profile.get("keep_within")
    if keep_within is not None and keep_within not in KEEP_WITHIN_CHOICES:
        raise _Bad(
            ("profile", "keep_within"),
            f"must be one of {', '.join(KEEP_WITHIN_CHOICES)}, not {keep_within!r}",
        )
    values["keep_within"] = keep_within or ""
    selector = _text(profile.get("node_selector"), ("profile", "node_selector"), max_length=2000)
    try:
        parse_selector(selector)
    except SelectorError as exc:
        raise _Bad(("profile", "node_selector"), str(exc), whole=f"profile.{exc}") from exc
    values["node_selector"] = selector
    return values


def _refusal(bad: _Bad, doc: Document | None) -> InvalidInput:
    """The refusal in the words of the interface: with file and line for a file, the field alone for JSON."""
    field_name = dotted(bad.path)
    if doc is None:
        text = bad.whole or (f"{field_name}: {bad.message}" if field_name else bad.message)
        return InvalidInput(text, field=field_name or None)
    if bad.whole:
        line = doc.line(bad.path)
        where = f"{doc.filename} line {line}: " if line else f"{doc.filename}: "
        return InvalidInput(where + bad.whole, field=field_name)
    return doc.error(bad.path, bad.message)


@dataclass
class Applied:
    """What applying one model document did: ``created``, ``updated`` or ``unchanged``."""

    name: str
    action: str


def _models_save(documents: list[dict[str, Any]]) -> list[Applied]:
    results = []
    for values in documents:
        name = values["name"]
        fields = {k: v for k, v in values.items() if k != "name"}
        model = Model.objects.select_for_update().filter(name=name).first()
        if model is None:
            Model.objects.create(name=name, **fields)
            results.append(Applied(name, "created"))
            continue
        changed = [k for k, v in fields.items() if getattr(model, k) != v]
        if changed:
            for key in changed:
                setattr(model, key, fields[key])
            model.save(update_fields=[*changed, "updated_at"])
        results.append(Applied(name, "updated" if changed else "unchanged"))
    _request_reconcile()
    return results


@transaction.atomic
def models_apply(*, text: str, filename: str = "models.yaml") -> list[Applied]:
    """Create or update the models of a multi-document YAML file: all of them, or none with the reason.

    A changed profile applies to replicas placed from now on; placed ones keep their shards.
    """
    docs = load_documents(text, filename)
    if not docs:
        raise InvalidInput(f"{filename}: no documents; write kind: Model documents separated by ---")
    parsed: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, doc in enumerate(docs, start=1):
        try:
            values = parse_model_document(doc.data)
        except _Bad as bad:
            raise _refusal(bad, doc) from None
        if values["name"] in seen:
            raise doc.error(
                ("name",), f"{values['name']!r} is already in document {seen[values['name']]} of this file"
            )
        seen[values["name"]] = number
        parsed.append(values)
    return _models_save(parsed)


def models_apply_file(*, path: str | Path) -> list[Applied]:
    """``llmgw ctl apply -f models.yaml``."""
    return models_apply(text=read_text(path), filename=str(path))


@transaction.atomic
def model_apply(*, data: Any) -> Applied:
    """Create or update one model from a document given as data (the API's JSON body)."""
    try:
        values = parse_model_document(data)
    except _Bad as bad:
        raise _refusal(bad, None) from None
    return _models_save([values])[0]


@transaction.atomic
def model_delete(*, name: str) -> int:
    """Delete a model: its replicas' shards are freed first (GPUs, cores, memory, placed watts).

    Returns how many replicas went with it.
    """
    model = Model.objects.select_for_update().filter(name=name).first()
    if model is None:
        raise NotFound(f"model {name!r} is not known", field="name")
    replicas = list(Replica.objects.filter(model=model).order_by("-ordinal"))
    for replica in replicas:
        replica_free(replica=replica)
    model.delete()
    _request_reconcile()
    return len(replicas)


def _request_reconcile() -> None:
    from placement.tasks import request_reconcile

    request_reconcile()


# -- freeing ----------------------------------------------------------------------------------------------


@transaction.atomic
def replica_free(*, replica: Replica) -> bool:
    """Remove a replica and give back what its shards booked, in one transaction; False if already gone.

    Safe to call twice at once (two reconciles finishing one drain): the replica row is locked, and
    only the shards this call deletes are given back.
    """
    # Nodes first, by name, as a placement locks them (after budgets: freeing only lowers use).
    node_ids = list(Shard.objects.filter(replica=replica).values_list("node_id", flat=True))
    locked = set(_lock_nodes(node_ids))
    if not Replica.objects.select_for_update().filter(pk=replica.pk).exists():
        return False  # freed meanwhile
    shard_ids = list(Shard.objects.filter(replica=replica).values_list("id", flat=True))
    if shard_ids:
        GPU.objects.filter(shard_id__in=shard_ids).update(shard=None)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {Shard._meta.db_table} WHERE id IN ({_placeholders(shard_ids)}) "
                f"RETURNING node_id, cpu_cores, memory_gib, draw_watts",
                shard_ids,
            )
            deleted = cursor.fetchall()
        _lock_nodes([row[0] for row in deleted if row[0] not in locked])  # placed between the two reads
        for node_id, cores, memory, draw in deleted:
            Node.objects.filter(pk=node_id).update(
                cpu_cores_allocated=F("cpu_cores_allocated") - cores,
                memory_gib_allocated=F("memory_gib_allocated") - memory,
                placed_watts=F("placed_watts") - (draw or 0),
            )
    Replica.objects.filter(pk=replica.pk).delete()
    return True


def _lock_nodes(node_ids: Iterable[int]) -> list[int]:
    ids = sorted(set(node_ids))
    if not ids:
        return []
    return list(Node.objects.select_for_update().filter(pk__in=ids).order_by("name").values_list("id", flat=True))


# -- the guarded commit -----------------------------------------------------------------------------------


class _ReplicaGone(Exception):
    """The replica was placed or removed by someone else while this plan was made: nothing to write."""


class LostRace(Exception):
    """A re-check against the locked rows failed: someone else took what the plan counted on."""

    def __init__(self, node: str, reason: str, refresh: Iterable[str] = ()):
        super().__init__(reason)
        self.node = node
        self.reason = reason
        # Nodes whose view the index must take afresh (the node, or a domain's members).
        self.refresh = {node, *refresh}


def passed_over_summary(rejections: Mapping[str, str]) -> str:
    """``passed over (3 nodes): 2 × gpu: 8 requested, 0 free; 1 × …`` (at most five groups), or ``""``."""
    if not rejections:
        return ""
    counts = Counter(rejections.values())
    groups = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:SUMMARY_GROUPS]
    listed = "; ".join(f"{count} × {reason}" for reason, count in groups)
    total = len(rejections)
    return f"passed over ({total} node{'' if total == 1 else 's'}): {listed}"


def placed_explain(plan: Plan, *, attempts: int, conflicts: list[str]) -> dict[str, Any]:
    """What a placed replica keeps: its shards, why there, and the rejections of the nodes ranked ahead."""
    kept = list(plan.rejections.items())[:KEPT_REJECTIONS]
    return {
        "why": plan.why,
        "shards": [
            {
                "node": s.node,
                "gpus": list(s.gpu_indices),
                "cpu_cores": s.cpu_cores,
                "memory_gib": s.memory_gib,
                "draw_watts": s.draw_watts,
            }
            for s in plan.shards
        ],
        "passed_over": len(plan.rejections),
        "summary": passed_over_summary(plan.rejections),
        "rejections": [{"node": n, "reason": r} for n, r in kept],
        "attempts": attempts,
        "conflicts": conflicts,
    }


def pending_explain(nofit: NoFit) -> dict[str, Any]:
    """What a pending replica keeps: the summary and the first node reasons."""
    return {
        "summary": nofit.summary,
        "nodes_checked": len(nofit.rejections),
        "rejections": [{"node": n, "reason": r} for n, r in list(nofit.rejections.items())[:KEPT_REJECTIONS]],
    }


def _placeholders(values: list) -> str:
    return ", ".join(["%s"] * len(values))


def _locked_state(
    cursor, names: list[str], touched: list[str], facility: FacilityView, now: datetime
) -> tuple[dict[str, tuple], dict[str, tuple[float, float]], dict[str, str], dict[str, float]]:
    """Lock the budgets (sorted by domain), then the nodes (sorted by name); read them, holds and use.

    Returns (node rows by name, budgets (cap, other) by domain, holds by domain, each locked budget's
    domain use). Raw SQL: this is the hot path of every placement.
    """
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    # The replica row is not locked here: the write's guarded UPDATE of it (state still pending) is
    # the check, and saves a round trip on every placement.
    budgets: dict[str, tuple[float, float]] = {}
    if touched:
        cursor.execute(
            f"SELECT domain, cap_watts, other_watts FROM {Budget._meta.db_table} "
            f"WHERE domain IN ({_placeholders(touched)}) ORDER BY domain{lock}",
            touched,
        )
        budgets = {domain: (cap, other) for domain, cap, other in cursor.fetchall()}
    # One statement for the rest: it starts after the budget locks are held, so the members' draws it
    # sums include every placement committed into those domains before us. The nodes are locked in it,
    # by name, before the sums are read.
    node_table = Node._meta.db_table
    sql = (
        f"WITH locked AS MATERIALIZED (SELECT name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"labels FROM {node_table} WHERE name IN ({_placeholders(names)}) ORDER BY name{lock}) "
        f"SELECT 'node', name, id, cordoned, last_heartbeat_at, heartbeat_interval_seconds, "
        f"CAST(labels AS text), CAST(NULL AS double precision) FROM locked"
    )
    params: list[Any] = list(names)
    domains = sorted(budgets)
    if touched:
        sql += (
            f" UNION ALL SELECT 'hold', domain, NULL, NULL, NULL, NULL, reason, NULL "
            f"FROM {Hold._meta.db_table} WHERE domain IN ({_placeholders(touched)})"
        )
        params += touched
    if domains:
        # node_watts + the larger of placed and fresh measured draw (facility.power.node_use_watts).
        fresh_after = now - timedelta(seconds=snapshot.fresh_seconds())
        sql += (
            f" UNION ALL SELECT 'use', nd.domain, COUNT(*), NULL, NULL, NULL, NULL, SUM(CASE WHEN "
            f"n.measured_watts IS NOT NULL AND n.sensors_at >= %s AND n.measured_watts > n.placed_watts "
            f"THEN n.measured_watts ELSE n.placed_watts END) "
            f"FROM {NodeDomain._meta.db_table} nd JOIN {node_table} n ON n.id = nd.node_id "
            f"WHERE nd.domain IN ({_placeholders(domains)}) GROUP BY nd.domain"
        )
        params += [connection.ops.adapt_datetimefield_value(fresh_after), *domains]
    cursor.execute(sql, params)
    nodes: dict[str, tuple] = {}
    holds: dict[str, str] = {}
    node_watts = facility.settings.node_watts or 0
    use = {domain: budgets[domain][1] for domain in domains}
    for kind, key, a, b, c, d, reason, drawn in cursor.fetchall():
        if kind == "node":
            # The labels are the locked row's latest: a relabel committed since the plan is seen here.
            nodes[key] = (key, a, b, c, d, reason)
        elif kind == "hold":
            holds[key] = reason
        else:
            use[key] += a * node_watts + (drawn or 0)
    return nodes, budgets, holds, use


def _is_ready(last_heartbeat_at: datetime | None, interval: float, now: datetime) -> bool:
    """Node.is_ready on the locked row's columns."""
    if last_heartbeat_at is None:
        return False
    if isinstance(last_heartbeat_at, str):  # SQLite answers raw SQL with text
        last_heartbeat_at = datetime.fromisoformat(last_heartbeat_at)
    if timezone.is_naive(last_heartbeat_at):
        last_heartbeat_at = timezone.make_aware(last_heartbeat_at, UTC)
    window = interval * django_settings.LLMGW_MISSED_HEARTBEATS
    return (now - last_heartbeat_at).total_seconds() <= window


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
        nodes, budget_rows, held, use = _locked_state(cursor, names, touched, facility, now)
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
            taken: dict[str, float] = defaultdict(float)
            for shard in shards:
                mine = snapshot.level_sorted(d for d in domains_of[shard.node] if d in budgets)
                reason = power_rejection_in(
                    [(budgets[d], use[d], taken[d]) for d in mine], shard.draw_watts, facility.settings.margin
                )
                if reason is not None:
                    raise LostRace(shard.node, f"{shard.node}: {reason}", refresh=snapshot.members_of(mine))
                for d in mine:
                    taken[d] += shard.draw_watts or 0
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
        f"NOT EXISTS (SELECT 1 FROM {Hold._meta.db_table} WHERE domain IN ({_placeholders(touched)}))"
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
            UPDATE {GPU._meta.db_table} AS gpu SET shard_id = s.id FROM s JOIN v ON v.node_id = s.node_id
            WHERE gpu.node_id = s.node_id AND gpu.index = ANY(v.gpus) AND gpu.present AND gpu.shard_id IS NULL
            RETURNING gpu.node_id
        ),
        n AS (
            UPDATE {Node._meta.db_table} AS node SET
                cpu_cores_allocated = node.cpu_cores_allocated + v.cores,
                memory_gib_allocated = node.memory_gib_allocated + v.mem,
                placed_watts = node.placed_watts + COALESCE(v.draw, 0)
            FROM v, r
            WHERE node.id = v.node_id AND node.cpu_cores >= node.cpu_cores_allocated + v.cores
              AND node.memory_gib >= node.memory_gib_allocated + v.mem - 1e-9
            RETURNING node.id
        )
        SELECT ARRAY(SELECT node_id FROM g), ARRAY(SELECT id FROM n), (SELECT COUNT(*) FROM r), {hold_guard}
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
        raise _ReplicaGone()
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
            booked = GPU.objects.filter(
                node_id=node_id, index__in=shard.gpu_indices, present=True, shard__isnull=True
            ).update(shard_id=row.pk)
            if booked != len(shard.gpu_indices):
                raise LostRace(
                    shard.node, f"{shard.node}: GPUs {_indices(shard.gpu_indices)} were booked meanwhile"
                )
        updated = Node.objects.filter(
            pk=node_id,
            cpu_cores__gte=F("cpu_cores_allocated") + shard.cpu_cores,
            memory_gib__gte=F("memory_gib_allocated") + shard.memory_gib - 1e-9,
        ).update(
            cpu_cores_allocated=F("cpu_cores_allocated") + shard.cpu_cores,
            memory_gib_allocated=F("memory_gib_allocated") + shard.memory_gib,
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
                return _pending(replica, result.summary, pending_explain(result) | {"conflicts": conflicts})
            return _pending(replica, result.summary, pending_explain(result))
        explain = placed_explain(result, attempts=attempt, conflicts=conflicts)
        try:
            with transaction.atomic():
                committed = _commit(replica.pk, result, index, explain, now)
        except _ReplicaGone:
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
        return Placement(plan=result)
    reason = f"Unschedulable after {MAX_ATTEMPTS} conflicting attempts: {'; '.join(conflicts)}"
    return _pending(replica, reason, {"summary": reason, "conflicts": conflicts, "rejections": []})


def _pending(replica: Replica, reason: str, explain: dict[str, Any]) -> Placement:
    if replica.reason != reason or replica.explain != explain:
        Replica.objects.filter(pk=replica.pk, state=ReplicaState.PENDING).update(
            reason=reason, explain=explain
        )
        replica.reason, replica.explain = reason, explain
    return Placement(reason=reason)


# -- reconcile --------------------------------------------------------------------------------------------


@dataclass
class ReconcileRun:
    """One reconcile pass: the time, and one index of the cluster built on first need and kept current."""

    now: datetime = field(default_factory=timezone.now)
    placed: int = 0
    pending: int = 0
    removed: int = 0
    created: int = 0
    _index: PlacementIndex | None = None
    _draining: dict[int, str] | None = None

    @property
    def draining(self) -> dict[int, str]:
        """Node id → why it drains, read once per run."""
        if self._draining is None:
            from placement.drain import draining_nodes

            self._draining = draining_nodes()
        return self._draining

    @property
    def index(self) -> PlacementIndex:
        if self._index is None:
            self._index = PlacementIndex(snapshot.node_views(now=self.now), snapshot.facility_view())
        return self._index


def replicas_scale(*, model: Model, run: ReconcileRun) -> None:
    """Create pending replicas up to the desired count, or remove the newest beyond it."""
    freed: set[str] = set()
    with transaction.atomic():
        # The model row serialises scaling: two reconciles never both create ordinal N.
        locked = Model.objects.select_for_update().filter(pk=model.pk).first()
        if locked is None:
            return
        # A drain's replacement takes the place of the replica it replaces: it is not one more.
        replicas = list(Replica.objects.filter(model=locked, replaces__isnull=True).order_by("ordinal"))
        missing = locked.replicas - len(replicas)
        if missing > 0:
            last = Replica.objects.filter(model=locked).order_by("-ordinal").values_list("ordinal", flat=True).first()
            start = (last or 0) + 1
            Replica.objects.bulk_create(
                [Replica(model=locked, ordinal=start + i, state=ReplicaState.PENDING) for i in range(missing)]
            )
            run.created += missing
        elif missing < 0:
            for replica in reversed(replicas[locked.replicas :]):
                freed.update(Shard.objects.filter(replica=replica).values_list("node__name", flat=True))
                replica_free(replica=replica)
                run.removed += 1
    if freed and run._index is not None:
        _refresh(run, freed)


def _refresh(run: ReconcileRun, names: Iterable[str]) -> None:
    for view in snapshot.node_views(names=names, now=run.now):
        run.index.update_node(view)


def replicas_place_pending(*, model: Model, run: ReconcileRun) -> None:
    """Place the model's pending replicas, oldest first, each through the guarded commit."""
    pending = snapshot.pending_replicas(model)
    if not pending:
        return
    request = snapshot.replica_request(model)
    for number, replica in enumerate(pending):
        outcome = replica_place(replica=replica, request=request, index=run.index, now=run.now)
        if outcome.plan is not None:
            run.placed += 1
            request = dataclasses.replace(request, existing=(*request.existing, outcome.plan.nodes))
        elif not outcome.gone:
            run.pending += 1
            if not outcome.reason.startswith("Unschedulable"):
                # Nothing fits this replica; the model's later ones ask the same and get the same answer.
                explain = replica.explain
                for later in pending[number + 1 :]:
                    _pending(later, outcome.reason, explain)
                    run.pending += 1
                return


def model_reconcile(*, model: Model, run: ReconcileRun) -> None:
    """One model to its desired replicas: scale, move a replica off a draining domain, place what waits."""
    from placement.drain import replicas_drain

    replicas_scale(model=model, run=run)
    with transaction.atomic():
        # One drain step per model at a time, whichever worker runs it: the model row serialises them
        # (as it does scaling), so two reconciles never make two replacements for one replica.
        if Model.objects.select_for_update().filter(pk=model.pk).exists():
            replicas_drain(model=model, run=run, draining=run.draining)
    replicas_place_pending(model=model, run=run)


def reconcile_all(*, model_names: Iterable[str] | None = None) -> ReconcileRun:
    """Every model (or the named ones, in that order) to its desired replicas; idempotent.

    Safe to run in several processes at once: scaling locks the model row, and every placement goes
    through the guarded commit, so a race costs a replan, never a double booking.
    """
    run = ReconcileRun()
    if model_names is None:
        models = list(Model.objects.order_by("name"))
    else:
        by_name = {m.name: m for m in Model.objects.filter(name__in=list(model_names))}
        models = [by_name[n] for n in model_names if n in by_name]
    for model in models:
        try:
            model_reconcile(model=model, run=run)
        except (OperationalError, IntegrityError):
            # A deadlock, a lock timeout or a race the database refused: the next run picks it up again.
            log.exception("reconcile of model %s failed; it is retried on the next run", model.name)
            run._index = None  # what it had planned may not have happened: build the index afresh
    return run


# -- what agents report -----------------------------------------------------------------------------------


def replica_state_from_shards(current: str, shard_states: list[str]) -> str:
    """A replica's state from its shards': any failed → failed; all ready → ready; else starting."""
    if current in (ReplicaState.PENDING, ReplicaState.STOPPING) or not shard_states:
        return current
    if ReplicaState.FAILED in shard_states:
        return ReplicaState.FAILED
    if all(s == ReplicaState.READY for s in shard_states):
        return ReplicaState.READY
    if all(s == ReplicaState.PLACED for s in shard_states):
        return ReplicaState.PLACED
    return ReplicaState.STARTING


def shard_states_report(*, node, states: Iterable[Mapping[str, Any]], now) -> None:
    """Record what a node's agent says of the replicas it runs; ids of other nodes' replicas are ignored.

    A replica's state follows its shards' (:func:`replica_state_from_shards`); it keeps ``ready_since``
    while it stays ready.
    """
    by_id = {int(s["id"]): s for s in states}
    if not by_id:
        return
    touched: set[int] = set()
    for shard in Shard.objects.filter(node=node, replica_id__in=by_id):
        report = by_id[shard.replica_id]
        values = {
            "state": report["state"],
            "port": report.get("port"),
            "restarts": report.get("restarts", 0),
            "message": (report.get("message") or "")[:1000],
        }
        changed = [k for k, v in values.items() if getattr(shard, k) != v]
        if changed:
            for key in changed:
                setattr(shard, key, values[key])
            shard.save(update_fields=changed)
            touched.add(shard.replica_id)
    if not touched:
        return
    shard_states: dict[int, list[str]] = defaultdict(list)
    for replica_id, state in Shard.objects.filter(replica_id__in=touched).values_list("replica_id", "state"):
        shard_states[replica_id].append(state)
    replacement_ready_after: list[int] = []
    for replica in Replica.objects.filter(pk__in=touched).select_related("model").only(
        "id", "state", "ready_since", "replaces_id", "model__min_ready_seconds", "model__name"
    ):
        state = replica_state_from_shards(replica.state, shard_states[replica.pk])
        if state == replica.state:
            continue
        ready_since = (replica.ready_since or now) if state == ReplicaState.READY else None
        Replica.objects.filter(pk=replica.pk).update(state=state, ready_since=ready_since)
        if replica.replaces_id and state == ReplicaState.READY:
            replacement_ready_after.append(replica.model.min_ready_seconds)
        if state == ReplicaState.READY and replica.model.name not in (node.weights or []):
            # It ran here, so the node holds the weights: placement prefers such nodes next time.
            node.weights = [*(node.weights or []), replica.model.name]
            Node.objects.filter(pk=node.pk).update(weights=node.weights)
    if replacement_ready_after:
        # A drain's replacement is up: the old replica stops once it has been ready long enough.
        from placement.tasks import reconcile_after

        reconcile_after(max(replacement_ready_after) + 1)
