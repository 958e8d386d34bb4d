"""What a NetBox says about power and places, as llmgw's feeds and node labels (the plan of an import).

NetBox records power cable by cable: a power feed is cabled to a PDU's power port (its input); the
PDU's power outlets name that port and a ``feed_leg`` (A, B, C on three-phase); outlets are cabled to
the power ports of devices (a server's PSUs). The plan follows that path: a feed supplies the PDUs
whose input it is cabled to; a node draws from every PDU one of its PSUs is plugged into (two PDUs on
two feeds: dual-fed), and from that PDU's leg. A feed that names a rack (PowerFeed.rack) reaches that
rack too, so the CSV export of the same NetBox, which has no cables, gives its racks the same caps.

Racks are unique by site, location and name, not by name: a name two racks share is qualified by the
location (``hall-2.R-A01``) except for the one active rack among them. A rack's room is the top of its
location tree and its row the location it stands in when that is nested (or its rack group).

One object NetBox holds that llmgw cannot take (a feed with no voltage, a name no label can hold) is
reported by name and skipped; the rest is imported. The plan is a value: :mod:`facility.netbox_import`
turns it into a diff and applies it.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.node.protocol import is_node_name
from facility import feed_services
from facility import feeds as pure
from facility.domains import _NAME_RE, LABEL_PREFIX, LEG_KEY, PDU_KEY
from llmgw.errors import InvalidInput

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
LABEL_KEYS = {level: LABEL_PREFIX + level for level in ("site", "room", "row", "rack")}
# Every label an import sets (and so may change or remove); an operator's label on one of them wins.
MANAGED_KEYS: tuple[str, ...] = (*LABEL_KEYS.values(), PDU_KEY, LEG_KEY)
# What a site's rows are: the location a rack stands in when it is nested in a room (``location``),
# the rack's group where NetBox has rack groups (``group``), or none.
ROW_SOURCES = ("location", "group", "none")
# NetBox's CSV headers, lower-cased, '_' for spaces, as the two exports spell them.
CSV_COLUMNS = {"name", "power_panel", "rack", "status", "type", "supply", "voltage", "amperage", "phase", "max_utilization"}
# NetBox's own default, used only when a person says so (--default-utilization).
NETBOX_DEFAULT_UTILIZATION = 80


def safe_name(text: Any) -> str:
    """A NetBox name as an llmgw name: runs of other characters become '-'."""
    return _UNSAFE.sub("-", str(text or "")).strip("-")


@dataclass
class NetboxPlan:
    """What an import would set: feeds, each node's location labels, and what it could not take."""

    feeds: list[pure.Feed] = field(default_factory=list)
    # node → the labels NetBox gives it (only MANAGED_KEYS; a key absent is one NetBox no longer gives)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    # Objects reported by name and skipped: ``power feed MDB-C/A1: supplies no PDU or rack``.
    skipped: list[str] = field(default_factory=list)
    # What a person should know that changes no label or cap by itself (a planned feed, a failed one).
    notes: list[str] = field(default_factory=list)
    # The site imported (its slug), or None for every site: only its nodes lose labels NetBox no longer gives.
    site: str | None = None


def _value(obj: Any, key: str = "value") -> Any:
    return obj.get(key) if isinstance(obj, dict) else obj


def _id(obj: Any) -> Any:
    return obj.get("id") if isinstance(obj, dict) else obj


def _phase(value: Any) -> str:
    text = str(_value(value) or "").lower()
    if text.startswith("three") or text.startswith("3"):
        return "three"
    if text.startswith("single") or text.startswith("1"):
        return "single"
    raise InvalidInput(f"phase: {value!r} is neither single-phase nor three-phase", field="phase")


def _choice(value: Any, choices: tuple[str, ...], default: str, what: str) -> str:
    text = str(_value(value) or "").strip().lower()
    if not text:
        return default
    if text not in choices:
        raise InvalidInput(f"{what}: {value!r} is not one of {', '.join(choices)}", field=what)
    return text


def _number(key: str, value: Any) -> float:
    text = str(value).strip().rstrip("%").strip() if value is not None else ""
    try:
        number = float(text)
    except ValueError:
        raise InvalidInput(f"{key}: {value!r} is not a number", field=key) from None
    return number


