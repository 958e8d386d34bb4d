"""Reads of feeds: each feed with what it supplies and carries, and what the loss of one would do (N−1)."""

from __future__ import annotations

import math
from typing import Any

from django.utils import timezone

from agents import bookings
from agents.models import Node
from agents.node.protocol import value_shown
from facility import feeds as pure
from facility import power
from facility.domains import LABEL_PREFIX, LEG_KEY, PDU_KEY, Domain, parse_domain
from facility.feed_services import rack_pdus, stored_feeds, unfed_pdus
from facility.models import Budget
from facility.selectors import domain_uses, facility_settings
from llmgw.errors import NotFound


def _names(labels: dict, key: str) -> tuple[str, ...]:
    return tuple(sorted({p.strip() for p in (labels.get(key) or "").split(",") if p.strip()}))


def node_loads(now=None) -> list[pure.NodeLoad]:
    """Every node's load for feed accounting: its use as every domain counts it (node_watts and the
    larger of placed and its fresh measured peak: :func:`facility.power.node_use_watts`), with reserved
    (node_watts + placed) and measured (node_watts + peak, 0 without a fresh reading) shown beside it.
    """
    now = now or timezone.now()
    settings = facility_settings()
    node_watts = settings.node_watts or 0.0
    loads = []
    placed = bookings.placed_watts()
    for node in Node.objects.only("id", "name", "labels", "measured_peak_watts", "sensors_at").order_by("name"):
        labels = node.labels or {}
        measured = node.fresh_measured_watts(now)
        on_node = placed.get(node.pk, 0.0)
        loads.append(
            pure.NodeLoad(
                name=node.name,
                rack=labels.get(LABEL_PREFIX + "rack") or None,
                pdus=_names(labels, PDU_KEY),
                use_watts=power.node_use_watts(on_node, measured, settings),
                reserved_watts=node_watts + on_node,
                measured_watts=0.0 if measured is None else node_watts + measured,
                legs=_names(labels, LEG_KEY),
            )
        )
    return loads


def equipment_loads() -> list[pure.NodeLoad]:
    """Each budgeted rack's other watts (switches, storage: what no node reports) as a load on the rack's
    PDUs, split over them as a dual-fed node's is: its feeds carry it, and the survivor all of it."""
    pdus = rack_pdus()
    loads = []
    for domain, other in Budget.objects.filter(domain__startswith="rack:", other_watts__gt=0).values_list(
        "domain", "other_watts"
    ):
        rack = parse_domain(domain).name
        loads.append(
            pure.NodeLoad(
                name=f"rack {rack}'s other equipment", rack=rack, pdus=tuple(sorted(pdus.get(rack, ()))),
                use_watts=other, reserved_watts=other, measured_watts=other, equipment=True,
            )
        )
    return loads


def feed_row(feed: pure.Feed, racks: list[str], load: tuple[float, float, float]) -> dict[str, Any]:
    return {
        "name": feed.name,
        "voltage": feed.voltage,
        "amperage": feed.amperage,
        "phase": feed.phase,
        "supply": feed.supply,
        "status": feed.status,
        "max_utilization": feed.max_utilization,
        "capacity_watts": round(feed.capacity_watts, 1),
        "text": feed.text,
        "pdus": list(feed.pdus),
        "racks": racks,
        "load_watts": round(load[0], 1),
        "reserved_watts": round(load[1], 1),
        "measured_watts": round(load[2], 1),
        "legs": [],
    }


def leg_rows(feeds: list[pure.Feed]) -> dict[str, list[dict[str, Any]]]:
    """Each three-phase PDU's three legs, by PDU, where a node's leg is known: use and limit as every
    domain's (invariant 8); a leg no node draws from is there at 0 W, as it is on the PDU."""
    by_pdu = pure.feed_of_pdu(feeds)
    uses = domain_uses(level="leg")
    margin = facility_settings().margin
    known: dict[str, set[str]] = {}
    for name in uses:
        parsed = pure.leg_pdu(name)
        if parsed is not None and parsed[0] in by_pdu and by_pdu[parsed[0]].phase == "three":
            known.setdefault(parsed[0], set()).add(parsed[1])
    out: dict[str, list[dict[str, Any]]] = {}
    for pdu in sorted(known):
        feed = by_pdu[pdu]
        for leg in pure.LEGS:
            name = pure.leg_name(pdu, leg)
            figure = uses.get(name)
            cap = figure.cap_watts if figure is not None and figure.cap_watts is not None else (
                feed.leg_capacity_watts if feed.is_live else 0.0)
            out.setdefault(pdu, []).append({
                "leg": leg,
                "domain": f"leg:{name}",
                "use_watts": round(figure.use_watts, 1) if figure is not None else 0.0,
                "cap_watts": round(cap, 1),
                "limit_watts": round(cap * (1 - margin), 1),
            })
    return out


