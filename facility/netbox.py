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


@dataclass(frozen=True, slots=True)
class Known:
    """An object an earlier import brought in (facility.models.DcimObject): the name it was given, its site,
    and what the name was made from (a change of which is a rename)."""

    name: str
    site: str = ""
    named_from: str = ""


@dataclass(frozen=True, slots=True)
class Imported:
    """One object of this import, by the DCIM's id: the name it gets here."""

    kind: str  # site, rack, feed, pdu, device
    ext_id: int
    site: str
    name: str
    named_from: str
    fed: bool | None = None


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
    # Each feed's site (its panel's), by the feed's name here: an import of one site replaces that site's.
    feed_sites: dict[str, str] = field(default_factory=dict)
    # Every object found, by its DCIM id (what the next import matches on).
    objects: list[Imported] = field(default_factory=list)
    # Feeds NetBox holds that this import could not take, by id: the feed as imported before stays.
    kept_feeds: dict[int, str] = field(default_factory=dict)
    # PDUs no live feed reaches (none cabled, the feed deleted): they carry nothing.
    unfed_pdus: list[str] = field(default_factory=list)
    # Devices named like a node in more than one site: no label is set from either until one is mapped.
    ambiguous: list[str] = field(default_factory=list)
    # Their names: a node of such a name keeps the labels it has.
    ambiguous_nodes: set[str] = field(default_factory=set)
    # The sites this import read (None: every site NetBox has).
    sites_read: set[str] | None = None
    # Each node's PSUs' maximum draw together (NetBox's power ports): the most it can draw, its readings' ceiling.
    max_draw: dict[str, float] = field(default_factory=dict)


class _Names:
    """Names for one kind of object: what earlier imports gave keeps, a rename takes a new one, and a
    name two sites share is qualified by each new object's site (``got1.R-A01``)."""

    def __init__(self, kind: str, known: Mapping[tuple[str, int], Known], ids: set[int]) -> None:
        self.kind = kind
        self.known = known
        # Names held by objects this import does not name: another site's, or one gone from NetBox whose
        # removal waits for a person's yes. A name is free again only once its object is removed.
        self.taken: dict[str, str] = {
            k.name: k.site for (kind_, ext_id), k in known.items() if kind_ == kind and ext_id not in ids
        }
        self.sites: dict[str, set[str]] = defaultdict(set)
        for name, site in self.taken.items():
            self.sites[name].add(site)

    def seen(self, plain: str, site: str) -> None:
        """An object of this import whose own name is ``plain``: counted before any name is given."""
        self.sites[plain].add(site)

    def shared_across_sites(self, plain: str) -> bool:
        return len(self.sites.get(plain, ())) > 1

    def kept(self, ext_id: int | None, named_from: str) -> str | None:
        """The name an earlier import gave this object, when it was not renamed and is still free."""
        k = self.known.get((self.kind, ext_id)) if ext_id is not None else None
        if k is None or k.named_from != named_from or k.name in self.taken:
            return None
        return k.name

    def take(self, candidates: Iterable[str], site: str) -> str | None:
        for name in candidates:
            if name and name not in self.taken:
                self.taken[name] = site
                return name
        return None


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


@dataclass(frozen=True, slots=True)
class _FoundFeed:
    ext_id: int | None
    site: str
    panel: str
    name: str
    raw: Mapping[str, Any]
    pdus: tuple[str, ...]
    racks: tuple[str, ...]

    @property
    def named_from(self) -> str:
        # Its panel renamed, a feed keeps its name: a panel is not a domain, and the name people know stays.
        return f"{self.site}/{self.name}"


