"""From the store to the planner: one read of nodes, facility and a model's replicas, as plain views.

The planner (``placement/planner.py``) never sees a Django object; this module maps rows to its frozen
dataclasses. A node's labels for selectors are its effective labels plus attributes derived from its
GPUs (``gpu.count``, ``gpu.memory_gib``, ``gpu.product``, ``gpu.model``) where it has no label of
that name, so ``gpu.model in (H100,H200)`` works on a node nobody labelled.
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import BigIntegerField, Count, Exists, JSONField, OuterRef, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast
from django.utils import timezone

from agents.models import GPU, Node, NodeDomain, heartbeat_is_fresh, measured_fresh_seconds
from facility import selectors as facility_selectors
from facility.conditions import HOT, WARM
from facility.domains import LEVELS, Domain, parse_domain
from facility.evaluation import effective_conditions
from facility.models import Hold
from facility.power import fresh_measured_watts
from llmgw.sqlin import any_of
from placement.models import GpuBooking, Model, ModelEfficiency, NodeBooking, Replica, Shard
from placement.planner import DomainCondition, FacilityView, NodeView, Profile, ReplicaRequest
from placement.selector import parse_selector
from placement.topology import GpuTopology, topology_of

# "NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", "NVIDIA L40S" → H100, H100, L40S.
_GPU_MODEL_RE = re.compile(r"(?<![A-Za-z0-9])(G?[A-Z]{1,2}\d{2,3}[A-Z]?)(?![0-9])")
_LEVEL_ORDER = {level: i for i, level in enumerate(LEVELS)}
_NODE_FIELDS = (
    "id",
    "name",
    "fabric",
    "cpu_cores",
    "memory_gib",
    "labels",
    "cordoned",
    "heartbeat_interval_seconds",
    "last_heartbeat_at",
    "measured_peak_watts",
    "sensors_at",
    "weights",
)

# Of a node's sensors the planner reads only each card's enforced power limit, and the tokens per joule
# each card's power: the database picks one figure out as [[index, figure], …] (a node's whole sensors
# document is ~3 KB, and reading and decoding every node's would be most of the work of reading the
# nodes' views).
_GPU_FIGURES_SQL = {
    "postgresql": (
        "SELECT jsonb_agg(jsonb_build_array(g -> 'index', g -> '{key}')) "
        "FROM jsonb_array_elements(CASE WHEN jsonb_typeof({sensors} -> 'gpus') = 'array' "
        "THEN {sensors} -> 'gpus' ELSE '[]'::jsonb END) AS g WHERE jsonb_typeof(g) = 'object'"
    ),
    "sqlite": (
        "SELECT json_group_array(json_array(json_extract(g.value, '$.index'), "
        "json_extract(g.value, '$.{key}'))) "
        "FROM json_each({sensors}, '$.gpus') AS g WHERE g.type = 'object'"
    ),
}
_GPU_FIGURE_KEYS = frozenset({"enforced_power_limit_watts", "power_watts"})


def gpu_figures_sql(key: str) -> RawSQL:
    """Each card's ``key`` in a node's sensors, as ``[[index, figure], …]`` (read with gpu_figures)."""
    if key not in _GPU_FIGURE_KEYS:  # a name pasted into SQL: only the known ones
        raise ValueError(f"not a GPU figure of the sensors: {key!r}")
    sensors = f'"{Node._meta.db_table}"."sensors"'
    return RawSQL(f"({_GPU_FIGURES_SQL[connection.vendor].format(sensors=sensors, key=key)})", [], JSONField())


@functools.lru_cache(maxsize=1024)  # a fleet has a few products, named on each of its nodes
def gpu_model_of(product: str) -> str | None:
    """The short model name in a card's product name (``H100``), or None when there is none."""
    found = _GPU_MODEL_RE.search(product or "")
    return found.group(1) if found else None


# The labels derived_labels adds from a node's cards, where the node has none of that key.
GPU_DERIVED_KEYS = ("gpu.count", "gpu.product", "gpu.model", "gpu.memory_gib")


def derived_labels(labels: dict[str, str], gpus: list[tuple]) -> dict[str, str]:
    """Effective labels plus the GPU attributes selectors ask for, where the node has no such label.

    ``gpus`` holds ``(index, booked, power_limit_watts, product, memory_gib)`` of present cards.
    """
    out = dict(labels)
    out.setdefault("gpu.count", str(len(gpus)))
    if gpus:
        products = [g[3] for g in gpus if g[3]]
        memories = [g[4] for g in gpus if g[4] is not None]
        if products:
            out.setdefault("gpu.product", products[0])
            model = gpu_model_of(products[0])
            if model:
                out.setdefault("gpu.model", model)
        if memories:
            out.setdefault("gpu.memory_gib", f"{min(memories):g}")
    return out


def ordered_domains(texts: Iterable[str]) -> tuple[Domain, ...]:
    """Domains in level order (site first, PDUs last), then by name: the planner's order."""
    domains = [parse_domain(t) for t in texts]
    return tuple(sorted(domains, key=lambda d: (_LEVEL_ORDER.get(d.level, 99), d.name)))


