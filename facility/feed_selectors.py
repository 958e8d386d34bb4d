"""Reads of feeds: each feed with what it supplies and carries, and what the loss of one would do (N−1)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from agents import bookings
from agents.models import Node
from facility import feeds as pure
from facility.domains import LABEL_PREFIX, PDU_KEY, Domain, parse_domain
from facility.feed_services import rack_pdus, stored_feeds
from facility.models import Budget
from facility.selectors import facility_settings
from llmgw.errors import NotFound


def node_loads(now=None) -> list[pure.NodeLoad]:
    """Every node's load for feed accounting: reserved (node_watts + placed) and its measured peak.

    A node's measured figure counts its node_watts too, as its use does; without a fresh reading it is 0.
    """
    now = now or timezone.now()
    node_watts = facility_settings().node_watts or 0.0
    loads = []
    placed = bookings.placed_watts()
    for node in Node.objects.only("id", "name", "labels", "measured_peak_watts", "sensors_at").order_by("name"):
        labels = node.labels or {}
        pdus = tuple(sorted({p.strip() for p in (labels.get(PDU_KEY) or "").split(",") if p.strip()}))
        measured = node.fresh_measured_watts(now)
        loads.append(
            pure.NodeLoad(
                name=node.name,
                rack=labels.get(LABEL_PREFIX + "rack") or None,
                pdus=pdus,
                reserved_watts=node_watts + placed.get(node.pk, 0.0),
                measured_watts=0.0 if measured is None else node_watts + measured,
            )
        )
    return loads


def feed_row(feed: pure.Feed, racks: list[str], load: tuple[float, float]) -> dict[str, Any]:
    return {
        "name": feed.name,
        "voltage": feed.voltage,
        "amperage": feed.amperage,
        "phase": feed.phase,
        "max_utilization": feed.max_utilization,
        "capacity_watts": round(feed.capacity_watts, 1),
        "text": feed.text,
        "pdus": list(feed.pdus),
        "racks": racks,
        "reserved_watts": round(load[0], 1),
        "measured_watts": round(load[1], 1),
    }


def feeds_overview() -> dict[str, Any]:
    """Every feed: its figures, the PDUs and racks it supplies, its capacity and its load now."""
    feeds = stored_feeds()
    loads = pure.feed_loads(feeds, node_loads())
    racks_by_pdu: dict[str, set[str]] = {}
    for rack, pdus in rack_pdus().items():
        for pdu in pdus:
            racks_by_pdu.setdefault(pdu, set()).add(rack)
    rows = []
    for feed in feeds:
        racks = set(feed.racks)
        for pdu in feed.pdus:
            racks |= racks_by_pdu.get(pdu, set())
        rows.append(feed_row(feed, sorted(racks), loads.get(feed.name, (0.0, 0.0))))
    return {"feeds": rows}


def violation_row(v: pure.Violation) -> dict[str, Any]:
    return {
        "feed_lost": v.feed_lost,
        "domain": str(v.domain) if v.domain else None,
        "carrier": v.carrier,
        "reserved_watts": round(v.reserved_watts, 1),
        "measured_watts": round(v.measured_watts, 1),
        "load_watts": round(v.load_watts, 1),
        "capacity_watts": round(v.capacity_watts, 1),
        "over_watts": round(v.over_watts, 1) if not v.dark_nodes else None,
        "dark_nodes": list(v.dark_nodes),
        "text": v.text,
    }


def feed_loss_report(*, feed: str | None = None) -> dict[str, Any]:
    """For the loss of each feed (or the one named): every PDU, rack and feed past what carries it."""
    feeds = stored_feeds()
    if feed is not None and feed not in {f.name for f in feeds}:
        raise NotFound(f"feed {feed!r} is not known", field="feed")
    loads = node_loads()
    pdu_caps: dict[str, float] = {}
    pdu_other: dict[str, float] = {}
    for domain, cap, other in Budget.objects.filter(domain__startswith="pdu:").values_list(
        "domain", "cap_watts", "other_watts"
    ):
        name = parse_domain(domain).name
        pdu_caps[name] = cap
        pdu_other[name] = other
    out = []
    for lost in feeds:
        if feed is not None and lost.name != feed:
            continue
        found = pure.feed_loss(lost, feeds, loads, pdu_caps=pdu_caps, pdu_other_watts=pdu_other)
        out.append({"feed": lost.name, "violations": [violation_row(v) for v in found]})
    total = sum(len(f["violations"]) for f in out)
    return {"feeds": out, "violations": total, "text": f"{total} violation{'s' if total != 1 else ''}"}


def racks_over(report: dict[str, Any]) -> set[Domain]:
    """The racks a feed-loss report names."""
    return {
        parse_domain(v["domain"])
        for f in report["feeds"]
        for v in f["violations"]
        if v["domain"] and v["domain"].startswith("rack:")
    }