def feeds_overview() -> dict[str, Any]:
    """Every feed: its figures, status, the PDUs and racks it supplies, its load now, and its PDUs' legs."""
    feeds = stored_feeds()
    loads = pure.feed_loads(feeds, node_loads() + equipment_loads(), pdu_other_watts=_pdu_budgets()[1])
    racks_by_pdu: dict[str, set[str]] = {}
    for rack, pdus in rack_pdus().items():
        for pdu in pdus:
            racks_by_pdu.setdefault(pdu, set()).add(rack)
    legs = leg_rows(feeds)
    rows = []
    for feed in feeds:
        racks = set(feed.racks)
        for pdu in feed.pdus:
            racks |= racks_by_pdu.get(pdu, set())
        row = feed_row(feed, sorted(racks), loads.get(feed.name, (0.0, 0.0, 0.0)))
        for pdu in feed.pdus:
            if pdu in legs:
                imbalance = pure.leg_imbalance(
                    [leg["use_watts"] for leg in legs[pdu]], sum(leg["cap_watts"] for leg in legs[pdu]))
                row["legs"].append({
                    "pdu": pdu,
                    "legs": legs[pdu],
                    "imbalance": None if imbalance is None else round(imbalance, 3),
                })
        rows.append(row)
    return {"feeds": rows, "unfed_pdus": unfed_rows(feeds)}


def unfed_rows(feeds: list[pure.Feed]) -> list[dict[str, Any]]:
    """Each PDU the DCIM says no feed reaches, with its racks and nodes: they run on their other PDUs alone."""
    fed = set(pure.feed_of_pdu(feeds))
    unfed = [p for p in unfed_pdus() if p not in fed]
    if not unfed:
        return []
    nodes: dict[str, list[str]] = {p: [] for p in unfed}
    racks: dict[str, set[str]] = {p: set() for p in unfed}
    for load in node_loads():
        for pdu in load.pdus:
            if pdu in nodes:
                nodes[pdu].append(load.name)
                if load.rack:
                    racks[pdu].add(load.rack)
    return [
        {"pdu": p, "racks": sorted(racks[p]), "nodes": nodes[p],
         "text": f"PDU {p}: no live feed reaches its input; "
                 + (f"{len(nodes[p])} node(s) on it run on their other PDU alone" if nodes[p] else "no node is on it")}
        for p in unfed
    ]


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


def _pdu_budgets() -> tuple[dict[str, float], dict[str, float]]:
    """Each budgeted PDU's effective cap and its other watts, by the PDU's name."""
    caps: dict[str, float] = {}
    other: dict[str, float] = {}
    for budget in Budget.objects.filter(domain__startswith="pdu:"):
        name = parse_domain(budget.domain).name
        caps[name] = budget.effective_cap_watts
        other[name] = budget.other_watts
    return caps, other


def feed_loss_report(*, feed: str | None = None) -> dict[str, Any]:
    """For the loss of each live feed (or the one named): every PDU, leg, rack and feed past what
    carries it. A failed feed is lost already: its violations are the present (``failed``: true)."""
    feeds = stored_feeds()
    if feed is not None and feed not in {f.name for f in feeds}:
        names = sorted(f.name for f in feeds)
        known = f"; the feeds: {', '.join(names[:20])}{', …' if len(names) > 20 else ''}" if names else "; no feed is known"
        raise NotFound(f"feed {value_shown(feed)} is not known{known}", field="feed")
    loads = node_loads() + equipment_loads()
    pdu_caps, pdu_other = _pdu_budgets()
    unfed = unfed_pdus()
    out = []
    for lost in feeds:
        if feed is not None and lost.name != feed:
            continue
        if feed is None and lost.status in ("planned", "offline"):
            continue  # carries nothing: its loss changes nothing
        found, carried = pure.feed_loss_carried(
            lost, feeds, loads, pdu_caps=pdu_caps, pdu_other_watts=pdu_other, unfed=unfed)
        capacity = {f.name: f.capacity_watts for f in feeds}
        out.append({
            "feed": lost.name,
            "status": lost.status,
            "failed": lost.status == "failed",
            "violations": [violation_row(v) for v in found],
            # What the feeds left would carry, the fullest first: N−1's headroom, violated or not.
            "carried": sorted(
                (
                    {"feed": name, "load_watts": round(load, 1), "capacity_watts": round(capacity[name], 1)}
                    for name, load in carried.items()
                ),
                key=lambda c: (-(c["load_watts"] / c["capacity_watts"]) if c["capacity_watts"] else -math.inf, c["feed"]),
            ),
        })
    total = sum(len(f["violations"]) for f in out)
    failed = [f["feed"] for f in out if f["failed"]]
    text = f"{total} violation{'s' if total != 1 else ''}"
    if failed:
        text += f"; feed{'s' if len(failed) > 1 else ''} {', '.join(failed)} failed: running on N−1 now"
    return {"feeds": out, "violations": total, "text": text}


def racks_over(report: dict[str, Any]) -> set[Domain]:
    """The racks a feed-loss report names."""
    return {
        parse_domain(v["domain"])
        for f in report["feeds"]
        for v in f["violations"]
        if v["domain"] and v["domain"].startswith("rack:")
    }
