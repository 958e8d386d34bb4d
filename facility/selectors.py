"""Reads of the facility: every domain with its nodes, power figures and hold."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.utils import timezone

from agents import bookings
from agents.models import Node, NodeDomain, measured_window_seconds
from facility import power
from facility.conditions import SEVERITY
from facility.domains import LEVELS, ROLLED_LEVELS, Domain, natural_key, parse_domain
from facility.evaluation import condition_stale_after, effective_conditions
from facility.feed_services import feed_cap_warning
from facility.models import Budget, ConditionEvent, FacilitySettings, Hold, SourceStatus


def facility_settings() -> power.FacilitySettings:
    row = FacilitySettings.load()
    return power.FacilitySettings(
        margin=row.margin, gpu_watts=row.gpu_watts, cpu_core_watts=row.cpu_core_watts, node_watts=row.node_watts
    )


def budgets(rows: list[Budget] | None = None) -> dict[Domain, power.Budget]:
    """Every budget (of ``rows`` when read already) as the pure kernel takes it."""
    return {
        parse_domain(b.domain): power.Budget(parse_domain(b.domain), b.effective_cap_watts, b.other_watts)
        for b in (Budget.objects.all() if rows is None else rows)
    }


def _roll_up(rows: list[dict[str, Any]]) -> None:
    """Each row's, room's and site's ``rolled_up``: its worst rack's condition where that is worse than its
    own (a row with a hot rack is not ok), ``{"condition", "from": "rack r1-01"}``; else None. The first
    rack in name order of the worst condition gives it."""
    rack_of = {node: row["name"] for row in rows if row["level"] == "rack" for node in row["nodes"]}
    racks = {row["name"]: row for row in rows if row["level"] == "rack"}
    for row in rows:
        row["rolled_up"] = None
        if row["level"] not in ROLLED_LEVELS:
            continue
        worst = row["condition"]["condition"]
        for name in sorted({rack_of[n] for n in row["nodes"] if n in rack_of}, key=natural_key):
            condition = racks[name]["condition"]["condition"]
            if SEVERITY[condition] > SEVERITY[worst]:
                worst = condition
                row["rolled_up"] = {"condition": condition, "from": f"rack {name}"}


def facility_overview() -> dict[str, Any]:
    """Every domain that has nodes, a budget, a hold or a condition: nodes, use, limit, reserved and
    measured draw, condition, hold. A condition only the agents' readings made — of a domain its last node
    left (a label typo reverted) — lists it while it is known; once it goes unknown, no longer. A domain a
    source of the site reads (Prometheus, static, simulated) stays listed, unknown included: that is its
    alarm.

    A hold's drain progress is placement's: :func:`placement.selectors.facility_overview` adds it.
    """
    settings = facility_settings()
    budget_rows = list(Budget.objects.all())
    budget_by_domain = budgets(budget_rows)
    # Where each cap came from: a feed (`feed A1 415 V 32 A 3φ 80 %`) or a written `budget`.
    cap_sources = {b.domain: b.source_text for b in budget_rows}
    cap_warnings = {b.domain: w for b in budget_rows if (w := feed_cap_warning(b))}
    holds = {h.domain: h for h in Hold.objects.all()}
    now = timezone.now()
    figures: dict[int, power.NodePower] = {}
    names: dict[int, str] = {}
    placed = bookings.placed_watts()
    # One read of the nodes gives both their figures and their names; a node that joins after it (its
    # domain rows read below) is counted from the next overview on, never looked up and missed (KeyError).
    for node in Node.objects.only("id", "name", "measured_peak_watts", "sensors_at"):
        figures[node.pk] = power.NodePower(placed.get(node.pk, 0.0), node.fresh_measured_watts(now))
        names[node.pk] = node.name
    members: dict[str, list[int]] = defaultdict(list)
    for node_id, domain in NodeDomain.objects.values_list("node_id", "domain"):
        if node_id in figures:
            members[domain].append(node_id)
    conditions = effective_conditions(now=now)
    known = {
        text for text, state in conditions.items()
        if state["condition"] != "unknown" or state["overridden"] or set(state.get("sources", ())) - {"agents"}
    }
    all_domains = set(members) | {str(d) for d in budget_by_domain} | set(holds) | known
    order = {level: i for i, level in enumerate(LEVELS)}
    rows = []
    for text in sorted(all_domains, key=lambda t: (order.get(t.split(":")[0], 99), t)):
        domain = parse_domain(text)
        ids = members.get(text, [])
        figure = power.domain_power(domain, [figures[i] for i in ids], budget_by_domain.get(domain), settings)
        hold = holds.get(text)
        rows.append(
            {
                "domain": text,
                "level": domain.level,
                "name": domain.name,
                "nodes": sorted(names[i] for i in ids),
                "use_watts": round(figure.use_watts, 1),
                "reserved_watts": round(figure.reserved_watts, 1),
                "measured_watts": None if figure.measured_watts is None else round(figure.measured_watts, 1),
                "cap_watts": figure.cap_watts,
                "cap_source": cap_sources.get(text),
                "cap_warning": cap_warnings.get(text),
                "limit_watts": None if figure.limit_watts is None else round(figure.limit_watts, 1),
                "other_watts": budget_by_domain[domain].other_watts if domain in budget_by_domain else None,
                "over_limit": figure.is_over_limit,
                "condition": condition_dict(conditions.get(text), now=now),
                "hold": (
                    {
                        "reason": hold.reason,
                        "drain": hold.drain,
                        "created_by": hold.created_by,
                        "created_at": hold.created_at.isoformat(),
                    }
                    if hold
                    else None
                ),
            }
        )
    _roll_up(rows)
    return {
        "settings": {
            "margin": settings.margin,
            "gpu_watts": settings.gpu_watts,
            "cpu_core_watts": settings.cpu_core_watts,
            "node_watts": settings.node_watts,
            "measured_window_seconds": measured_window_seconds(),
        },
        "domains": rows,
        "sources": source_statuses(),
    }


def domain_uses(*, level: str) -> dict[str, power.DomainPower]:
    """Every domain of one level that has nodes or a budget, by name: its figures as the overview's."""
    settings = facility_settings()
    now = timezone.now()
    members: dict[str, list[int]] = defaultdict(list)
    for node_id, domain in NodeDomain.objects.filter(level=level).values_list("node_id", "domain"):
        members[domain].append(node_id)
    budget_by_domain = budgets(list(Budget.objects.filter(domain__startswith=f"{level}:")))
    ids = {i for group in members.values() for i in group}
    placed = bookings.placed_watts(sorted(ids))
    figures = {
        n.pk: power.NodePower(placed.get(n.pk, 0.0), n.fresh_measured_watts(now))
        for n in Node.objects.filter(pk__in=ids).only("id", "measured_peak_watts", "sensors_at")
    }
    out = {}
    for text in sorted(set(members) | {str(d) for d in budget_by_domain}):
        domain = parse_domain(text)
        out[domain.name] = power.domain_power(
            # A node gone between the two reads is left out, as it is from the next overview.
            domain, [figures[i] for i in members.get(text, []) if i in figures], budget_by_domain.get(domain), settings
        )
    return out