def feed_from_netbox(name: str, raw: Mapping[str, Any], *, pdus: Iterable[str] = (), racks: Iterable[str] = (),
                     default_utilization: float | None = None) -> pure.Feed:
    """One NetBox power feed (API object or CSV row) checked as any feed is; InvalidInput names the field."""
    utilization = raw.get("max_utilization")
    if utilization in (None, ""):
        if default_utilization is None:
            raise InvalidInput("max_utilization: not given", field="max_utilization")
        utilization = default_utilization
    item = {
        "name": name,
        "voltage": _number("voltage", raw.get("voltage")),
        "amperage": _number("amperage", raw.get("amperage")),
        "phase": _phase(raw.get("phase")),
        "max_utilization": _number("max_utilization", utilization) / 100,
        "status": _choice(raw.get("status"), pure.STATUSES, "active", "status"),
        "supply": _choice(raw.get("supply"), pure.SUPPLIES, "ac", "supply"),
        "pdus": sorted(set(pdus)),
        "racks": sorted(set(racks)),
    }
    return feed_services.feed_check(item)


def _feeds(found: list[tuple[str, str, Mapping[str, Any], list[str], list[str]]], plan: NetboxPlan,
           default_utilization: float | None = None) -> None:
    """Feeds named as in NetBox; a name two panels share is qualified by its panel (``panel.name``).

    ``found``: (panel, name, raw, pdus, racks). A feed llmgw cannot take is skipped and reported.
    """
    counts: dict[str, int] = defaultdict(int)
    for _, name, *_ in found:
        counts[name] += 1
    taken: set[str] = set()
    for panel, name, raw, pdus, racks in sorted(found, key=lambda f: (f[1], f[0])):
        qualified = name if counts[name] == 1 else f"{panel}.{name}"
        if qualified in taken:
            # A row given twice, or names NetBox tells apart by characters a name here cannot hold (A 1, A/1):
            # the feeds are stored by name, so a second would replace the first behind the diff's back.
            plan.skipped.append(f"power feed {panel}/{name}: another feed of this import is named {qualified} already")
            continue
        try:
            feed = feed_from_netbox(qualified, raw, pdus=pdus, racks=racks, default_utilization=default_utilization)
        except InvalidInput as exc:
            if not pdus and not racks:
                plan.skipped.append(f"power feed {panel}/{name}: supplies no PDU and no rack")
            else:
                plan.skipped.append(f"power feed {panel}/{name}: {exc.message}")
            continue
        taken.add(qualified)
        plan.feeds.append(feed)
        if feed.status == "failed":
            plan.notes.append(f"feed {feed.name} has failed: what it fed runs on its other feeds now (N−1)")
        elif not feed.is_live:
            plan.notes.append(f"feed {feed.name} is {feed.status}: listed, carries nothing")


# -- the API's objects --------------------------------------------------------------------------------------

# The NetBox endpoints a plan reads, each /api/dcim/<name>/.
ENDPOINTS = ("sites", "locations", "racks", "power-panels", "power-feeds", "power-ports", "power-outlets", "devices")


def _rack_names(racks: Mapping[int, dict], locations: Mapping[int, dict]) -> dict[int, str]:
    """Each rack's llmgw name: its own, qualified by its location (then site) where two racks share it."""
    by_name: dict[str, list[int]] = defaultdict(list)
    for rid, rack in racks.items():
        by_name[safe_name(rack.get("name"))].append(rid)
    names: dict[int, str] = {}
    for name, ids in by_name.items():
        if len(ids) == 1:
            names[ids[0]] = name
            continue
        active = [i for i in ids if _value(racks[i].get("status")) in (None, "active")]
        for rid in ids:
            if len(active) == 1 and rid == active[0]:
                names[rid] = name
                continue
            location = locations.get(_id(racks[rid].get("location"))) or {}
            where = safe_name(location.get("slug") or location.get("name") or _value(racks[rid].get("site"), "slug"))
            names[rid] = f"{where}.{name}" if where else f"{name}.{rid}"
    # Still shared (two racks of one name in one location of two sites): the NetBox id tells them apart.
    seen: dict[str, int] = defaultdict(int)
    for qualified in names.values():
        seen[qualified] += 1
    return {rid: (f"{n}.{rid}" if seen[n] > 1 else n) for rid, n in names.items()}


