"""Reads of nodes alone: the list query and where each label comes from. Node rows with their holds
are the facility's (:mod:`facility.nodes`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import Count, Prefetch, Q, QuerySet

from agents.models import Node, NodeDomain, StoreLabel


def node_queryset() -> QuerySet[Node]:
    return Node.objects.annotate(
        gpus_total=Count("gpus", filter=Q(gpus__present=True), distinct=True),
    ).prefetch_related(Prefetch("domains", queryset=NodeDomain.objects.order_by("domain")))


def node_label_sources(
    node_name: str, agent_labels: dict[str, str], labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Each label with where it comes from: `store` (wins) or `agent`, and `agent_value`; given the node's
    effective ``labels``, an agent's label they leave out is `ignored` (its level is the store's:
    facility.location_from)."""
    store = dict(StoreLabel.objects.filter(node_name=node_name).values_list("key", "value"))
    out = []
    for key in sorted(set(agent_labels) | set(store)):
        if key in store:
            out.append({"key": key, "value": store[key], "source": "store", "agent_value": agent_labels.get(key)})
        else:
            source = "ignored" if labels is not None and key not in labels else "agent"
            out.append({"key": key, "value": agent_labels[key], "source": source, "agent_value": agent_labels[key]})
    return out


def replica_tokens_per_second(*, node_names: list[str] | None = None) -> dict[int, dict[int, float]]:
    """Each replica's generated tokens per second as agents last reported it (`sensors.replicas`), by the
    reporting node's id: ``{replica id: {node id: figure}}``.

    A replica with no figure is absent, never 0. A node may name any replica id in its heartbeat: which
    nodes a replica runs on is placement's to say, and its figure is read from those nodes alone
    (placement.throughput).
    """
    nodes = Node.objects.exclude(sensors__isnull=True)
    if node_names is not None:
        nodes = nodes.filter(name__in=node_names)
    figures: dict[int, dict[int, float]] = {}
    # Only `sensors.replicas`, picked out by the database: the whole documents (their GPUs' readings,
    # ~3 KB a node) would each be read and decoded after every conditions round.
    for node_id, items in nodes.values_list("id", "sensors__replicas"):
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict) and item.get("tokens_per_second") is not None:
                figures.setdefault(item["id"], {})[node_id] = float(item["tokens_per_second"])
    return figures