def domain_conditions(now: datetime | None = None) -> dict[Domain, DomainCondition]:
    """The warm and hot domains (overrides included) with their mode, as the planner takes them."""
    return {
        parse_domain(domain): DomainCondition(state["condition"], enforce=state["enforce"], detail=state["detail"])
        for domain, state in effective_conditions(now=now).items()
        if state["condition"] in (HOT, WARM)
    }


def facility_view() -> FacilityView:
    """Settings, budgets by domain, holds (domain → reason) and thermal conditions, read now."""
    holds = {parse_domain(domain): reason for domain, reason in Hold.objects.values_list("domain", "reason")}
    return FacilityView(
        settings=facility_selectors.facility_settings(),
        budgets=facility_selectors.budgets(),
        holds=holds,
        conditions=domain_conditions(),
    )


def _measured(row: dict, now: datetime) -> float | None:
    return fresh_measured_watts(row["measured_peak_watts"], row["sensors_at"], now, measured_fresh_seconds())


def _ready(row: dict, now: datetime) -> bool:
    return heartbeat_is_fresh(row["last_heartbeat_at"], row["heartbeat_interval_seconds"], now)


def gpu_figures(pairs: list | None) -> dict[int, float]:
    """GPU index → its figure where reported, from the sensors' ``[[index, figure], …]`` (gpu_figures_sql):
    the power limit its agent read back, or the power it draws."""
    # Figures only: one node's odd document (a limit as text) must not stop every node's views. The
    # pairs are decoded JSON, so their types are exactly int, float, bool, str, list, dict or None.
    return {
        index: float(value)
        for index, value in pairs or ()
        if type(index) is int and type(value) in _JSON_NUMBER  # not bool: JSON's true is no card, no watts
    }


_JSON_NUMBER = frozenset({int, float})


def gpu_power_limit(spec_watts: float | None, enforced_watts: float | None) -> float | None:
    """The limit a card's derived draw counts: the enforced one its agent reads back when reported (a
    capped card draws no more than its cap, so capping frees room), else the inventory's limit."""
    return enforced_watts if enforced_watts is not None else spec_watts


# The nodes' two times, on PostgreSQL, as whole microseconds since the epoch: Django reads a
# timestamptz column through a loader of its own, in Python, two for every node in every index's
# build; made into datetimes here they cost a fraction of that, and are exactly the same.
_TIMES = ("last_heartbeat_at", "sensors_at")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@functools.lru_cache(maxsize=256)  # the nodes of one kind of machine report one wiring, in the same text
def gpu_topology_view(text: str | None) -> GpuTopology | None:
    """A node's stored ``gpu_topology`` (its JSON text) as the planner reads it; None when it reported none."""
    if not text:
        return None
    try:
        return topology_of(json.loads(text))
    except ValueError:
        return None


def _node_rows(nodes) -> list[dict]:
    """The nodes' rows for their views: _NODE_FIELDS, ``enforced`` (gpu_figures_sql) and ``topology`` (the
    GPU topology's JSON text: alike nodes share one decoded view)."""
    enforced = gpu_figures_sql("enforced_power_limit_watts")
    topology = Cast("gpu_topology", TextField())
    if connection.vendor != "postgresql":
        return list(nodes.values(*_NODE_FIELDS, enforced=enforced, topology=topology))
    table = Node._meta.db_table
    micros = {
        f"{field}_us": RawSQL(f'CAST(EXTRACT(EPOCH FROM "{table}"."{field}") * 1000000 AS bigint)', [], BigIntegerField())
        for field in _TIMES
    }
    rows = list(
        nodes.values(*(f for f in _NODE_FIELDS if f not in _TIMES), enforced=enforced, topology=topology, **micros)
    )
    for row in rows:
        for field in _TIMES:
            us = row.pop(f"{field}_us")
            row[field] = None if us is None else _EPOCH + timedelta(microseconds=us)
    return rows


