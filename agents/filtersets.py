"""Filters of the nodes list: one FilterSet for the console's Nodes page (and the API, should it want it)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import django_filters
from django import forms
from django.db.models import QuerySet
from django.utils import timezone

from agents.models import Node, NodeDomain
from facility.domains import DomainError, parse_domain
from facility.nodes import held_domains, node_state

STATES = ("ready", "not-ready", "cordoned", "held")


class DomainField(forms.CharField):
    """A `level:name` domain, kept in its canonical text; a bad one is refused with the parser's words."""

    def clean(self, value):
        value = super().clean(value)
        if not value:
            return value
        try:
            return str(parse_domain(value.strip()))
        except DomainError as exc:
            raise forms.ValidationError(str(exc)) from exc


class DomainFilter(django_filters.CharFilter):
    field_class = DomainField

    def filter(self, qs, value):
        if not value:
            return qs
        # One NodeDomain row per node and domain, so the join never repeats a node.
        return qs.filter(domains__domain=value)


@dataclass(frozen=True, slots=True)
class NodeStateLine:
    """What the list needs to count, filter and sort by state without loading whole nodes."""

    pk: int
    name: str
    state: str


def node_state_lines(queryset: QuerySet[Node], now: datetime | None = None) -> list[NodeStateLine]:
    """Each node of the queryset with its state (the selectors' rule), in two queries whatever the count."""
    now = now or timezone.now()
    holds = held_domains()
    held_by_node: dict[int, list[str]] = defaultdict(list)
    if holds:
        for node_id, domain in NodeDomain.objects.filter(domain__in=holds, node__in=queryset.values("pk")).values_list(
            "node_id", "domain"
        ):
            held_by_node[node_id].append(domain)
    nodes = queryset.prefetch_related(None).only(
        "pk", "name", "last_heartbeat_at", "heartbeat_interval_seconds", "cordoned"
    )
    return [
        NodeStateLine(node.pk, node.name, node_state(node, sorted(held_by_node[node.pk]), holds, now)[0])
        for node in nodes
    ]


class NodeFilterSet(django_filters.FilterSet):
    """`domain=rack:r12-07` (any level), `state=held`, `q=gpu01` (part of the name)."""

    domain = DomainFilter(label="Domain")
    state = django_filters.ChoiceFilter(
        label="State", choices=[(s, s) for s in STATES], method="filter_state", empty_label="any state"
    )
    q = django_filters.CharFilter(label="Name", field_name="name", lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["domain", "state", "q"]

    def filter_state(self, queryset: QuerySet[Node], name: str, value: str) -> QuerySet[Node]:
        # State depends on the clock and on holds, so it is worked out in Python, then kept as a pk filter.
        if not value:
            return queryset
        keep = [line.pk for line in node_state_lines(queryset) if line.state == value]
        return queryset.filter(pk__in=keep)
