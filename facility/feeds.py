"""Power feeds: what a feed can carry, the caps it implies, and what happens when one is lost (N−1).

Pure: no Django, no clock. A feed is a circuit from a panel (voltage, amperage, phase) held to a
share of its rating (``max_utilization``, 80 % by the continuous-load rule); it feeds one or more
PDUs. A node plugged into two PDUs on two feeds is dual-fed: either feed must carry it alone.

The rules:

- A feed's capacity is |V| × A × max_utilization, × √3 for three-phase (line-to-line voltage): what
  NetBox calls a PowerFeed's available power. A DC feed's voltage may be negative (−48 V).
- Only an ``active`` feed carries anything. A ``planned`` or ``offline`` feed is listed, never counted;
  a ``failed`` one is a feed lost now: its racks run on what is left (N−1 is the present, not a what-if).
- A PDU's cap defaults to its feed's capacity. A rack's cap defaults to the **smallest** capacity of
  the live feeds that reach it (each must carry the rack alone) — never their sum; a rack reached only
  by feeds that are not live gets a cap of 0. An explicit budget wins, but never above the feeds.
- A three-phase feed's leg (NetBox's ``feed_leg`` of the outlet a node is plugged into) carries a third
  of it: V_LL / √3 × A × utilisation. A leg, not the feed's total, trips its breaker, so each leg a node
  draws from is a domain (``leg:<pdu>.<A|B|C>``) with that cap.
- A feed may name racks it supplies directly (NetBox's PowerFeed.rack): they count among the rack's
  feeds, and a node none of whose PDUs is on a feed is carried by its rack's feeds.
- Load is a domain's use (invariant 8): each node's ``node_watts`` plus the larger of placed and measured,
  node by node — the same sum ``ctl facility`` and placement make. When a feed is lost, each node it
  fed is carried by its other PDUs, its load split evenly over them; a node with no PDU left goes dark.
  A surviving PDU, leg or feed, or a rack's share on a surviving feed, past its capacity is a violation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from facility.domains import Domain
from facility.power import EPSILON_WATTS, kw

PHASES = ("single", "three")
SUPPLIES = ("ac", "dc")
# NetBox's PowerFeed statuses; only an active feed carries load.
STATUSES = ("active", "planned", "offline", "failed")
LEGS = ("A", "B", "C")


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
    status: str = "active"
    supply: str = "ac"

    @property
    def is_live(self) -> bool:
        """True when the feed carries load now (NetBox status ``active``)."""
        return self.status == "active"

    @property
    def capacity_watts(self) -> float:
        """What the feed may carry continuously."""
        watts = abs(self.voltage) * self.amperage * self.max_utilization
        return watts * math.sqrt(3) if self.phase == "three" else watts

    @property
    def leg_capacity_watts(self) -> float:
        """What one leg may carry: a third of a three-phase feed (V_LL / √3 × A × util), else the whole."""
        if self.phase == "three":
            return abs(self.voltage) / math.sqrt(3) * self.amperage * self.max_utilization
        return self.capacity_watts

    @property
    def text(self) -> str:
        """``feed A1 415 V 32 A 3φ 80 %``: where a cap came from, as ctl shows it."""
        phase = "DC" if self.supply == "dc" else ("3φ" if self.phase == "three" else "1φ")
        state = "" if self.is_live else f" ({self.status})"
        return (
            f"feed {self.name} {self.voltage:g} V {self.amperage:g} A {phase} "
            f"{round(self.max_utilization * 100, 1):g} %{state}"
        )


def rating_text(row: Mapping) -> str:
    """A feed row's rating (``feeds_overview``, the API's), as ctl and the console show it beside the feed's
    name and status: ``415 V 32 A 3φ 80 %``, its ``text`` less those two."""
    return row["text"].removeprefix(f"feed {row['name']} ").removesuffix(f" ({row['status']})")


def leg_name(pdu: str, leg: str) -> str:
    """The domain name of a PDU's leg: ``r1-pdu-a.B``."""
    return f"{pdu}.{leg}"


def leg_pdu(name: str) -> tuple[str, str] | None:
    """``r1-pdu-a.B`` → (``r1-pdu-a``, ``B``); None when the name is not a PDU's leg."""
    pdu, dot, leg = name.rpartition(".")
    return (pdu, leg) if dot and pdu and leg in LEGS else None