def _feeds(found: list[_FoundFeed], plan: NetboxPlan, known: Mapping[tuple[str, int], Known],
           default_utilization: float | None = None) -> None:
    """Feeds named as in NetBox; a name two panels of a site share is qualified by its panel
    (``panel.name``), one two sites share by its site (``got1.name``). An earlier import's name keeps.

    A feed llmgw cannot take is skipped and reported; where an earlier import brought it in, that feed
    stays as it was (``kept_feeds``): a feed that cannot be read never raises a cap.
    """
    names = _Names("feed", known, {f.ext_id for f in found if f.ext_id is not None})
    in_site: dict[tuple[str, str], int] = defaultdict(int)
    for f in found:
        in_site[(f.site, f.name)] += 1
    bases = {id(f): (f.name if in_site[(f.site, f.name)] == 1 else f"{f.panel}.{f.name}") for f in found}
    for f in found:
        names.seen(bases[id(f)], f.site)
    given: dict[int, str] = {}
    ordered = sorted(found, key=lambda f: (f.name, f.site, f.panel, f.ext_id or 0))
    for f in ordered:
        kept = names.kept(f.ext_id, f.named_from)
        if kept is not None:
            given[id(f)] = names.take([kept], f.site) or kept
    made: set[tuple[str, str, str]] = set()
    for f in ordered:
        base = bases[id(f)]
        if id(f) not in given:
            if (f.site, f.panel, f.name) in made and f.ext_id is None:
                # A row given twice, or names NetBox tells apart by characters a name here cannot hold (A 1, A/1).
                plan.skipped.append(f"power feed {f.panel}/{f.name}: another feed of this import is named {base} already")
                continue
            first = f"{f.site}.{base}" if f.site and names.shared_across_sites(base) else base
            candidates = [first, f"{f.site}.{base}" if f.site else "", f"{first}.{f.ext_id}" if f.ext_id else ""]
            name = names.take(candidates, f.site)
            if name is None:
                plan.skipped.append(f"power feed {f.panel}/{f.name}: another feed of this import is named {base} already")
                continue
            given[id(f)] = name
        made.add((f.site, f.panel, f.name))
        qualified = given[id(f)]
        try:
            feed = feed_from_netbox(qualified, f.raw, pdus=f.pdus, racks=f.racks, default_utilization=default_utilization)
        except InvalidInput as exc:
            if not f.pdus and not f.racks:
                plan.skipped.append(f"power feed {f.panel}/{f.name}: supplies no PDU and no rack")
                continue
            before = known.get(("feed", f.ext_id)) if f.ext_id is not None else None
            if before is not None:
                plan.kept_feeds[f.ext_id] = before.name
                plan.skipped.append(
                    f"power feed {f.panel}/{f.name}: {exc.message}; feed {before.name} stays as imported before"
                )
            elif f.pdus:
                plan.skipped.append(
                    f"power feed {f.panel}/{f.name}: {exc.message}; not counted: PDU {', '.join(f.pdus)} carries "
                    "nothing until NetBox's figures are fixed"
                )
            else:
                plan.skipped.append(
                    f"power feed {f.panel}/{f.name}: {exc.message}; not counted: rack {', '.join(f.racks)} is capped "
                    "by its other feeds"
                )
            continue
        plan.feeds.append(feed)
        plan.feed_sites[feed.name] = f.site
        if f.ext_id is not None:
            plan.objects.append(Imported("feed", f.ext_id, f.site, feed.name, f.named_from))
        if feed.status == "failed":
            plan.notes.append(f"feed {feed.name} has failed: what it fed runs on its other feeds now (N−1)")
        elif not feed.is_live:
            plan.notes.append(f"feed {feed.name} is {feed.status}: listed, carries nothing")


# -- the API's objects --------------------------------------------------------------------------------------

# The NetBox endpoints a plan reads, each /api/dcim/<name>/.
ENDPOINTS = ("sites", "locations", "racks", "power-panels", "power-feeds", "power-ports", "power-outlets", "devices")


def _slug(obj: Any) -> str:
    return safe_name(obj.get("slug") or obj.get("name")) if isinstance(obj, dict) else ""


def _rack_names(racks: Mapping[int, dict], locations: Mapping[int, dict], sites: Mapping[int, dict],
                known: Mapping[tuple[str, int], Known]) -> dict[int, str]:
    """Each rack's llmgw name: its own; where two racks of one site share it, qualified by the location
    (``hall-2.R-A01``) but for the one active rack among them; where two sites share it, by the site
    (``got1.R-A01``). A rack an earlier import named keeps that name until NetBox renames it."""
    names = _Names("rack", known, set(racks))

    def site_of(rack: dict) -> str:
        return _slug(sites.get(_id(rack.get("site"))) or rack.get("site"))

    by_site_name: dict[tuple[str, str], list[int]] = defaultdict(list)
    for rid, rack in racks.items():
        plain = safe_name(rack.get("name"))
        names.seen(plain, site_of(rack))
        by_site_name[(site_of(rack), plain)].append(rid)
    out: dict[int, str] = {}
    named_from = {rid: f"{site_of(r)}/{r.get('name')}" for rid, r in racks.items()}
    for rid in sorted(racks):
        kept = names.kept(rid, named_from[rid])
        if kept is not None:
            out[rid] = names.take([kept], site_of(racks[rid])) or kept
    order = sorted(racks, key=lambda i: (_value(racks[i].get("status")) not in (None, "active"), i))
    for rid in order:
        if rid in out:
            continue
        rack, site = racks[rid], site_of(racks[rid])
        plain = safe_name(rack.get("name"))
        location = locations.get(_id(rack.get("location"))) or {}
        where = _slug(location)
        crowded = len(by_site_name[(site, plain)]) > 1
        active = [i for i in by_site_name[(site, plain)] if _value(racks[i].get("status")) in (None, "active")]
        first = plain if not crowded or active == [rid] else (f"{where}.{plain}" if where else plain)
        if site and names.shared_across_sites(plain):
            first = f"{site}.{first}"
        candidates = [first, f"{where}.{plain}" if where else "", f"{site}.{where}.{plain}" if site and where else "",
                      f"{first}.{rid}"]
        out[rid] = names.take(candidates, site) or f"{first}.{rid}"
    return out


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