def node_views(*, names: Iterable[str] | None = None, now: datetime | None = None) -> list[NodeView]:
    """Every node (or the named ones) as the planner sees it, from six queries whatever their number."""
    now = now or timezone.now()
    nodes = Node.objects.all()
    if names is not None:
        nodes = nodes.filter(name__in=any_of(names))  # thousands, freed by a scale down: one array
    rows = _node_rows(nodes.order_by("name"))
    ids = [r["id"] for r in rows]
    scoped = names is not None
    gpus: dict[int, list[tuple]] = defaultdict(list)
    gpu_rows = GPU.objects.filter(present=True)
    domain_rows = NodeDomain.objects.all()
    shard_rows = Shard.objects.all()
    booking_rows = NodeBooking.objects.all()
    if scoped:
        gpu_rows = gpu_rows.filter(node_id__in=any_of(ids))
        domain_rows = domain_rows.filter(node_id__in=any_of(ids))
        shard_rows = shard_rows.filter(node_id__in=any_of(ids))
        booking_rows = booking_rows.filter(node_id__in=any_of(ids))
    # Whether each card is booked, asked of the database beside the card (at 10,000 nodes the 80,000
    # bookings read and matched here were a sixth of this read).
    booked = GpuBooking.objects.filter(node_id=OuterRef("node_id"), index=OuterRef("index"))
    for node_id, *card in gpu_rows.order_by("node_id", "index").values_list(
        "node_id", "index", Exists(booked), "power_limit_watts", "model", "memory_gib"
    ):
        gpus[node_id].append(card)
    bookings = {row[0]: row[1:] for row in booking_rows.values_list("node_id", "cpu_cores", "memory_gib", "placed_watts")}
    domains: dict[int, list[str]] = defaultdict(list)
    for node_id, domain in domain_rows.values_list("node_id", "domain"):
        domains[node_id].append(domain)
    replicas = dict(shard_rows.values("node_id").annotate(n=Count("id")).values_list("node_id", "n"))
    # The nodes of a rack and PDU share their domains: each set is parsed and ordered once (10,000 nodes
    # have about 800 sets; parsed node by node they were a third of this read), and shared.
    orders: dict[tuple[str, ...], tuple[Domain, ...]] = {}
    views = []
    for row in rows:
        texts = tuple(sorted(domains.get(row["id"], ())))
        order = orders.get(texts)
        if order is None:
            order = orders[texts] = ordered_domains(texts)
        cards = gpus.get(row["id"], [])
        cores, memory, placed = bookings.get(row["id"], (0, 0.0, 0.0))
        enforced = gpu_figures(row["enforced"])
        limits = [gpu_power_limit(g[2], enforced.get(g[0])) for g in cards]
        limits = [w for w in limits if w is not None]
        views.append(
            NodeView(
                name=row["name"],
                ready=_ready(row, now),
                cordoned=row["cordoned"],
                labels=derived_labels(row["labels"] or {}, cards),
                domains=order,
                fabric=row["fabric"] or None,
                gpus_total=len(cards),
                free_gpus=tuple(g[0] for g in cards if not g[1]),
                cpu_cores_total=row["cpu_cores"],
                cpu_cores_free=row["cpu_cores"] - cores,
                memory_gib_total=row["memory_gib"],
                memory_gib_free=row["memory_gib"] - memory,
                gpu_power_limit_watts=max(limits) if limits else None,
                placed_watts=placed,
                measured_watts=_measured(row, now),
                weights=frozenset(w for w in (row["weights"] or []) if isinstance(w, str)),
                replicas=replicas.get(row["id"], 0),
                gpu_topology=gpu_topology_view(row["topology"]),
            )
        )
    return views


def profile_of(model: Model) -> Profile:
    """A model row's profile as the planner takes it (its selector was checked when it was applied)."""
    return Profile(
        gpus=model.gpus,
        nodes=model.nodes,
        cpu_cores=model.cpu_cores,
        memory_gib=model.memory_gib,
        power_watts=model.power_watts,
        keep_within=model.keep_within or None,
        selector=parse_selector(model.node_selector) if model.node_selector.strip() else None,
        topology=model.topology or "any",
        # Measured by placement.throughput; none until its replicas report tokens/s and power.
        tokens_per_joule=tuple(
            ModelEfficiency.objects.filter(model_id=model.pk).order_by("gpu_model")
            .values_list("gpu_model", "tokens_per_joule")
        ) if model.pk else (),
    )


def existing_replicas(model: Model, *, exclude_replica: int | None = None) -> tuple[frozenset[str], ...]:
    """The node names of each of the model's replicas that hold shards, oldest first."""
    by_replica: dict[int, set[str]] = defaultdict(set)
    shards = Shard.objects.filter(replica__model=model).order_by("replica__ordinal", "replica_id")
    for replica_id, node_name in shards.values_list("replica_id", "node__name"):
        if replica_id != exclude_replica:
            by_replica[replica_id].add(node_name)
    return tuple(frozenset(names) for names in by_replica.values())


def replica_request(model: Model) -> ReplicaRequest:
    """The request for the model's next replica, with its existing replicas for spreading."""
    return ReplicaRequest(model=model.name, profile=profile_of(model), existing=existing_replicas(model))


@dataclass(slots=True)
class PendingReplica:
    """What placing a pending replica reads and keeps of its row (placement.commit takes it where it
    takes a Replica): a reconcile after a room's loss loads thousands, and a model instance each cost
    more than the rest of loading them."""

    pk: int
    reason: str
    explain: dict
    state: str = "pending"


def pending_replicas(model: Model) -> list[PendingReplica]:
    """The model's replicas still waiting for a node, oldest first."""
    rows = Replica.objects.filter(model=model, state="pending").order_by("ordinal")
    return [PendingReplica(pk, reason, explain) for pk, reason, explain in rows.values_list("id", "reason", "explain")]


def domain_of(text: str) -> Domain:
    """A stored domain text as a Domain."""
    return parse_domain(text)


def level_sorted(texts: Iterable[str]) -> list[str]:
    """Domain texts in the planner's order: level (site first, PDUs last), then name."""
    return [str(d) for d in ordered_domains(texts)]


def members_of(domains: Iterable[str]) -> set[str]:
    """The names of the nodes in any of the domains."""
    return set(Node.objects.filter(domains__domain__in=list(domains)).values_list("name", flat=True))