def _room_and_row(rack: Mapping[str, Any], locations: Mapping[int, dict], row_from: str) -> tuple[str | None, str | None]:
    """The room (top of the rack's location tree) and the row (the nested location, or the rack group)."""
    chain: list[dict] = []
    loc = locations.get(_id(rack.get("location")))
    while loc is not None and len(chain) < 32:
        chain.append(loc)
        loc = locations.get(_id(loc.get("parent")))
    room = safe_name(chain[-1].get("slug") or chain[-1].get("name")) if chain else None
    row = None
    if row_from == "location" and len(chain) > 1:
        row = safe_name(chain[0].get("slug") or chain[0].get("name"))
    elif row_from == "group" and isinstance(rack.get("group"), dict):
        row = safe_name(rack["group"].get("slug") or rack["group"].get("name"))
    return room or None, row or None


def plan_from_objects(
    objects: Mapping[str, list[dict]],
    *,
    nodes: set[str],
    roles: set[str] | None = None,
    row_from: str = "location",
    site: str | None = None,
) -> NetboxPlan:
    """The plan NetBox's objects (endpoint → its objects, as the API answers them) give.

    ``nodes`` are the names llmgw knows (joined or labelled); devices of the same role as one of them
    are labelled in advance, before they join. ``roles`` (slugs) picks the roles instead.
    """
    plan = NetboxPlan(site=site)
    get = lambda key: {o["id"]: o for o in objects.get(key, []) if isinstance(o, dict) and "id" in o}  # noqa: E731
    sites, locations, racks = get("sites"), get("locations"), get("racks")
    panels, raw_feeds, ports, outlets, devices = (
        get("power-panels"), get("power-feeds"), get("power-ports"), get("power-outlets"), get("devices"))
    rack_name = _rack_names(racks, locations)

    # The PDU inputs each feed is cabled to: from the feed's side and from the port's, cable by cable.
    inputs_of_feed: dict[int, set[int]] = defaultdict(set)
    for fid, raw in raw_feeds.items():
        if raw.get("link_peers_type") == "dcim.powerport":
            inputs_of_feed[fid].update(_id(p) for p in raw.get("link_peers") or [])
    for pid, port in ports.items():
        if port.get("link_peers_type") == "dcim.powerfeed":
            for peer in port.get("link_peers") or []:
                inputs_of_feed[_id(peer)].add(pid)
    feed_of_input = {pid: fid for fid, pids in inputs_of_feed.items() for pid in pids if fid in raw_feeds}

    def device_name(device_id: Any) -> str:
        return safe_name((devices.get(device_id) or {}).get("name"))

    # A PDU: a device whose outlets hang off an input cabled to a feed.
    pdu_of_input = {pid: device_name(_id(ports[pid].get("device"))) for pid in feed_of_input if pid in ports}
    pdu_devices = {_id(ports[pid].get("device")) for pid in pdu_of_input}
    pdu_devices |= {_id(o.get("device")) for o in outlets.values()}

    found = []
    for fid, raw in raw_feeds.items():
        panel = panels.get(_id(raw.get("power_panel"))) or raw.get("power_panel") or {}
        pdus = sorted({pdu_of_input[p] for p in inputs_of_feed.get(fid, ()) if pdu_of_input.get(p)})
        rack = rack_name.get(_id(raw.get("rack")))
        found.append((safe_name(panel.get("name")), safe_name(raw.get("name")), raw, pdus, [rack] if rack else []))
    _feeds(found, plan)
    feed_by_pdu = pure.feed_of_pdu(plan.feeds)

    # Which devices are nodes: those llmgw knows by name, and the devices sharing a role with one of them.
    if roles is None:
        roles = {_value(d.get("role"), "slug") for d in devices.values() if d.get("name") in nodes} - {None}
    where_outlet = {oid: o for oid, o in outlets.items()}
    for did, device in sorted(devices.items()):
        name = device.get("name")
        if did in pdu_devices or not isinstance(name, str):
            continue
        if name not in nodes and _value(device.get("role"), "slug") not in roles:
            continue
        if not is_node_name(name):
            plan.skipped.append(f"device {name!r}: not a node name")
            continue
        labels: dict[str, str] = {}
        device_site = sites.get(_id(device.get("site"))) or device.get("site") or {}
        if device_site.get("slug"):
            labels[LABEL_KEYS["site"]] = safe_name(device_site["slug"])
        rack = racks.get(_id(device.get("rack")))
        if rack is not None:
            room, row = _room_and_row(rack, locations, row_from)
            labels[LABEL_KEYS["rack"]] = rack_name[rack["id"]]
            if row:
                labels[LABEL_KEYS["row"]] = row
        else:
            room, _ = _room_and_row(device, locations, "none")
        if room:
            labels[LABEL_KEYS["room"]] = room
        pdus, legs = set(), set()
        for port in ports.values():
            if _id(port.get("device")) != did or port.get("link_peers_type") != "dcim.poweroutlet":
                continue
            for peer in port.get("link_peers") or []:
                outlet = where_outlet.get(_id(peer))
                if outlet is None:
                    continue
                pdu = device_name(_id(outlet.get("device")))
                if not pdu:
                    continue
                pdus.add(pdu)
                leg = _value(outlet.get("feed_leg"))
                feed = feed_by_pdu.get(pdu)
                if leg in pure.LEGS and feed is not None and feed.phase == "three":
                    legs.add(pure.leg_name(pdu, leg))
        if pdus:
            labels[PDU_KEY] = ",".join(sorted(pdus))
        if legs:
            labels[LEG_KEY] = ",".join(sorted(legs))
        bad = [v for v in labels.values() if not all(_NAME_RE.fullmatch(p) for p in v.split(","))]
        if bad:
            plan.skipped.append(f"device {name}: {bad[0]!r} cannot be a label's value")
            continue
        plan.labels[name] = labels
    return plan


