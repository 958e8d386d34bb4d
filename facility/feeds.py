"""Power feeds: what a feed can carry, the caps it implies, and what happens when one is lost (N−1).

Pure: no Django, no clock. A feed is a circuit from a panel (voltage, amperage, phase) held to a
share of its rating (``max_utilization``, 80 % by the continuous-load rule); it feeds one or more
PDUs. A node plugged into two PDUs on two feeds is dual-fed: either feed must carry it alone.

The rules:

- A feed's capacity is V × A × max_utilization, × √3 for three-phase (line-to-line voltage): what
  NetBox calls a PowerFeed's available power.
- A PDU's cap defaults to its feed's capacity. A rack's cap defaults to the **smallest** capacity of
  the feeds that reach it (each must carry the rack alone) — never their sum. An explicit budget wins.
- A feed may name racks it supplies directly (NetBox's PowerFeed.rack): they count among the rack's
  feeds, and a node none of whose PDUs is on a feed is carried by its rack's feeds.
- When a feed is lost, each node it fed is carried by its other PDUs, its load split evenly over
  them; a node with no PDU left goes dark. A surviving PDU or feed, or a rack's share on a surviving
  feed, past its capacity is a violation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from facility.domains import Domain
from facility.power import EPSILON_WATTS, kw

PHASES = ("single", "three")


@dataclass(frozen=True, slots=True)
class Feed:
    """One power feed and the PDUs it supplies."""

    name: str
    voltage: float
    amperage: float
    phase: str = "single"
    max_utilization: float = 0.8
    pdus: tuple[str, ...] = ()
    # Racks the feed supplies directly (NetBox's PowerFeed.rack): their nodes, when none of their PDUs
    # is on a feed, are carried by these feeds.
    racks: tuple[str, ...] = ()

    @property
    def capacity_watts(self) -> float:
        """What the feed may carry continuously."""
        watts = self.voltage * self.amperage * self.max_utilization
        return watts * math.sqrt(3) if self.phase == "three" else watts

    @property
    def text(self) -> str:
        """``feed A1 415 V 32 A 3φ 80 %``: where a cap came from, as ctl shows it."""
        phase = "3φ" if self.phase == "three" else "1φ"
        return (
            f"feed {self.name} {self.voltage:g} V {self.amperage:g} A {phase} "
            f"{round(self.max_utilization * 100, 1):g} %"
        )


@dataclass(frozen=True, slots=True)
class DerivedCap:
    """A cap a domain gets from its feeds, and the words that say where it came from."""

    domain: Domain
    cap_watts: float
    source: str


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node's load for feed accounting: its use (node_watts + larger of placed and measured)."""

    name: str
    rack: str | None
    pdus: tuple[str, ...]
    reserved_watts: float
    measured_watts: float


@dataclass(frozen=True, slots=True)
class Violation:
    """Something that would pass what carries it when a feed is lost."""

    feed_lost: str
    domain: Domain | None  # None for a feed's own total
    carrier: str  # the surviving feed or PDU that would carry it
    reserved_watts: float
    measured_watts: float
    capacity_watts: float
    dark_nodes: tuple[str, ...] = ()

    @property
    def load_watts(self) -> float:
        return max(self.reserved_watts, self.measured_watts)

    @property
    def over_watts(self) -> float:
        return self.load_watts - self.capacity_watts

    @property
    def text(self) -> str:
        if self.dark_nodes:
            names = ", ".join(self.dark_nodes[:5]) + (" …" if len(self.dark_nodes) > 5 else "")
            return (
                f"{self.domain.label if self.domain else 'nodes'}: {len(self.dark_nodes)} node(s) "
                f"lose power with feed {self.feed_lost} ({names})"
            )
        what = self.domain.label if self.domain else f"feed {self.carrier}"
        via = "" if self.domain is None or self.domain.level == "pdu" else f" on feed {self.carrier}"
        return (
            f"{what}{via}: {kw(self.load_watts)} of {kw(self.capacity_watts)} "
            f"without feed {self.feed_lost} ({kw(self.over_watts)} over; reserved "
            f"{kw(self.reserved_watts)}, measured peak {kw(self.measured_watts)})"
        )