def domain_figures(*, domain: str) -> power.DomainPower:
    """One domain's power figures now (use, limit, reserved, measured), as the overview computes them."""
    settings = facility_settings()
    parsed = parse_domain(domain)
    now = timezone.now()
    nodes = list(Node.objects.filter(domains__domain=domain).only("id", "measured_peak_watts", "sensors_at"))
    placed = bookings.placed_watts([n.pk for n in nodes])
    members = [power.NodePower(placed.get(n.pk, 0.0), n.fresh_measured_watts(now)) for n in nodes]
    return power.domain_power(parsed, members, budgets().get(parsed), settings)


def condition_dict(state: dict[str, Any] | None, *, now: datetime | None = None) -> dict[str, Any]:
    """A domain's condition as shown: condition, mode, the reading in words, readings and their age, when it
    was last judged (``judged_at``, epoch seconds) and whether that is longer ago than
    evaluation.condition_stale_after() (``stale``: the evaluation has stopped; set by hand is never stale)."""
    if state is None:
        return {"condition": "unknown", "mode": None, "detail": "no reading", "overridden": False,
                "readings": {}, "age_seconds": None, "inlet": None, "judged_at": None, "stale": False}
    judged = state.get("evaluated_at")
    epoch = (now or timezone.now()).timestamp()
    return {
        "judged_at": judged,
        "stale": not state["overridden"] and judged is not None and epoch - judged > condition_stale_after(),
        "condition": state["condition"],
        "mode": "enforce" if state["enforce"] else "observe",
        "detail": state["detail"] or ("no fresh reading" if state["condition"] == "unknown" else ""),
        "overridden": state["overridden"],
        "readings": state["readings"],
        "age_seconds": None if state["age_seconds"] is None else round(state["age_seconds"], 1),
        "inlet": state.get("inlet"),
    }


MAX_EVENTS = 1000


def condition_events(*, domain: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """The timeline of condition changes, newest first (kept 30 days)."""
    rows = ConditionEvent.objects.all()
    if domain:
        rows = rows.filter(domain=domain)
    return [
        {
            "domain": e.domain,
            "from": e.before,
            "to": e.after,
            "reason": e.reason,
            "readings": e.readings,
            "at": e.at.isoformat(),
        }
        for e in rows[: max(1, min(limit, MAX_EVENTS))]
    ]


def source_statuses() -> list[dict[str, Any]]:
    """Each facility source's last poll: up or down, the last error, the last success."""
    return [
        {
            "name": s.name,
            "up": s.up,
            "last_error": s.last_error,
            "last_success_at": s.last_success_at.isoformat() if s.last_success_at else None,
            "last_poll_at": s.last_poll_at.isoformat() if s.last_poll_at else None,
        }
        for s in SourceStatus.objects.all()
    ]