# -- NetBox's CSV export of power feeds ---------------------------------------------------------------------


def plan_from_csv(text: str, *, default_utilization: float | None = None) -> NetboxPlan:
    """NetBox's CSV export of power feeds ("All data", or the current view with the needed columns).

    Each feed supplies the rack it names (the export has no cables, so no PDU and no node label). An
    export without a max utilization column is refused, unless ``default_utilization`` (%) is given:
    NetBox's current-view export leaves that column out, and guessing 80 % would hide a 90 % feed.
    """
    problem = pure.utilization_problem(default_utilization)
    if problem:
        raise InvalidInput(f"default_utilization: {problem}", field="default_utilization")
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    try:
        header = next(reader, None)
        if header is None:
            raise InvalidInput("csv: empty; export NetBox's power feeds (Export → All data)", field="csv")
        columns = [h.strip().lower().replace(" ", "_") for h in header]
        twice = sorted({c for c in columns if c and columns.count(c) > 1})
        if twice:  # the last column of a name would be read alone, the other unseen
            raise InvalidInput(f"csv line 1: column {twice[0]} is given twice", field="csv")
        for need in ("name", "voltage", "amperage", "phase"):
            if need not in columns:
                raise InvalidInput(f"csv line 1: column {need} is missing (NetBox's header: {need.replace('_', ' ').title()})", field="csv")
        if "max_utilization" not in columns and default_utilization is None:
            raise InvalidInput(
                "csv line 1: column max_utilization is missing (NetBox's current-view export leaves it out): "
                "export All data, or give --default-utilization PERCENT", field="csv",
            )
        plan = NetboxPlan()
        found = []
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise InvalidInput(f"csv line {line}: {len(row)} fields where the header has {len(columns)}", field="csv")
            values = {k: v.strip() for k, v in zip(columns, row, strict=True)}
            rack = safe_name(values.get("rack"))
            found.append((safe_name(values.get("power_panel")), safe_name(values.get("name")), values, [], [rack] if rack else []))
    except csv.Error as exc:
        raise InvalidInput(f"csv line {reader.line_num}: {exc}", field="csv") from exc
    _feeds(found, plan, default_utilization=default_utilization)
    return plan
