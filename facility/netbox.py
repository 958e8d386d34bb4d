"""Import from NetBox: power feeds become ``facility.feeds`` (and so PDU and rack caps), and each device
named like a node gives it its site, room (NetBox location) and rack as store labels.

Read through pynetbox from /api/dcim/{sites,locations,racks,power-panels,power-feeds,devices}/, or
from NetBox's CSV export of power feeds (offline sites). A feed cabled to a PDU's power port
(``connected_endpoints``) supplies that PDU; otherwise it supplies its rack. NetBox's rack
utilisation sums the A and B feeds; here a rack's cap is the smaller feed's, as for any feed.
Applied all-or-nothing; ``dry_run`` computes the same diff and writes nothing.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from agents.models import Node, StoreLabel
from agents.services import labels_set
from facility import feed_services
from facility import feeds as pure
from facility.domains import LABEL_PREFIX
from facility.models import Feed, Source
from facility.signals import facility_changed
from llmgw.errors import InvalidInput

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
LABEL_KEYS = {"site": LABEL_PREFIX + "site", "room": LABEL_PREFIX + "room", "rack": LABEL_PREFIX + "rack"}


def safe_name(text: Any) -> str:
    """A NetBox name as an llmgw name: runs of other characters become '-'."""
    return _UNSAFE.sub("-", str(text or "")).strip("-")


@dataclass
class NetboxPlan:
    """What an import would set: feeds, and each node's location labels."""

    feeds: list[pure.Feed] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)


def _value(obj: Any, key: str = "value") -> Any:
    return obj.get(key) if isinstance(obj, dict) else obj


def _phase(value: Any) -> str:
    text = str(_value(value) or "").lower()
    if text.startswith("three") or text.startswith("3"):
        return "three"
    if text.startswith("single") or text.startswith("1"):
        return "single"
    raise InvalidInput(f"phase: {value!r} is neither single-phase nor three-phase", field="phase")


def _number(name: str, key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"NetBox power feed {name}: {key}: {value!r} is not a number", field="feeds") from None


def _feed(name: str, raw: dict[str, Any], pdus: list[str], rack: str | None) -> pure.Feed:
    utilization = str(raw.get("max_utilization") if raw.get("max_utilization") not in (None, "") else 80).rstrip("%")
    try:
        item = {
            "name": name,
            "voltage": _number(name, "voltage", raw.get("voltage")),
            "amperage": _number(name, "amperage", raw.get("amperage")),
            "phase": _phase(raw.get("phase")),
            "max_utilization": _number(name, "max_utilization", utilization) / 100,
            "pdus": pdus,
            "racks": [rack] if rack and not pdus else [],
        }
        return feed_services.feed_check(item)
    except InvalidInput as exc:
        if exc.message.startswith("NetBox power feed "):
            raise
        raise InvalidInput(f"NetBox power feed {name}: {exc.message}", field="feeds") from exc


def _names(feeds: list[tuple[str, str, dict, list[str], str | None]]) -> list[pure.Feed]:
    """Feeds named as in NetBox; a name two panels share is qualified by its panel (``panel.name``)."""
    counts: dict[str, int] = {}
    for _, name, *_ in feeds:
        counts[name] = counts.get(name, 0) + 1
    return [
        _feed(name if counts[name] == 1 else f"{panel}.{name}", raw, pdus, rack)
        for panel, name, raw, pdus, rack in sorted(feeds, key=lambda f: (f[1], f[0]))
    ]


def plan_from_api(api: Any, *, site: str | None = None) -> NetboxPlan:
    """Read NetBox through a pynetbox ``api``: power feeds, and devices whose name is a node's.

    NetBox refusing (a bad token, a missing endpoint) or not answering is an InvalidInput naming the URL.
    """
    import pynetbox
    import requests

    try:
        return _plan_from_api(api, site=site)
    except pynetbox.RequestError as exc:
        raise InvalidInput(f"--url: NetBox at {api.base_url} refused: {exc.error}", field="url") from exc
    except (requests.RequestException, pynetbox.ContentError) as exc:
        raise InvalidInput(f"--url: NetBox at {api.base_url} did not answer as NetBox: {exc}", field="url") from exc


