"""Power history: a point per domain and per node every minute, kept 48 h, and every 15 minutes, kept 30 days;
a domain's points carry its inlet air too.

`history_record` runs once a minute (Celery beat, or the embedded server's thread): it writes the minute's
points, rolls each finished quarter hour up (use and reserved averaged, measured and inlet: the peak) and
prunes what is past its keep. Reads (`domain_history`, `node_history`: the console's charts and the API) pick the resolution.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Avg, Max
from django.utils import timezone

from agents import bookings
from agents.models import Node
from facility import power
from facility.models import DomainSample, NodeSample, Resolution
from facility.selectors import facility_overview, facility_settings

MINUTE_KEEP = timedelta(hours=48)
QUARTER_KEEP = timedelta(days=30)
QUARTER = timedelta(minutes=15)


def _floor(at: datetime, minutes: int) -> datetime:
    at = at.replace(second=0, microsecond=0)
    return at - timedelta(minutes=at.minute % minutes)


def _rollup(model, key: str, start: datetime) -> None:
    """The 15-minute points of the quarter starting at `start`, from its minute points (once)."""
    if model.objects.filter(resolution=Resolution.QUARTER, at=start).exists():
        return
    inlet = {"inlet": Max("inlet_celsius")} if model is DomainSample else {}
    rows = (
        model.objects.filter(resolution=Resolution.MINUTE, at__gte=start, at__lt=start + QUARTER)
        .values(key)
        .annotate(use=Avg("use_watts"), reserved=Avg("reserved_watts"), peak=Max("measured_peak_watts"), **inlet)
    )
    model.objects.bulk_create(
        [
            model(**{key: r[key]}, resolution=Resolution.QUARTER, at=start, use_watts=r["use"],
                  reserved_watts=r["reserved"], measured_peak_watts=r["peak"],
                  **({"inlet_celsius": r["inlet"]} if inlet else {}))
            for r in rows
        ],
        ignore_conflicts=True,
    )


@transaction.atomic
def history_record(*, now: datetime | None = None) -> dict[str, int]:
    """Write this minute's points (domains and nodes), roll up the last finished quarter, prune old points."""
    now = now or timezone.now()
    minute = _floor(now, 1)
    overview = facility_overview()
    domains = [
        DomainSample(
            domain=d["domain"], resolution=Resolution.MINUTE, at=minute, use_watts=d["use_watts"],
            reserved_watts=d["reserved_watts"], measured_peak_watts=d["measured_watts"],
            inlet_celsius=fresh_inlet(d["condition"]),
        )
        for d in overview["domains"]
    ]
    DomainSample.objects.bulk_create(domains, ignore_conflicts=True)
    settings = facility_settings()
    nodes = []
    placed = bookings.placed_watts()
    for node in Node.objects.only("id", "name", "measured_peak_watts", "sensors_at"):
        measured = node.fresh_measured_watts(now)
        reserved = placed.get(node.pk, 0.0)
        nodes.append(
            NodeSample(
                node_name=node.name, resolution=Resolution.MINUTE, at=minute,
                use_watts=power.node_use_watts(reserved, measured, settings),
                reserved_watts=reserved, measured_peak_watts=measured,
            )
        )
    NodeSample.objects.bulk_create(nodes, ignore_conflicts=True)
    last_quarter = _floor(now, 15) - QUARTER
    _rollup(DomainSample, "domain", last_quarter)
    _rollup(NodeSample, "node_name", last_quarter)
    pruned = 0
    for model in (DomainSample, NodeSample):
        pruned += model.objects.filter(resolution=Resolution.MINUTE, at__lt=now - MINUTE_KEEP).delete()[0]
        pruned += model.objects.filter(resolution=Resolution.QUARTER, at__lt=now - QUARTER_KEEP).delete()[0]
    return {"domains": len(domains), "nodes": len(nodes), "pruned": pruned}


def fresh_inlet(condition: dict[str, Any] | None) -> float | None:
    """A domain's inlet reading while its condition is judged on fresh readings (unknown: none is fresh)."""
    inlet = (condition or {}).get("inlet")
    if not inlet or (condition or {}).get("condition") == "unknown":
        return None
    return inlet["celsius"]


def _points(rows, inlet: bool) -> list[dict[str, Any]]:
    return [
        {"at": row[0], "use_watts": row[1], "reserved_watts": row[2], "measured_peak_watts": row[3],
         **({"inlet_celsius": row[4]} if inlet else {})}
        for row in rows
    ]


def _series(model, key: str, value: str, hours: float, now: datetime | None) -> dict[str, Any]:
    now = now or timezone.now()
    resolution = Resolution.MINUTE if hours <= MINUTE_KEEP.total_seconds() / 3600 else Resolution.QUARTER
    inlet = model is DomainSample
    fields = ["at", "use_watts", "reserved_watts", "measured_peak_watts"] + (["inlet_celsius"] if inlet else [])
    rows = (
        model.objects.filter(**{key: value}, resolution=resolution, at__gte=now - timedelta(hours=hours))
        .order_by("at")
        .values_list(*fields)
    )
    return {"resolution_minutes": int(resolution), "points": _points(rows, inlet)}


def domain_history(*, domain: str, hours: float = 48, now: datetime | None = None) -> dict[str, Any]:
    """A domain's points over the last `hours`: 1-minute points up to 48 h, 15-minute points beyond."""
    return {"domain": domain, "hours": hours, **_series(DomainSample, "domain", domain, hours, now)}


def node_history(*, node_name: str, hours: float = 48, now: datetime | None = None) -> dict[str, Any]:
    """A node's points over the last `hours` (as domain_history)."""
    return {"node": node_name, "hours": hours, **_series(NodeSample, "node_name", node_name, hours, now)}