def feed_of_pdu(feeds: Iterable[Feed]) -> dict[str, Feed]:
    """Each PDU's feed (a PDU named under two feeds keeps the smaller one: either may be the one)."""
    found: dict[str, Feed] = {}
    for feed in feeds:
        for pdu in feed.pdus:
            if pdu not in found or feed.capacity_watts < found[pdu].capacity_watts:
                found[pdu] = feed
    return found


def derived_caps(feeds: Iterable[Feed], rack_pdus: Mapping[str, Iterable[str]]) -> dict[Domain, DerivedCap]:
    """Caps implied by the feeds: each fed PDU's feed capacity, each rack's smallest feed capacity.

    ``rack_pdus`` maps a rack's name to the PDUs its nodes are plugged into. A feed naming a rack in
    ``racks`` reaches it whether or not a node is there yet.
    """
    feeds = list(feeds)
    by_pdu = feed_of_pdu(feeds)
    caps: dict[Domain, DerivedCap] = {}
    for pdu, feed in sorted(by_pdu.items()):
        caps[Domain("pdu", pdu)] = DerivedCap(Domain("pdu", pdu), feed.capacity_watts, feed.text)
    direct = feeds_of_rack(feeds)
    for rack in sorted(set(rack_pdus) | set(direct)):
        rack_feeds = {by_pdu[p].name: by_pdu[p] for p in rack_pdus.get(rack, ()) if p in by_pdu}
        rack_feeds.update({f.name: f for f in direct.get(rack, ())})
        if not rack_feeds:
            continue
        smallest = min(rack_feeds.values(), key=lambda f: (f.capacity_watts, f.name))
        source = smallest.text
        if len(rack_feeds) > 1:
            source += f" (smallest of {len(rack_feeds)} feeds: each carries the rack alone)"
        caps[Domain("rack", rack)] = DerivedCap(Domain("rack", rack), smallest.capacity_watts, source)
    return caps


def feeds_of_rack(feeds: Iterable[Feed]) -> dict[str, list[Feed]]:
    """The feeds that name each rack directly."""
    found: dict[str, list[Feed]] = {}
    for feed in feeds:
        for rack in feed.racks:
            found.setdefault(rack, []).append(feed)
    return found


def _rack_outlet(feed: str, rack: str) -> str:
    # Where a rack-level feed reaches a rack, counted like a PDU of that feed; never shown as one.
    return f"{feed}@{rack}"


def _with_rack_outlets(feeds: list[Feed], nodes: Iterable[NodeLoad]) -> tuple[list[Feed], list[NodeLoad], set[str]]:
    """Rack-level feeds as outlets: a node none of whose PDUs is fed takes its rack's feeds' outlets."""
    direct = feeds_of_rack(feeds)
    if not direct:
        return feeds, list(nodes), set()
    fed = set(feed_of_pdu(feeds))
    outlets: set[str] = set()
    out_nodes = []
    for node in nodes:
        if node.rack in direct and fed.isdisjoint(node.pdus):
            pdus = tuple(_rack_outlet(f.name, node.rack) for f in direct[node.rack])
            outlets.update(pdus)
            node = NodeLoad(node.name, node.rack, pdus, node.reserved_watts, node.measured_watts)
        out_nodes.append(node)
    out_feeds = [
        Feed(f.name, f.voltage, f.amperage, f.phase, f.max_utilization,
             f.pdus + tuple(_rack_outlet(f.name, r) for r in f.racks), f.racks)
        for f in feeds
    ]
    return out_feeds, out_nodes, outlets


def _shares(node: NodeLoad, live_pdus: list[str]) -> tuple[float, float]:
    n = len(live_pdus)
    return node.reserved_watts / n, node.measured_watts / n