def _by_id(objects: Mapping[str, list[dict]], key: str) -> dict[int, dict]:
    return {o["id"]: o for o in objects.get(key, []) if isinstance(o, dict) and isinstance(o.get("id"), int)}


def plan_from_objects(
    objects: Mapping[str, list[dict]],
    *,
    nodes: set[str],
    roles: set[str] | None = None,
    row_from: str = "location",
    site: str | None = None,
    known: Mapping[tuple[str, int], Known] | None = None,
    device_map: Mapping[str, str] | None = None,
) -> NetboxPlan:
    """The plan NetBox's objects (endpoint → its objects, as the API answers them) give.

    ``nodes`` are the names llmgw knows (joined or labelled); devices of the same role as one of them
    are labelled in advance, before they join. ``roles`` (slugs) picks the roles instead. ``known``: what
    earlier imports brought in, by (kind, NetBox id). ``device_map``: ``site/device`` → the node it is,
    for a device name two sites share.
    """
    known = known or {}
    device_map = device_map or {}
    plan = NetboxPlan(site=site, sites_read={site} if site else None)
    sites, locations, racks = _by_id(objects, "sites"), _by_id(objects, "locations"), _by_id(objects, "racks")
    panels, raw_feeds, ports, outlets, devices = (
        _by_id(objects, "power-panels"), _by_id(objects, "power-feeds"), _by_id(objects, "power-ports"),
        _by_id(objects, "power-outlets"), _by_id(objects, "devices"))
    for sid, s in sites.items():
        plan.objects.append(Imported("site", sid, _slug(s), _slug(s), str(s.get("name") or s.get("slug"))))
    rack_name = _rack_names(racks, locations, sites, known)
    for rid, rack in racks.items():
        rack_site = _slug(sites.get(_id(rack.get("site"))) or rack.get("site"))
        plan.objects.append(Imported("rack", rid, rack_site, rack_name[rid], f"{rack_site}/{rack.get('name')}"))

    site_slugs: dict[Any, str] = {}

    def site_of_device(device: Mapping[str, Any]) -> str:
        ref = device.get("site")
        key = _id(ref)
        if key not in site_slugs:
            site_slugs[key] = _slug(sites.get(key) or ref)
        return site_slugs[key]

    ports_of: dict[Any, list[dict]] = defaultdict(list)
    for port in ports.values():
        ports_of[_id(port.get("device"))].append(port)

    # The PDU inputs each feed is cabled to: from the feed's side and from the port's, cable by cable.
    inputs_of_feed: dict[int, set[int]] = defaultdict(set)
    for fid, raw in raw_feeds.items():
        if raw.get("link_peers_type") == "dcim.powerport":
            inputs_of_feed[fid].update(_id(p) for p in raw.get("link_peers") or [])
    for pid, port in ports.items():
        if port.get("link_peers_type") == "dcim.powerfeed":
            for peer in port.get("link_peers") or []:
                inputs_of_feed[_id(peer)].add(pid)

    # A PDU: a device with power outlets, or one whose input is cabled to a feed. Its name as a node's.
    pdu_devices = {_id(ports[pid].get("device")) for pids in inputs_of_feed.values() for pid in pids if pid in ports}
    pdu_devices |= {_id(o.get("device")) for o in outlets.values()}
    pdu_devices = {d for d in pdu_devices if d in devices and devices[d].get("name")}
    pdu_names = _Names("pdu", known, pdu_devices)
    for did in pdu_devices:
        pdu_names.seen(safe_name(devices[did]["name"]), site_of_device(devices[did]))
    pdu_name: dict[Any, str] = {}
    for did in sorted(pdu_devices):
        device = devices[did]
        kept = pdu_names.kept(did, f"{site_of_device(device)}/{device['name']}")
        if kept is not None:
            pdu_name[did] = pdu_names.take([kept], site_of_device(device)) or kept
    for did in sorted(pdu_devices):
        if did in pdu_name:
            continue
        plain, where = safe_name(devices[did]["name"]), site_of_device(devices[did])
        first = f"{where}.{plain}" if where and pdu_names.shared_across_sites(plain) else plain
        pdu_name[did] = pdu_names.take([first, f"{where}.{plain}" if where else "", f"{first}.{did}"], where) or f"{first}.{did}"

    found = []
    for fid, raw in sorted(raw_feeds.items()):
        panel = panels.get(_id(raw.get("power_panel"))) or raw.get("power_panel") or {}
        panel_site = _slug(sites.get(_id(panel.get("site"))) or panel.get("site"))
        pdus = sorted({pdu_name[_id(ports[p].get("device"))] for p in inputs_of_feed.get(fid, ())
                       if p in ports and _id(ports[p].get("device")) in pdu_name})
        rack = rack_name.get(_id(raw.get("rack")))
        found.append(_FoundFeed(fid, panel_site, safe_name(panel.get("name")), safe_name(raw.get("name")), raw,
                                tuple(pdus), (rack,) if rack else ()))
    _feeds(found, plan, known)
    feed_by_pdu = pure.feed_of_pdu(plan.feeds)
    kept_pdus = {p for f in found if f.ext_id in plan.kept_feeds for p in f.pdus}
    for did, name in sorted(pdu_name.items(), key=lambda kv: kv[1]):
        device = devices[did]
        feed = feed_by_pdu.get(name)
        fed = (feed is not None and feed.is_live) or name in kept_pdus
        plan.objects.append(Imported("pdu", did, site_of_device(device), name, f"{site_of_device(device)}/{device['name']}", fed))
        if feed is None and name not in kept_pdus:
            plan.unfed_pdus.append(name)

    # Which devices are nodes: those llmgw knows by name, and the devices sharing a role with one of them.
    if roles is None:
        roles = {_value(d.get("role"), "slug") for d in devices.values() if d.get("name") in nodes} - {None}
    candidates = {
        did: d for did, d in devices.items()
        if did not in pdu_devices and isinstance(d.get("name"), str)
        and (d["name"] in nodes or _value(d.get("role"), "slug") in roles or f"{site_of_device(d)}/{d['name']}" in device_map)
    }
    # A device name two sites share (here, or in an import of another site) is no node's until mapped.
    sites_of_name: dict[str, set[str]] = defaultdict(set)
    for d in candidates.values():
        sites_of_name[d["name"]].add(site_of_device(d))
    for (kind, ext_id), k in known.items():
        if kind == "device" and ext_id not in candidates and (plan.sites_read is not None and k.site not in plan.sites_read):
            sites_of_name[k.name].add(k.site)
    for did, device in sorted(candidates.items()):
        where = site_of_device(device)
        mapped = device_map.get(f"{where}/{device['name']}")
        before = known.get(("device", did))
        if mapped is not None:
            name = mapped
        elif before is not None and before.named_from == f"{where}/{device['name']}":
            name = before.name
        elif len(sites_of_name[device["name"]]) > 1:
            others = ", ".join(sorted(sites_of_name[device["name"]] - {where}))
            plan.ambiguous.append(
                f"device {device['name']} of site {where}: a device of site {others} has that name too; neither labels "
                f"node {device['name']} until one is mapped (--map {where}/{device['name']}={device['name']})"
            )
            plan.ambiguous_nodes.add(device["name"])
            continue
        else:
            name = device["name"]
        if not is_node_name(name):
            plan.skipped.append(f"device {name!r}: not a node name")
            continue
        labels = _device_labels(device, did, where, racks, locations, rack_name, row_from, ports_of, outlets,
                                pdu_name, feed_by_pdu)
        bad = [v for v in labels.values() if not all(_NAME_RE.fullmatch(p) for p in v.split(","))]
        if bad:
            plan.skipped.append(f"device {name}: {bad[0]!r} cannot be a label's value")
            continue
        if name in plan.labels:
            plan.ambiguous.append(f"device {device['name']} of site {where}: node {name} is another device's already")
            continue
        plan.labels[name] = labels
        plan.objects.append(Imported("device", did, where, name, f"{where}/{device['name']}"))
        draws = [p.get("maximum_draw") for p in ports_of.get(did, ())]
        if draws and all(isinstance(d, int | float) and not isinstance(d, bool) and d > 0 for d in draws):
            plan.max_draw[name] = float(sum(draws))
    return plan


def _device_labels(device: Mapping[str, Any], did: Any, site: str, racks: Mapping[int, dict],
                   locations: Mapping[int, dict], rack_name: Mapping[int, str], row_from: str,
                   ports_of: Mapping[Any, list[dict]], outlets: Mapping[int, dict], pdu_name: Mapping[Any, str],
                   feed_by_pdu: Mapping[str, pure.Feed]) -> dict[str, str]:
    """A node's location labels from its device: site, room, row, rack, and the PDUs and legs its PSUs
    are plugged into."""
    labels: dict[str, str] = {}
    if site:
        labels[LABEL_KEYS["site"]] = site
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
    for port in ports_of.get(did, ()):
        if port.get("link_peers_type") != "dcim.poweroutlet":
            continue
        for peer in port.get("link_peers") or []:
            outlet = outlets.get(_id(peer))
            pdu = pdu_name.get(_id(outlet.get("device"))) if outlet is not None else None
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
    return labels