def _plan_from_api(api: Any, *, site: str | None = None) -> NetboxPlan:
    dcim = api.dcim
    where = {"site": site} if site else {}
    if site and not list(dcim.sites.filter(slug=site)):
        raise InvalidInput(f"--site: NetBox has no site {site!r}", field="site")
    racks = {r.id: dict(r) for r in dcim.racks.filter(**where)} if site else {r.id: dict(r) for r in dcim.racks.all()}
    panels = dcim.power_panels.filter(**where) if site else dcim.power_panels.all()
    panel_names = {p.id: safe_name(p.name) for p in panels}
    raw_feeds = dcim.power_feeds.filter(**where) if site else dcim.power_feeds.all()
    found = []
    for record in raw_feeds:
        raw = dict(record)
        rack = raw.get("rack")
        rack_name = safe_name(racks.get(rack["id"], rack).get("name")) if isinstance(rack, dict) else None
        pdus = sorted(
            safe_name(ep["device"]["name"])
            for ep in raw.get("connected_endpoints") or []
            if isinstance(ep, dict) and isinstance(ep.get("device"), dict)
        )
        panel = raw.get("power_panel") or {}
        found.append((panel_names.get(panel.get("id"), safe_name(panel.get("name"))), safe_name(raw["name"]), raw, pdus, rack_name))
    plan = NetboxPlan(feeds=_names(found))
    nodes = set(Node.objects.values_list("name", flat=True)) | set(StoreLabel.objects.values_list("node_name", flat=True))
    devices = dcim.devices.filter(**where) if site else dcim.devices.all()
    for record in devices:
        raw = dict(record)
        if raw.get("name") not in nodes:
            continue
        labels = {}
        for level, key in (("site", "site"), ("room", "location"), ("rack", "rack")):
            obj = raw.get(key)
            if isinstance(obj, dict):
                labels[LABEL_KEYS[level]] = safe_name(obj.get("slug") if level != "rack" and obj.get("slug") else obj.get("name"))
        plan.labels[raw["name"]] = labels
    return plan


def plan_from_csv(text: str) -> NetboxPlan:
    """NetBox's CSV of power feeds (export or bulk-import form): name, power panel, rack, voltage, amperage,
    phase, max utilization. A feed's PDUs are not in it: each feeds its rack."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    found = []
    for i, row in enumerate(reader, start=2):
        row = {(k or "").strip().lower().replace(" ", "_"): (v or "").strip() for k, v in row.items()}
        try:
            found.append((safe_name(row.get("power_panel")), safe_name(row["name"]), row, [], safe_name(row.get("rack")) or None))
        except KeyError as exc:
            raise InvalidInput(f"CSV line {i}: column {exc.args[0]} is missing", field="csv") from exc
    return NetboxPlan(feeds=_names(found))


def _feed_dict(f: pure.Feed) -> dict[str, Any]:
    return {"text": f.text, "pdus": list(f.pdus), "racks": list(f.racks)}


def plan_diff(plan: NetboxPlan) -> dict[str, Any]:
    """What applying the plan changes: feeds added, changed and removed (NetBox's own), and node labels."""
    current = {f.name: f for f in feed_services.stored_feeds()}
    sources = dict(Feed.objects.values_list("name", "source"))
    new = {f.name: f for f in plan.feeds}
    diff: dict[str, Any] = {"feeds_added": [], "feeds_changed": [], "feeds_removed": [], "labels": {}}
    for name, feed in sorted(new.items()):
        if name not in current:
            diff["feeds_added"].append({"name": name, **_feed_dict(feed)})
        elif current[name] != feed:
            diff["feeds_changed"].append({"name": name, "from": _feed_dict(current[name]), "to": _feed_dict(feed)})
    diff["feeds_removed"] = sorted(n for n, s in sources.items() if s == Source.NETBOX and n not in new)
    labels_now = dict(Node.objects.values_list("name", "labels"))
    for node, labels in sorted(plan.labels.items()):
        have = labels_now.get(node) or {}
        changes = {k: v for k, v in labels.items() if have.get(k) != v}
        if changes:
            diff["labels"][node] = changes
    return diff


def netbox_import(*, plan: NetboxPlan, dry_run: bool = False) -> dict[str, Any]:
    """Apply a plan all-or-nothing (``dry_run``: only its diff). Returns the diff."""
    diff = plan_diff(plan)
    if dry_run:
        return {**diff, "applied": False}
    with transaction.atomic():
        for node, changes in diff["labels"].items():
            labels_set(node_name=node, changes=changes, set_by="netbox")
        feed_services.feeds_replace(feeds=plan.feeds, source=Source.NETBOX)
        feed_services.feed_caps_refresh()
        facility_changed.send(sender=Feed)
    return {**diff, "applied": True}


# Each request to NetBox: past this, the import is refused naming the URL (never a request left hanging).
NETBOX_TIMEOUT_SECONDS = 30


def netbox_api(*, url: str, token: str) -> Any:
    """A pynetbox client for the NetBox at ``url``, each request bounded by NETBOX_TIMEOUT_SECONDS."""
    import pynetbox
    import requests

    class BoundedSession(requests.Session):
        def request(self, *args, **kwargs):
            kwargs.setdefault("timeout", NETBOX_TIMEOUT_SECONDS)
            return super().request(*args, **kwargs)

    api = pynetbox.api(url.rstrip("/"), token=token)
    api.http_session = BoundedSession()
    return api