@dataclass(frozen=True, slots=True)
class DerivedCap:
    """A cap a domain gets from its feeds, and the words that say where it came from."""

    domain: Domain
    cap_watts: float
    source: str


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node's load for feed accounting.

    ``use_watts`` is its term in every domain's use (:func:`facility.power.node_use_watts`: node_watts
    plus the larger of placed and measured); reserved and measured are shown beside it. ``equipment``: not
    a node but a rack's other equipment (its budget's other watts: switches, storage), on the rack's PDUs
    as a node on them is; it goes dark with them, and is named among no dark nodes.
    """

    name: str
    rack: str | None
    pdus: tuple[str, ...]
    use_watts: float
    reserved_watts: float = 0.0
    measured_watts: float = 0.0
    legs: tuple[str, ...] = ()
    equipment: bool = False


@dataclass(frozen=True, slots=True)
class Violation:
    """Something that would pass what carries it when a feed is lost."""

    feed_lost: str
    domain: Domain | None  # None for a feed's own total
    carrier: str  # the surviving feed or PDU that would carry it
    load_watts: float
    capacity_watts: float
    reserved_watts: float = 0.0
    measured_watts: float = 0.0
    dark_nodes: tuple[str, ...] = ()

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
        via = "" if self.domain is None or self.domain.level in ("pdu", "leg") else f" on feed {self.carrier}"
        return (
            f"{what}{via}: {kw(self.load_watts)} of {kw(self.capacity_watts)} "
            f"without feed {self.feed_lost} ({kw(self.over_watts)} over; reserved "
            f"{kw(self.reserved_watts)}, measured peak {kw(self.measured_watts)})"
        )


def feed_of_pdu(feeds: Iterable[Feed]) -> dict[str, Feed]:
    """Each PDU's feed: a live one where it has one, the smaller of two (either may be the one)."""
    found: dict[str, Feed] = {}
    for feed in feeds:
        for pdu in feed.pdus:
            have = found.get(pdu)
            if have is None or (not feed.is_live, feed.capacity_watts) < (not have.is_live, have.capacity_watts):
                found[pdu] = feed
    return found


def _not_live_source(feeds: Iterable[Feed]) -> str:
    return "no live feed (" + ", ".join(f"{f.name} {f.status}" for f in sorted(feeds, key=lambda f: f.name)) + ")"


UNFED_SOURCE = "no live feed (none reaches its input)"


def derived_caps(
    feeds: Iterable[Feed], rack_pdus: Mapping[str, Iterable[str]], legs: Iterable[str] = (),
    unfed: Iterable[str] = (),
) -> dict[Domain, DerivedCap]:
    """Caps implied by the feeds: each fed PDU's feed capacity, each leg's share of it, each rack's
    smallest live feed capacity.

    ``rack_pdus`` maps a rack's name to the PDUs its nodes are plugged into; ``legs`` names the legs
    nodes draw from (``pdu.A``). A feed naming a rack in ``racks`` reaches it whether or not a node is
    there yet. A domain reached only by feeds that are not live gets a cap of 0: nothing powers it, and
    so does a PDU the DCIM says no feed reaches (``unfed``) and each of its legs.
    """
    feeds = list(feeds)
    by_pdu = feed_of_pdu(feeds)
    caps: dict[Domain, DerivedCap] = {}
    unfed = set(unfed) - set(by_pdu)
    for pdu in sorted(unfed):
        caps[Domain("pdu", pdu)] = DerivedCap(Domain("pdu", pdu), 0.0, UNFED_SOURCE)
    for pdu, feed in sorted(by_pdu.items()):
        domain = Domain("pdu", pdu)
        if feed.is_live:
            caps[domain] = DerivedCap(domain, feed.capacity_watts, feed.text)
        else:
            caps[domain] = DerivedCap(domain, 0.0, _not_live_source([feed]))
    for name in sorted(set(legs)):
        parsed = leg_pdu(name)
        feed = by_pdu.get(parsed[0]) if parsed else None
        domain = Domain("leg", name)
        if parsed and parsed[0] in unfed:
            caps[domain] = DerivedCap(domain, 0.0, UNFED_SOURCE)
        if feed is None:
            continue
        if not feed.is_live:
            caps[domain] = DerivedCap(domain, 0.0, _not_live_source([feed]))
        elif feed.phase == "three":
            caps[domain] = DerivedCap(domain, feed.leg_capacity_watts, f"{feed.text}, leg {parsed[1]} (a third)")
        else:
            caps[domain] = DerivedCap(domain, feed.capacity_watts, feed.text)
    direct = feeds_of_rack(feeds)
    for rack in sorted(set(rack_pdus) | set(direct)):
        rack_feeds = {by_pdu[p].name: by_pdu[p] for p in rack_pdus.get(rack, ()) if p in by_pdu}
        rack_feeds.update({f.name: f for f in direct.get(rack, ())})
        if not rack_feeds:
            continue
        domain = Domain("rack", rack)
        live = [f for f in rack_feeds.values() if f.is_live]
        if not live:
            caps[domain] = DerivedCap(domain, 0.0, _not_live_source(rack_feeds.values()))
            continue
        smallest = min(live, key=lambda f: (f.capacity_watts, f.name))
        source = smallest.text
        if len(live) > 1:
            source += f" (smallest of {len(live)} feeds: each carries the rack alone)"
        elif len(rack_feeds) > 1:
            source += " (" + ", ".join(
                f"{f.name} {f.status}" for f in sorted(rack_feeds.values(), key=lambda f: f.name) if not f.is_live
            ) + ": not counted)"
        caps[domain] = DerivedCap(domain, smallest.capacity_watts, source)
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
            node = dataclasses.replace(node, pdus=pdus, legs=())
        out_nodes.append(node)
    out_feeds = [dataclasses.replace(f, pdus=f.pdus + tuple(_rack_outlet(f.name, r) for r in f.racks)) for f in feeds]
    return out_feeds, out_nodes, outlets


