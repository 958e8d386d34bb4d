"""Nodes as the facility sees them: the rows the CLI, the API and the console list, with state
(ready, not-ready, cordoned, held), the hold that applies and location.

Here, not in agents: holds are the facility's, and the node layer never reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from agents import bookings
from agents.models import Node
from agents.selectors import node_queryset
from agents.services import implausible_lines
from facility.conditions import UNKNOWN, worst
from facility.domains import LABEL_PREFIX, LEVELS, location_text
from facility.evaluation import effective_conditions
from facility.models import Hold


@dataclass
class NodeRow:
    """One node as people see it in a list."""

    node: Node
    state: str
    gpus_free: int
    gpus_total: int
    domains: list[str]
    hold: Hold | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The worst of its domains' thermal conditions (ok, warm, hot; unknown when none is known).
    condition: str = "unknown"

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def location(self) -> dict[str, str]:
        return {level: self.node.labels[LABEL_PREFIX + level] for level in LEVELS if self.node.labels.get(LABEL_PREFIX + level)}

    @property
    def location_text(self) -> str:
        return location_text(self.node.labels)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.node.name,
            "state": self.state,
            "ready": self.state != "not-ready" and self.node.last_heartbeat_at is not None,
            "cordoned": self.node.cordoned,
            "held": {"domain": self.hold.domain, "reason": self.hold.reason} if self.hold else None,
            "gpus": {"free": self.gpus_free, "total": self.gpus_total},
            "location": self.location,
            "domains": self.domains,
            "fabric": self.node.fabric or None,
            "condition": self.condition,
            "last_heartbeat_at": self.node.last_heartbeat_at.isoformat() if self.node.last_heartbeat_at else None,
            "warnings": self.warnings,
        }

    @property
    def warnings(self) -> list[str]:
        """What of its agent's word was not taken: location labels of levels that are the store's and
        differ from it, readings it cannot have read (its last heartbeat's), and a change of its GPUs that
        waits for an operator."""
        sensors = self.node.sensors if isinstance(self.node.sensors, dict) else {}
        pending = self.node.pending_inventory
        waiting = [] if pending is None else [
            f"its agent reports {len(pending)} GPUs where {self.gpus_total} are known; the change waits for an "
            f"operator (llmgw ctl nodes accept-inventory {self.node.name})"
        ]
        return [*(self.node.location_conflicts or []), *implausible_lines(sensors), *waiting]


def held_domains() -> dict[str, Hold]:
    """Every hold by its domain's text."""
    return {h.domain: h for h in Hold.objects.all()}


def node_state(node: Node, domains: list[str], holds: dict[str, Hold], now) -> tuple[str, Hold | None]:
    """ready, not-ready, cordoned or held — the first that applies, in that order of urgency reversed."""
    hold = next((holds[d] for d in domains if d in holds), None)
    if not node.is_ready(now):
        return "not-ready", hold
    if node.cordoned:
        return "cordoned", hold
    if hold is not None:
        return "held", hold
    return "ready", None


def node_rows(queryset: QuerySet[Node] | None = None, *, domain: str | None = None) -> list[NodeRow]:
    """Nodes with their state, free GPUs and domains; `domain` keeps those in it (`rack:r12-07`)."""
    qs = queryset if queryset is not None else node_queryset()
    if domain:
        qs = qs.filter(domains__domain=domain)
    holds = held_domains()
    now = timezone.now()
    known = {domain: state["condition"] for domain, state in effective_conditions(now=now).items()}
    rows = []
    nodes = list(qs)
    booked = bookings.booked_gpus([node.pk for node in nodes])
    for node in nodes:
        domains = [d.domain for d in node.domains.all()]
        state, hold = node_state(node, domains, holds, now)
        condition = worst([known[d] for d in domains if d in known] or [UNKNOWN])
        free = node.gpus_total - booked.get(node.pk, 0)
        rows.append(NodeRow(node, state, free, node.gpus_total, domains, hold, condition=condition))
    return rows


def node_condition(domains: list[str], *, now=None) -> dict[str, Any]:
    """A node's thermal condition as its page shows it: the worst of its domains', which domain gives it,
    the reading in words and its age (``condition`` unknown, domain None when no domain has one)."""
    states = effective_conditions(now=now or timezone.now())
    known = [(d, states[d]) for d in domains if d in states]
    condition = worst([s["condition"] for _, s in known])
    domain, state = next(((d, s) for d, s in known if s["condition"] == condition), (None, None))
    return {
        "condition": condition,
        "domain": domain,
        "detail": (state or {}).get("detail") or ("no fresh reading" if condition == UNKNOWN else ""),
        "age_seconds": None if state is None or state.get("age_seconds") is None else round(state["age_seconds"]),
        "enforce": bool(state and state.get("enforce")),
        # The domain's latest inlet reading (time, source, thresholds): the page names whose figure it is.
        "inlet": (state or {}).get("inlet"),
    }
