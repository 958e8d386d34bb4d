"""Reads of nodes alone: the list query and where each label comes from. Node rows with their holds
are the facility's (:mod:`facility.nodes`)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, Q, QuerySet

from agents.models import Node, NodeDomain, StoreLabel


def node_queryset() -> QuerySet[Node]:
    return Node.objects.annotate(
        gpus_total=Count("gpus", filter=Q(gpus__present=True), distinct=True),
    ).prefetch_related(Prefetch("domains", queryset=NodeDomain.objects.order_by("domain")))


def node_label_sources(node_name: str, agent_labels: dict[str, str]) -> list[dict[str, Any]]:
    """Each effective label with where it comes from: `store` (wins) or `agent`; `overrides` the agent's value."""
    store = dict(StoreLabel.objects.filter(node_name=node_name).values_list("key", "value"))
    out = []
    for key in sorted(set(agent_labels) | set(store)):
        if key in store:
            out.append({"key": key, "value": store[key], "source": "store", "agent_value": agent_labels.get(key)})
        else:
            out.append({"key": key, "value": agent_labels[key], "source": "agent", "agent_value": agent_labels[key]})
    return out