class _Sum:
    """Load carried by one thing: use (what is judged), and reserved and measured (shown beside it)."""

    __slots__ = ("use", "reserved", "measured")

    def __init__(self) -> None:
        self.use = self.reserved = self.measured = 0.0

    def add(self, node: NodeLoad, share: float, other: float = 0.0) -> None:
        self.use += node.use_watts * share + other
        self.reserved += node.reserved_watts * share + other
        self.measured += node.measured_watts * share + other


def _down_pdus(feeds: list[Feed], down: set[str], unfed: Iterable[str] = ()) -> set[str]:
    """PDUs that have a feed, none of which is up once the feeds named ``down`` are lost, and the PDUs
    no feed reaches at all (``unfed``: a node on one is carried by its other PDUs alone)."""
    fed = feed_of_pdu(feeds)
    up = feed_of_pdu(f for f in feeds if f.is_live and f.name not in down)
    return (set(fed) - set(up)) | (set(unfed) - set(fed))


def feed_loss(
    lost: Feed,
    feeds: Iterable[Feed],
    nodes: Iterable[NodeLoad],
    *,
    pdu_caps: Mapping[str, float] | None = None,
    pdu_other_watts: Mapping[str, float] | None = None,
    unfed: Iterable[str] = (),
) -> list[Violation]:
    """Every PDU, leg, feed and rack that would pass what carries it if ``lost`` failed, worst first.

    Feeds that are not live are lost already. ``pdu_caps`` lowers a PDU's cap below its feed's (an
    explicit budget); it never raises it: N−1 judges by the feed. ``unfed``: PDUs no feed reaches, which
    carry nothing (a node on one and a fed PDU is single-fed).
    """
    return feed_loss_carried(lost, feeds, nodes, pdu_caps=pdu_caps, pdu_other_watts=pdu_other_watts, unfed=unfed)[0]


def feed_loss_carried(
    lost: Feed,
    feeds: Iterable[Feed],
    nodes: Iterable[NodeLoad],
    *,
    pdu_caps: Mapping[str, float] | None = None,
    pdu_other_watts: Mapping[str, float] | None = None,
    unfed: Iterable[str] = (),
) -> tuple[list[Violation], dict[str, float]]:
    """:func:`feed_loss`'s violations, and the load (use, W) each surviving feed the loss moves load onto
    would carry: the N−1 headroom left where nothing is violated."""
    feeds, nodes, outlets = _with_rack_outlets(list(feeds), nodes)
    lost = next((f for f in feeds if f.name == lost.name), lost)
    by_pdu = feed_of_pdu(f for f in feeds if f.is_live and f.name != lost.name)
    by_name = {f.name: f for f in feeds}
    pdu_caps = dict(pdu_caps or {})
    other = dict(pdu_other_watts or {})
    lost_pdus = set(lost.pdus)
    down_pdus = _down_pdus(feeds, {lost.name}, unfed)

    pdu_load: dict[str, _Sum] = {}
    leg_load: dict[str, _Sum] = {}
    rack_on_feed: dict[tuple[str, str], _Sum] = {}
    dark: dict[str | None, list[str]] = {}
    # Only what the loss moves load onto is reported: a PDU already past its cap with both feeds up
    # is the ordinary power report's business, not this one's.
    touched_pdus: set[str] = set()
    touched_racks: set[str] = set()
    for node in nodes:
        touched = not lost_pdus.isdisjoint(node.pdus)
        live = [p for p in node.pdus if p not in down_pdus]
        if touched and not live:
            if not node.equipment:
                dark.setdefault(node.rack, []).append(node.name)
            continue
        if not live:
            continue
        if touched:
            touched_pdus.update(live)
            if node.rack is not None:
                touched_racks.add(node.rack)
        share = 1 / len(live)
        for pdu in live:
            pdu_load.setdefault(pdu, _Sum()).add(node, share)
            legs = [leg for leg in node.legs if (leg_pdu(leg) or ("",))[0] == pdu]
            for leg in legs:
                leg_load.setdefault(leg, _Sum()).add(node, share / len(legs))
            feed = by_pdu.get(pdu)
            if feed is not None and node.rack is not None:
                rack_on_feed.setdefault((node.rack, feed.name), _Sum()).add(node, share)

    violations: list[Violation] = []
    for rack, names in sorted(dark.items(), key=lambda kv: kv[0] or ""):
        domain = Domain("rack", rack) if rack else None
        violations.append(Violation(lost.name, domain, lost.name, 0.0, 0.0, dark_nodes=tuple(sorted(names))))

    def judge(domain: Domain | None, carrier: str, load: _Sum, capacity: float) -> None:
        if load.use > capacity + EPSILON_WATTS:
            violations.append(Violation(lost.name, domain, carrier, load.use, capacity, load.reserved, load.measured))

    feed_total: dict[str, _Sum] = {}
    for pdu, load in sorted(pdu_load.items()):
        extra = other.get(pdu, 0.0)
        load.use += extra
        load.reserved += extra
        load.measured += extra
        feed = by_pdu.get(pdu)
        if feed is not None:
            total = feed_total.setdefault(feed.name, _Sum())
            total.use += load.use
            total.reserved += load.reserved
            total.measured += load.measured
        caps = [c for c in (pdu_caps.get(pdu), feed.capacity_watts if feed else None) if c is not None]
        if pdu in touched_pdus and pdu not in outlets and caps:
            judge(Domain("pdu", pdu), feed.name if feed else pdu, load, min(caps))
    for leg, load in sorted(leg_load.items()):
        feed = by_pdu.get(leg_pdu(leg)[0])
        if feed is not None and leg_pdu(leg)[0] in touched_pdus:
            judge(Domain("leg", leg), feed.name, load, feed.leg_capacity_watts)
    touched_feeds = {by_pdu[p].name for p in touched_pdus if p in by_pdu}
    for name in sorted(touched_feeds):
        judge(None, name, feed_total.get(name, _Sum()), by_name[name].capacity_watts)
    for (rack, name), load in sorted(rack_on_feed.items()):
        if rack in touched_racks:
            judge(Domain("rack", rack), name, load, by_name[name].capacity_watts)
    violations.sort(key=lambda v: (-(len(v.dark_nodes) > 0), -v.over_watts))
    return violations, {name: feed_total.get(name, _Sum()).use for name in sorted(touched_feeds)}


