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


def replica_tokens_per_second(*, node_names: list[str] | None = None) -> dict[int, float]:
    """Each replica's generated tokens per second as its agent last reported it (`sensors.replicas`).

    A replica with no figure is absent, never 0. A replica spread over nodes is served (and counted) by
    one of them: the largest figure any of its nodes reports is its own.
    """
    nodes = Node.objects.exclude(sensors__isnull=True)
    if node_names is not None:
        nodes = nodes.filter(name__in=node_names)
    figures: dict[int, float] = {}
    # Only `sensors.replicas`, picked out by the database: the whole documents (their GPUs' readings,
    # ~3 KB a node) would each be read and decoded after every conditions round.
    for items in nodes.values_list("sensors__replicas", flat=True):
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict) and item.get("tokens_per_second") is not None:
                figures[item["id"]] = max(figures.get(item["id"], 0.0), float(item["tokens_per_second"]))
    return figures