def feed_loss(
    lost: Feed,
    feeds: Iterable[Feed],
    nodes: Iterable[NodeLoad],
    *,
    pdu_caps: Mapping[str, float] | None = None,
    pdu_other_watts: Mapping[str, float] | None = None,
) -> list[Violation]:
    """Every PDU, feed and rack that would pass what carries it if ``lost`` failed, worst first.

    ``pdu_caps`` overrides a PDU's cap (an explicit budget); otherwise its feed's capacity counts.
    """
    feeds, nodes, outlets = _with_rack_outlets(list(feeds), nodes)
    lost = next((f for f in feeds if f.name == lost.name), lost)
    by_pdu = feed_of_pdu(feeds)
    by_name = {f.name: f for f in feeds}
    pdu_caps = dict(pdu_caps or {})
    other = dict(pdu_other_watts or {})
    lost_pdus = set(lost.pdus)

    pdu_load: dict[str, list[float]] = {}
    rack_on_feed: dict[tuple[str, str], list[float]] = {}
    dark: dict[str | None, list[str]] = {}
    # Only what the loss moves load onto is reported: a PDU already past its cap with both feeds up
    # is the ordinary power report's business, not this one's.
    touched_pdus: set[str] = set()
    touched_racks: set[str] = set()
    for node in nodes:
        touched = not lost_pdus.isdisjoint(node.pdus)
        live = [p for p in node.pdus if p not in lost_pdus]
        if touched and not live:
            dark.setdefault(node.rack, []).append(node.name)
            continue
        if not live:
            continue
        if touched:
            touched_pdus.update(live)
            if node.rack is not None:
                touched_racks.add(node.rack)
        reserved, measured = _shares(node, live)
        for pdu in live:
            load = pdu_load.setdefault(pdu, [0.0, 0.0])
            load[0] += reserved
            load[1] += measured
            feed = by_pdu.get(pdu)
            if feed is not None and node.rack is not None:
                share = rack_on_feed.setdefault((node.rack, feed.name), [0.0, 0.0])
                share[0] += reserved
                share[1] += measured

    violations: list[Violation] = []
    for rack, names in sorted(dark.items(), key=lambda kv: kv[0] or ""):
        violations.append(
            Violation(
                lost.name,
                Domain("rack", rack) if rack else None,
                lost.name,
                0.0,
                0.0,
                0.0,
                dark_nodes=tuple(sorted(names)),
            )
        )
    touched_feeds = {by_pdu[p].name for p in touched_pdus if p in by_pdu} - {lost.name}
    feed_total: dict[str, list[float]] = {}
    for pdu, (reserved, measured) in pdu_load.items():
        reserved += other.get(pdu, 0.0)
        measured += other.get(pdu, 0.0)
        feed = by_pdu.get(pdu)
        if feed is not None:
            total = feed_total.setdefault(feed.name, [0.0, 0.0])
            total[0] += reserved
            total[1] += measured
        cap = pdu_caps.get(pdu, feed.capacity_watts if feed else None)
        if pdu in touched_pdus and pdu not in outlets and cap is not None and max(reserved, measured) > cap + EPSILON_WATTS:
            carrier = feed.name if feed else pdu
            violations.append(Violation(lost.name, Domain("pdu", pdu), carrier, reserved, measured, cap))
    for name in sorted(touched_feeds):
        reserved, measured = feed_total.get(name, (0.0, 0.0))
        capacity = by_name[name].capacity_watts
        if max(reserved, measured) > capacity + EPSILON_WATTS:
            violations.append(Violation(lost.name, None, name, reserved, measured, capacity))
    for (rack, name), (reserved, measured) in sorted(rack_on_feed.items()):
        if name == lost.name or rack not in touched_racks:
            continue
        capacity = by_name[name].capacity_watts
        if max(reserved, measured) > capacity + EPSILON_WATTS:
            violations.append(Violation(lost.name, Domain("rack", rack), name, reserved, measured, capacity))
    violations.sort(key=lambda v: (-(len(v.dark_nodes) > 0), -v.over_watts))
    return violations


def feed_loads(feeds: Iterable[Feed], nodes: Iterable[NodeLoad]) -> dict[str, tuple[float, float]]:
    """Each feed's (reserved, measured) load with every feed up: a node's load split over its fed PDUs."""
    feeds, nodes, _ = _with_rack_outlets(list(feeds), nodes)
    by_pdu = feed_of_pdu(feeds)
    loads = {f.name: [0.0, 0.0] for f in feeds}
    for node in nodes:
        fed = [by_pdu[p] for p in node.pdus if p in by_pdu]
        for feed in fed:
            loads[feed.name][0] += node.reserved_watts / len(fed)
            loads[feed.name][1] += node.measured_watts / len(fed)
    return {name: (r, m) for name, (r, m) in loads.items()}
