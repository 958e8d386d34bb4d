"""Reads of placement as plain dicts: models, replicas, explain, headroom, and what a node must run.

The CLI (``-o json``), the API and the console all show these, so they say the same thing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from agents.node.protocol import value_shown
from llmgw.errors import NotFound
from placement import index, snapshot
from placement.drain import moving_reasons
from placement.models import GpuBooking, Model, NodeBooking, Replica, ReplicaState, Shard
from placement.planner import gpus_text, profile_text  # noqa: F401  (the model pages and ctl read them here)

HEADROOM_LIMIT = 1000
# GET /replicas answers a page of this many by default, and at most REPLICAS_PAGE_MAX (?limit=); a model's
# detail lists its first DETAIL_REPLICAS and counts every one (``states``). A model may hold 10,000.
REPLICAS_PAGE = 500
REPLICAS_PAGE_MAX = 1000
DETAIL_REPLICAS = 100
# GET /models/{name}/explain explains a page of this many replicas by default (each keeps up to
# explain.KEPT_REJECTIONS node reasons), at most REPLICAS_PAGE_MAX; its counts are of every replica.
EXPLAIN_PAGE = 100
# Replica states that hold shards.
PLACED_STATES = (ReplicaState.PLACED, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.FAILED)


def _model(name: str, *, field: str = "name") -> Model:
    """The named model, or NotFound naming ``field`` (the request's word for it)."""
    model = Model.objects.filter(name=name).first()
    if model is None:
        raise NotFound(f"model {value_shown(name)} is not known", field=field)
    return model


def profile_dict(model: Model) -> dict[str, Any]:
    """A model's profile as it was applied (the document's ``profile:`` block)."""
    return {
        "gpus": model.gpus,
        "nodes": model.nodes,
        "cpu_cores": model.cpu_cores,
        "memory_gib": model.memory_gib,
        "power_watts": model.power_watts,
        "keep_within": model.keep_within or None,
        "node_selector": model.node_selector or None,
        "topology": model.topology or "any",
        "command": model.command or None,
        "health_path": model.health_path,
        "min_ready_seconds": model.min_ready_seconds,
    }


def _shards_by_replica(replicas: list[Replica]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    rows = (
        Shard.objects.filter(replica__in=[r.pk for r in replicas])
        .order_by("replica_id", "node__name")
        .values_list(
            "replica_id",
            "node__name",
            "gpu_indices",
            "cpu_cores",
            "memory_gib",
            "draw_watts",
            "state",
            "port",
        )
    )
    for replica_id, node, gpus, cores, memory, draw, state, port in rows:
        out[replica_id].append(
            {
                "node": node,
                "gpus": gpus,
                "cpu_cores": cores,
                "memory_gib": memory,
                "draw_watts": draw,
                "state": state,
                "port": port,
            }
        )
    return out


UNREACHABLE = "unreachable"  # shown, never stored: a replica on a node that stopped heartbeating


def unreachable_replicas(replica_ids: Iterable[int] | None = None) -> dict[int, list[str]]:
    """Replica id → its nodes that are not ready. Its stored state is the agent's last word, and an agent
    that went quiet says nothing more: such a replica may be serving or may be gone."""
    from agents.models import Node, heartbeat_is_fresh

    now = timezone.now()
    # Plain values, not nodes: a thousand nodes with shards, read on every Models page and live update.
    quiet = {
        pk: name
        for pk, name, at, interval in Node.objects.filter(shards__isnull=False)
        .distinct()
        .values_list("pk", "name", "last_heartbeat_at", "heartbeat_interval_seconds")
        if not heartbeat_is_fresh(at, interval, now)
    }
    if not quiet:
        return {}
    shards = Shard.objects.filter(node_id__in=quiet)
    if replica_ids is not None:
        shards = shards.filter(replica_id__in=list(replica_ids))
    out: dict[int, list[str]] = defaultdict(list)
    for replica_id, node_id in shards.values_list("replica_id", "node_id"):
        out[replica_id].append(quiet[node_id])
    return dict(out)


def shown_state(state: str, replica_id: int, unreachable: dict[int, list[str]]) -> str:
    """The state people see: a placed, starting or ready replica on a quiet node is `unreachable`."""
    if replica_id in unreachable and state in (ReplicaState.PLACED, ReplicaState.STARTING, ReplicaState.READY):
        return UNREACHABLE
    return state


def _replica_dict(
    replica: Replica, model_name: str, shards: list[dict[str, Any]], unreachable: dict[int, list[str]] | None = None,
    moving: dict[int, str] | None = None,
) -> dict[str, Any]:
    unreachable = unreachable or {}
    quiet = unreachable.get(replica.pk, [])
    reason = (moving or {}).get(replica.pk) or replica.reason or None
    if quiet and shown_state(replica.state, replica.pk, unreachable) == UNREACHABLE:
        reason = f"{', '.join(sorted(quiet))}: not ready (no heartbeat); last reported {replica.state}"
    return {
        "id": replica.pk,
        "model": model_name,
        "ordinal": replica.ordinal,
        "state": shown_state(replica.state, replica.pk, unreachable),
        "nodes": [s["node"] for s in shards],
        "shards": shards,
        "reason": reason,
        "placed_at": replica.placed_at.isoformat() if replica.placed_at else None,
        "ready_since": replica.ready_since.isoformat() if replica.ready_since else None,
        "replaces": replica.replaces_id,
    }


def replica_rows(*, model: str | None = None, offset: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
    """The replicas (of one model when named), by model and ordinal, with their shards: ``limit`` of them
    from ``offset``, or every one from it."""
    replicas = Replica.objects.select_related("model").order_by("model__name", "ordinal")
    if model is not None:
        replicas = replicas.filter(model=_model(model, field="model"))
    replicas = list(replicas[offset : None if limit is None else offset + limit])
    shards = _shards_by_replica(replicas)
    unreachable = unreachable_replicas([r.pk for r in replicas])
    moving = moving_reasons(replicas, {r.model_id: r.model for r in replicas})
    return [_replica_dict(r, r.model.name, shards.get(r.pk, []), unreachable, moving) for r in replicas]


def _model_dict(model: Model, states: Counter, efficiency: dict[str, list] | None = None) -> dict[str, Any]:
    if efficiency is None:
        from placement.throughput import efficiency_rows

        efficiency = efficiency_rows()
    return {
        "name": model.name,
        "replicas": {
            "desired": model.replicas,
            "placed": sum(states[s] for s in PLACED_STATES) + states[UNREACHABLE],
            "ready": states[ReplicaState.READY],
            "pending": states[ReplicaState.PENDING],
            "failed": states[ReplicaState.FAILED],
            "unreachable": states[UNREACHABLE],
        },
        "class": model.service_class,
        "min_ready": model.min_ready,
        "efficiency": efficiency.get(model.name, []),
        "profile": profile_dict(model),
        "error": model.error or None,
        "error_at": model.error_at.isoformat() if model.error_at else None,
        "created_at": model.created_at.isoformat(),
        "updated_at": model.updated_at.isoformat(),
    }


def model_rows(names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every model (only the named ones, when given) with its desired, placed, ready and pending replica
    counts and its profile."""
    models = Model.objects.order_by("name")
    replicas = Replica.objects.all()
    if names is not None:
        models = models.filter(name__in=list(names))
        replicas = replicas.filter(model__in=models)
    states: dict[int, Counter] = defaultdict(Counter)
    unreachable = unreachable_replicas()
    for replica_id, model_id, state in replicas.values_list("id", "model_id", "state"):
        states[model_id][shown_state(state, replica_id, unreachable)] += 1
    from placement.throughput import efficiency_rows

    efficiency = efficiency_rows()
    return [_model_dict(m, states[m.pk], efficiency) for m in models]


def model_detail(name: str) -> dict[str, Any]:
    """One model: its counts (every replica by the state shown) and profile, and its first DETAIL_REPLICAS
    replicas (the rest: replica_rows)."""
    model = _model(name)
    unreachable = unreachable_replicas()
    states = Counter(
        shown_state(state, replica_id, unreachable)
        for replica_id, state in Replica.objects.filter(model=model).values_list("id", "state")
    )
    body = _model_dict(model, states)
    body["states"] = {state: states[state] for state in (*ReplicaState.values, UNREACHABLE) if states[state]}
    body["replica_list"] = replica_rows(model=name, limit=DETAIL_REPLICAS)
    return body


def _explained(
    replica: Replica, model_name: str, shards: list[dict[str, Any]], unreachable: dict[int, list[str]],
    moving: dict[int, str] | None = None,
) -> dict[str, Any]:
    """A replica with what it kept of why it is where it is (placed) or why it waits (pending), and why it
    moves when it does (``moving``: moving_reasons)."""
    kept = replica.explain or {}
    row = _replica_dict(replica, model_name, shards, unreachable, moving)
    if replica.state == ReplicaState.PENDING:
        row.update(
            {
                "summary": replica.reason or kept.get("summary") or "not planned yet",
                "causes": kept.get("causes", []),
                "nodes_checked": kept.get("nodes_checked"),
                "rejections": kept.get("rejections", []),
                "conflicts": kept.get("conflicts", []),
            }
        )
    else:
        row.update(
            {
                "why": kept.get("why"),
                "notes": kept.get("notes", []),
                "summary": kept.get("summary") or None,
                "passed_over": kept.get("passed_over", 0),
                "rejections": kept.get("rejections", []),
                "attempts": kept.get("attempts"),
                "conflicts": kept.get("conflicts", []),
            }
        )
    return row


def model_explain(name: str, *, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
    """For each replica its node(s) and why, and the rejections kept when it was placed; for a pending
    one the summary of why no node fits: ``limit`` replicas by ordinal from ``offset`` (every one from it
    when None), with the counts of all of them (``replicas_total``)."""
    model = _model(name)
    counts = Counter(dict(Replica.objects.filter(model=model).values_list("state").annotate(n=Count("id"))))
    replicas = list(Replica.objects.filter(model=model).order_by("ordinal")[offset : None if limit is None else offset + limit])
    shards = _shards_by_replica(replicas)
    unreachable = unreachable_replicas([r.pk for r in replicas])
    moving = moving_reasons(replicas, {model.pk: model})
    out = [_explained(replica, model.name, shards.get(replica.pk, []), unreachable, moving) for replica in replicas]
    return {
        "model": model.name,
        "desired": model.replicas,
        "placed": sum(counts[s] for s in PLACED_STATES),
        "pending": counts[ReplicaState.PENDING],
        "profile": profile_dict(model),
        "replicas_total": sum(counts.values()),
        "offset": offset,
        "replicas": out,
    }


def models_shown(names: Iterable[str], *, offset: int = 0, limit: int = 10) -> dict[str, dict[str, Any]]:
    """What the console shows of each named model, however many replicas it has: its replicas that are not
    pending from ``offset`` (at most ``limit``, each explained) and how many there are, and its pending
    replicas grouped by their reason to wait (they ask the planner the same question, so most share one):
    each group's reason, count, first and last ordinal, and the explain the first of them kept."""
    models = {m.name: m for m in Model.objects.filter(name__in=list(names))}
    listed = Replica.objects.filter(model__in=list(models.values())).exclude(state=ReplicaState.PENDING)
    others = dict(listed.values("model_id").annotate(n=Count("id")).values_list("model_id", "n"))
    shown: dict[int, list[Replica]] = defaultdict(list)
    if limit > 0 and models:
        # Each model's slice in one query: its replicas numbered by ordinal, the page's numbers kept.
        numbered = listed.annotate(
            number=Window(RowNumber(), partition_by=[F("model_id")], order_by=F("ordinal").asc())
        ).filter(number__gt=offset, number__lte=offset + limit)
        for replica in numbered.order_by("model_id", "ordinal"):
            shown[replica.model_id].append(replica)
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    waiting = (
        Replica.objects.filter(model__in=list(models.values()), state=ReplicaState.PENDING)
        .values("model_id", "reason")
        .annotate(count=Count("id"), first=Min("ordinal"), last=Max("ordinal"))
        .order_by("model_id", "-count", "first")
    )
    for group in waiting:
        groups[group["model_id"]].append(group)
    firsts = Q(pk__in=[])
    for model_id, found in groups.items():
        for group in found:
            firsts |= Q(model_id=model_id, ordinal=group["first"])
    first_replicas = {(r.model_id, r.ordinal): r for r in Replica.objects.filter(firsts)} if groups else {}
    every = [r for rows in shown.values() for r in rows]
    shards = _shards_by_replica(every)
    unreachable = unreachable_replicas([r.pk for r in every]) if every else {}
    moving = moving_reasons(every, {model.pk: model for model in models.values()})
    out: dict[str, dict[str, Any]] = {}
    for name, model in models.items():
        pending = []
        for group in groups.get(model.pk, []):
            first = first_replicas[(model.pk, group["first"])]
            pending.append(
                {
                    "count": group["count"],
                    "first": group["first"],
                    "last": group["last"],
                    **_explained(first, name, [], {}),
                }
            )
        out[name] = {
            "replicas": [_explained(r, name, shards.get(r.pk, []), unreachable, moving) for r in shown[model.pk]],
            "listed_total": others.get(model.pk, 0),
            "pending_groups": pending,
        }
    return out


def model_headroom(name: str, *, limit: int = HEADROOM_LIMIT) -> dict[str, Any]:
    """How many more replicas of the model fit now, and why the next does not: a dry run, nothing written."""
    return _headroom_of(_model(name), snapshot.node_views(), snapshot.facility_view(), limit)


def models_headroom(names: Iterable[str], *, limit: int = HEADROOM_LIMIT) -> dict[str, dict[str, Any]]:
    """:func:`model_headroom` of each model named (those that exist), by name: one read of the nodes for them
    all (the Models page asks for its page's models at once; the read is most of one model's dry run)."""
    models = list(Model.objects.filter(name__in=list(names)).order_by("name"))
    if not models:
        return {}
    nodes, facility = snapshot.node_views(), snapshot.facility_view()
    return {model.name: _headroom_of(model, nodes, facility, limit) for model in models}


def _headroom_of(model: Model, nodes, facility, limit: int) -> dict[str, Any]:
    request = snapshot.replica_request(model)
    # index.headroom plans on an index of its own over the views: they are read, never changed.
    result = index.headroom(request, nodes, facility, limit=limit)
    return {
        "model": model.name,
        "existing": len(request.existing),
        "fits": result.fits,
        "limit": limit,
        "why_not": result.why_not,
    }


ASSIGNMENT_FIELDS = (
    "node__name", "replica_id", "replica__model__name", "replica__model__command", "replica__model__health_path",
    "gpu_indices", "cpu_cores", "memory_gib",
)


def _assignment_rows(shards) -> list[tuple[str, dict]]:
    rows = shards.exclude(replica__state=ReplicaState.STOPPING).order_by("replica_id").values_list(*ASSIGNMENT_FIELDS)
    return [
        (node, {"id": rid, "model": name, "command": command, "health_path": health, "gpus": gpus,
                "cpu_cores": cores, "memory_gib": memory})
        for node, rid, name, command, health, gpus, cores, memory in rows
    ]


def node_assignments(node) -> list[dict]:
    """The replicas a node's agent must run now (its shards not being stopped), as the heartbeat answers.

    `node` is a Node or a node's name.
    """
    shards = Shard.objects.filter(**({"node__name": node} if isinstance(node, str) else {"node": node}))
    return [item for _, item in _assignment_rows(shards)]


def booked_gpus(node_ids: Iterable[int]) -> dict[int, int]:
    """Node id → how many of its present GPUs are booked (nodes with none booked are absent)."""
    from agents.models import GPU

    booked = GpuBooking.objects.filter(node_id=OuterRef("node_id"), index=OuterRef("index"))
    rows = (
        GPU.objects.filter(node_id__in=list(node_ids), present=True)
        .filter(Exists(booked))
        .values("node_id")
        .annotate(n=Count("id"))
        .values_list("node_id", "n")
    )
    return dict(rows)


def placed_watts(node_ids: Iterable[int] | None = None) -> dict[int, float]:
    """Node id → the declared draw its shards book (nodes that never had a shard are absent)."""
    rows = NodeBooking.objects.all()
    if node_ids is not None:
        rows = rows.filter(node_id__in=list(node_ids))
    return dict(rows.values_list("node_id", "placed_watts"))


def gpu_bookers(*, node_id: int) -> dict[int, str]:
    """A node's booked GPU indices → the replica that has each (``model#ordinal``)."""
    return {index: name for index, (_, name) in gpu_replicas(node_id=node_id).items()}


def gpu_replicas(*, node_id: int) -> dict[int, tuple[int, str]]:
    """A node's booked GPU indices → the replica that has each: its id and ``model#ordinal``."""
    rows = GpuBooking.objects.filter(node_id=node_id).values_list(
        "index", "shard__replica_id", "shard__replica__model__name", "shard__replica__ordinal"
    )
    return {index: (replica_id, f"{model}#{ordinal}") for index, replica_id, model, ordinal in rows}


def all_assignments(nodes: Iterable[str] | None = None) -> dict[str, list[dict]]:
    """Every node's assignments in one read (only `nodes`' when given): node name → what
    node_assignments would answer; a node with none is absent."""
    shards = Shard.objects.all() if nodes is None else Shard.objects.filter(node__name__in=list(nodes))
    out: dict[str, list[dict]] = {}
    for node, item in _assignment_rows(shards):
        out.setdefault(node, []).append(item)
    return out


def facility_overview() -> dict[str, Any]:
    """The facility's overview (:func:`facility.selectors.facility_overview`) with each hold's drain
    progress (``drain_progress``, ``drain_text``: None when nothing drains there)."""
    from facility.models import Hold
    from facility.selectors import facility_overview as overview_of_facility
    from placement.drain import drain_progress

    overview = overview_of_facility()
    # The holds the overview read already, so drain progress does not read them again.
    holds = [
        Hold(domain=row["domain"], drain=row["hold"]["drain"]) for row in overview["domains"] if row["hold"]
    ]
    drains = drain_progress(holds)
    for row in overview["domains"]:
        hold = row["hold"]
        if hold is not None:
            progress = drains.get(row["domain"])
            hold["drain_progress"] = progress.as_dict() if progress is not None else None
            hold["drain_text"] = progress.text if progress is not None else None
    overview["node_drains"] = {
        key.split(":", 1)[1]: progress.as_dict() for key, progress in drains.items() if key.startswith("node:")
    }
    return overview