def feed_loads(
    feeds: Iterable[Feed], nodes: Iterable[NodeLoad], *, pdu_other_watts: Mapping[str, float] | None = None
) -> dict[str, tuple[float, float, float]]:
    """Each feed's (use, reserved, measured) load now: a node's load split over its PDUs on live feeds, and
    each such PDU's other load (``pdu_other_watts``: its budget's, what no node reports), as feed_loss
    counts them.

    A feed that is not live carries nothing.
    """
    feeds, nodes, _ = _with_rack_outlets(list(feeds), nodes)
    by_pdu = feed_of_pdu(f for f in feeds if f.is_live)
    loads = {f.name: _Sum() for f in feeds}
    for node in nodes:
        fed = [by_pdu[p] for p in node.pdus if p in by_pdu]
        for feed in fed:
            loads[feed.name].add(node, 1 / len(fed))
    for pdu, other in sorted((pdu_other_watts or {}).items()):
        if pdu in by_pdu:
            total = loads[by_pdu[pdu].name]
            total.use += other
            total.reserved += other
            total.measured += other
    return {name: (s.use, s.reserved, s.measured) for name, s in loads.items()}


# Below this share of its legs' capacity a PDU's imbalance is not reported: two idle nodes on one leg read
# 100 % unbalanced while nothing is near a breaker.
IMBALANCE_MIN_LOAD_SHARE = 0.1


def leg_imbalance(loads: Iterable[float], capacity_watts: float | None = None) -> float | None:
    """How far a PDU's busiest or idlest leg is from the legs' mean, as a share of it (NEMA's unbalance);
    None with fewer than two legs, no load, or a load under IMBALANCE_MIN_LOAD_SHARE of the legs'
    ``capacity_watts`` together."""
    loads = list(loads)
    if len(loads) < 2:
        return None
    mean = sum(loads) / len(loads)
    if mean <= EPSILON_WATTS:
        return None
    if capacity_watts is not None and sum(loads) < IMBALANCE_MIN_LOAD_SHARE * capacity_watts:
        return None
    return max(abs(x - mean) for x in loads) / mean


def utilization_problem(percent: float | None) -> str | None:
    """Why a default max utilization (NetBox's, a percent) cannot be taken — a fraction where the percent
    belongs would cap every rack to almost nothing; None when it can."""
    if percent is None or 1 <= percent <= 100:
        return None
    hint = f": write {percent * 100:g} for {percent * 100:g} %" if 0 < percent < 1 else ""
    return f"a percent, 1 to 100 (NetBox's max utilization), not {percent:g}{hint}"
