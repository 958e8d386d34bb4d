"""Import from NetBox: read it (its REST API through pynetbox, or its CSV export), show the diff, apply it.

Kept whole (reading lives in facility.netbox and facility.netbox_csv): the diff, what waits for a yes and
the apply read one plan the same way, and a rule moved out of one would have to be kept in step with the
others.

The diff names every feed added, changed, renamed or removed, every node label the import adds, changes
or removes (only labels it set itself: an operator's label wins and is listed as kept), every domain
renamed (a rack renamed in NetBox keeps its id: its budget, hold, conditions and history follow it), and
every cap that changes or disappears (``rack R-B02: no cap any more (was 5.9 kW)``).

A cap only falls without a person: what lowers a cap, adds an object or touches nothing else is applied
at once; a cap that would rise or vanish, a feed removed, a node taken out of a rack or PDU waits for
``confirm`` (ctl's ``--yes``) and is listed as held back, the rest applied without it. ``dry_run``
computes the same diff and writes nothing. Re-importing unchanged data changes nothing. An import of one
site (``site``) adds, changes and removes that site's objects alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Any, Protocol

from django.db import connection, transaction

from agents.models import Node, StoreLabel
from agents.services import MAX_DRAW_WATTS_MAX, labels_set, node_max_draw_set, store_labels_waiting_set
from facility import feed_services
from facility import feeds as pure
from facility.domains import domains_of, effective_labels
from facility.models import Budget, DcimObject, DcimSync, Feed, Source
from facility.netbox import ENDPOINTS, MANAGED_KEYS, Known, NetboxPlan, plan_from_objects
from facility.netbox_csv import plan_from_csv
from facility.power import kw
from facility.renames import domains_rename
from facility.signals import facility_changed
from llmgw import outbound
from llmgw.errors import InvalidInput

SET_BY = "netbox"
# Each request to NetBox, and the whole read: past either, the import is refused naming the URL (never a
# request left hanging, nor one trickling its answer).
NETBOX_TIMEOUT_SECONDS = 30
NETBOX_TOTAL_SECONDS = 300
# One page of NetBox's answer (50 objects of a few KB by default).
NETBOX_MAX_BYTES = 32 * 1024 * 1024


class Progress(Protocol):
    """Told where a read of NetBox is: its phase, and the objects read so far (facility.import_jobs)."""

    def __call__(self, phase: str, *, read: int | None = None) -> None: ...


# -- reading NetBox -----------------------------------------------------------------------------------------


def netbox_api(*, url: str, token: str, total_seconds: float = NETBOX_TOTAL_SECONDS) -> Any:
    """A pynetbox client for the NetBox at ``url``: each request within NETBOX_TIMEOUT_SECONDS and
    NETBOX_MAX_BYTES, every request together within ``total_seconds``."""
    import pynetbox
    import requests

    ends_at = time.monotonic() + total_seconds

    class BoundedSession(requests.Session):
        def request(self, *args, **kwargs):
            left = min(NETBOX_TIMEOUT_SECONDS, ends_at - time.monotonic())
            if left <= 0:
                raise requests.Timeout(f"the import's {total_seconds:g} s were spent")
            kwargs["timeout"] = left
            kwargs["stream"] = True
            late = f"NetBox's answer took longer than its deadline ({left:g} s)"
            # One deadline for the whole request: connect, status line, headers and body (outbound.Deadline).
            with outbound.Deadline(left) as deadline:
                try:
                    response = super().request(*args, **kwargs)
                    body = outbound.read_within(
                        lambda n: response.raw.read1(n, decode_content=True),
                        deadline_at=deadline.at, max_bytes=NETBOX_MAX_BYTES, what="NetBox's answer",
                    )
                except outbound.OutboundError as exc:
                    response.close()
                    raise requests.Timeout(str(exc)) from None
                except Exception:
                    if deadline.expired:
                        raise requests.Timeout(late) from None
                    raise
            response._content = body  # read whole within the bounds; .json() and .text read it from here
            response._content_consumed = True
            return response

    api = pynetbox.api(url.rstrip("/"), token=token)
    api.http_session = outbound.bound_session(BoundedSession())
    return api


def _refusal(api: Any, exc: Exception) -> InvalidInput:
    """NetBox's refusal in one line; an HTML page (a wrong address) says so with the likely fix."""
    url = api.base_url.removesuffix("/api")
    response = getattr(exc, "req", None)
    kind = (response.headers.get("Content-Type", "") if response is not None else "").split(";")[0]
    if kind == "text/html" or (response is not None and response.text.lstrip()[:1] == "<"):
        hint = (
            f"; give NetBox's address without /api (--url {url.removesuffix('/api')})"
            if url.rstrip("/").endswith("/api") else "; is this NetBox's address?"
        )
        return InvalidInput(
            f"--url: {url} answered an HTML page ({response.status_code}), not NetBox's API{hint}", field="url"
        )
    if response is not None and response.status_code in (401, 403):
        return InvalidInput(f"--url: NetBox at {url} refused the token ({response.status_code})", field="url")
    detail = getattr(exc, "error", None) or str(exc)
    return InvalidInput(f"--url: NetBox at {url} refused: {str(detail).splitlines()[0][:300]}", field="url")


def objects_from_api(api: Any, *, site: str | None = None, progress: Progress | None = None) -> dict[str, list[dict]]:
    """Every object of the endpoints a plan reads (of one site's, by its slug), as NetBox answers them;
    ``progress`` is told each endpoint and the objects read so far."""
    import pynetbox
    import requests

    tell = progress or (lambda phase, *, read=None: None)
    try:
        dcim = api.dcim
        if site and not list(dcim.sites.filter(slug=site)):
            raise InvalidInput(f"--site: NetBox has no site {site!r}", field="site")
        out = {}
        read = 0
        for name in ENDPOINTS:
            endpoint = getattr(dcim, name.replace("-", "_"))
            tell(f"reading NetBox: {name}", read=read)
            records = endpoint.filter(site=site) if site and name != "sites" else endpoint.all()
            out[name] = []
            for record in records:
                out[name].append(dict(record))
                read += 1
                tell(f"reading NetBox: {name}", read=read)
        if site:
            out["sites"] = [s for s in out["sites"] if s.get("slug") == site]
        return out
    except (pynetbox.RequestError, pynetbox.ContentError) as exc:
        raise _refusal(api, exc) from exc
    except requests.RequestException as exc:
        raise InvalidInput(f"--url: NetBox at {api.base_url} did not answer: {exc}", field="url") from exc


def known_nodes() -> set[str]:
    """Every name llmgw knows: joined nodes and names labelled before they join."""
    return set(Node.objects.values_list("name", flat=True)) | set(StoreLabel.objects.values_list("node_name", flat=True))


def known_objects() -> dict[tuple[str, int], Known]:
    """What earlier imports brought in, by (kind, NetBox id)."""
    return {
        (kind, ext_id): Known(name, site, named_from)
        for kind, ext_id, name, site, named_from in DcimObject.objects.filter(source=Source.NETBOX).values_list(
            "kind", "ext_id", "name", "site", "named_from")
    }


def device_map_parse(entries: list[str] | None) -> dict[str, str]:
    """``site/device=node`` entries (ctl's ``--map``): which node a device two sites share by name is."""
    from agents.node.protocol import is_node_name

    out: dict[str, str] = {}
    for entry in entries or []:
        where, eq, node = str(entry).partition("=")
        site, slash, device = where.partition("/")
        if not (eq and slash and site and device and is_node_name(node)):
            raise InvalidInput(f"map: {entry[:100]!r} is not SITE/DEVICE=NODE (got1/gpu01=gpu01-got1)", field="map")
        out[where] = node
    return out


def plan_from_api(api: Any, *, site: str | None = None, roles: list[str] | None = None,
                  row_from: str = "location", device_map: list[str] | None = None,
                  progress: Progress | None = None) -> NetboxPlan:
    """Read NetBox through a pynetbox ``api`` and plan the import; NetBox refusing is an InvalidInput."""
    mapping = device_map_parse(device_map)
    # NetBox may take minutes to answer: the database connection this job holds goes back to the pool
    # meanwhile (another takes it), and is opened again for the plan's reads.
    if not connection.in_atomic_block:
        connection.close()
    objects = objects_from_api(api, site=site, progress=progress)
    if progress is not None:
        progress("planning", read=sum(len(v) for v in objects.values()))
    return plan_from_objects(
        objects, nodes=known_nodes(), roles=set(roles) if roles else None, row_from=row_from, site=site,
        known=known_objects(), device_map=mapping,
    )


def plan_from_export(text: str, *, default_utilization: float | None = None) -> NetboxPlan:
    """NetBox's CSV export of power feeds, named as earlier imports named its racks and feeds."""
    known = known_objects()
    racks = dict(Feed.objects.filter(source=Source.NETBOX).values_list("name", "racks"))
    feed_racks = {ext_id: racks[k.name] for (kind, ext_id), k in known.items() if kind == "feed" and k.name in racks}
    return plan_from_csv(text, default_utilization=default_utilization, known=known, feed_racks=feed_racks)


# -- the diff -----------------------------------------------------------------------------------------------


def _feed_dict(f: pure.Feed) -> dict[str, Any]:
    return {"text": f.text, "pdus": list(f.pdus), "racks": list(f.racks), "status": f.status}


def renames_of(plan: NetboxPlan) -> dict[str, str]:
    """Each domain NetBox renamed, old → new (``rack:R-B01`` → ``rack:R-B01-NEW``): the same id, another name."""
    known = known_objects()
    out = {}
    for obj in plan.objects:
        before = known.get((obj.kind, obj.ext_id))
        if before is not None and before.name != obj.name and obj.kind in ("rack", "pdu"):
            out[f"{obj.kind}:{before.name}"] = f"{obj.kind}:{obj.name}"
            if obj.kind == "pdu":
                for leg in pure.LEGS:
                    out[f"leg:{pure.leg_name(before.name, leg)}"] = f"leg:{pure.leg_name(obj.name, leg)}"
    return out


def _feed_renames(plan: NetboxPlan) -> dict[str, str]:
    known = known_objects()
    return {
        before.name: obj.name for obj in plan.objects
        if obj.kind == "feed" and (before := known.get(("feed", obj.ext_id))) is not None and before.name != obj.name
    }


def _label_changes(plan: NetboxPlan) -> tuple[dict[str, dict[str, str | None]], list[str]]:
    """Each node's label changes (None: removed) and the operator's labels kept against NetBox's word."""
    mine: dict[str, dict[str, str]] = defaultdict(dict)
    theirs: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for node, key, value, by in StoreLabel.objects.filter(key__in=MANAGED_KEYS).values_list(
        "node_name", "key", "value", "set_by"
    ):
        if by == SET_BY:
            mine[node][key] = value
        else:
            theirs[node][key] = (value, by)
    site_key = MANAGED_KEYS[0]
    # Nodes whose NetBox labels NetBox no longer gives (a device gone): only within the site imported, and
    # never a node of a device name two sites share (it waits for the operator's mapping).
    held = plan.ambiguous_nodes
    scope = set(plan.labels) | {
        n for n, labels in mine.items()
        if (plan.site is None or labels.get(site_key) == plan.site) and n not in held
    }
    changes: dict[str, dict[str, str | None]] = {}
    kept: list[str] = []
    for node in sorted(scope):
        wanted = plan.labels.get(node, {})
        change: dict[str, str | None] = {}
        for key in MANAGED_KEYS:
            want, have = wanted.get(key), mine[node].get(key)
            if key in theirs[node]:
                value, by = theirs[node][key]
                if want is not None and want != value:
                    kept.append(f"node {node}: {key}={value} kept (set by {by or 'an operator'}); NetBox says {want}")
                if have is not None:
                    change[key] = None  # an operator's label took its place: NetBox's is gone
                continue
            if want != have:
                change[key] = want
        if change:
            changes[node] = change
    return changes, kept


def _labels_after(changes: dict[str, dict[str, str | None]]) -> dict[str, dict[str, str]]:
    """Every joined node's effective labels once the changes are applied."""
    store: dict[str, dict[str, str]] = defaultdict(dict)
    for node, key, value in StoreLabel.objects.values_list("node_name", "key", "value"):
        store[node][key] = value
    out = {}
    for name, agent in Node.objects.values_list("name", "agent_labels"):
        mine = dict(store.get(name, {}))
        for key, value in changes.get(name, {}).items():
            if value is None:
                mine.pop(key, None)
            else:
                mine[key] = value
        out[name] = effective_labels(agent or {}, mine)
    return out


def _caps(feeds: list[pure.Feed], labels: dict[str, dict[str, str]], unfed: list[str]) -> dict[str, pure.DerivedCap]:
    by_node = []
    legs: set[str] = set()
    for node_labels in labels.values():
        levels: dict[str, list[str]] = defaultdict(list)
        for d in domains_of(node_labels):
            levels[d.level].append(d.name)
        legs.update(levels.get("leg", []))
        by_node.append(levels)
    caps = pure.derived_caps(feeds, feed_services.rack_pdus_of(by_node), legs, unfed) if feeds or unfed else {}
    return {str(d): c for d, c in caps.items()}


def _cap_changes(before: dict[str, pure.DerivedCap], after: dict[str, pure.DerivedCap],
                 renamed: dict[str, str]) -> list[dict[str, Any]]:
    written = {renamed.get(d, d): c for d, c in Budget.objects.exclude(source=Source.FEED).values_list("domain", "cap_watts")}
    before = {renamed.get(d, d): c for d, c in before.items()}
    out = []
    for domain in sorted(set(before) | set(after)):
        old, new = before.get(domain), after.get(domain)
        if old is not None and new is not None and abs(old.cap_watts - new.cap_watts) < 1e-6 and old.source == new.source:
            continue
        label = domain.replace(":", " ", 1)
        if new is None:
            text = f"{label}: no cap any more (was {kw(old.cap_watts)})"
        elif old is None:
            text = f"{label}: cap {kw(new.cap_watts)} (none before), from {new.source}"
        else:
            text = f"{label}: cap {kw(old.cap_watts)} -> {kw(new.cap_watts)}, from {new.source}"
        mine = written.get(domain)
        if mine is not None and new is not None:
            text += (f" (the written budget of {kw(mine)} holds: it is lower)" if mine < new.cap_watts
                     else f" (above it, the written budget of {kw(mine)} gives way)")
        out.append({
            "domain": domain,
            "from_watts": None if old is None else round(old.cap_watts, 1),
            "to_watts": None if new is None else round(new.cap_watts, 1),
            "text": text,
        })
    return out


def _in_scope(plan: NetboxPlan, name: str, site: str, new: set[str]) -> bool:
    """Whether a stored NetBox feed is this import's to change or remove: every one when it reads every
    site, else its site's (and a feed of no recorded site that the import names)."""
    return plan.site is None or site == plan.site or (not site and name in new)


def plan_diff(plan: NetboxPlan) -> dict[str, Any]:
    """What applying the plan changes: feeds, node labels and the caps they give, renames, what was skipped,
    and what waits for a person (``needs_yes``) — the lines that matter first in ``first``."""
    stored = feed_services.stored_feeds()
    current = {f.name: f for f in stored}
    rows = {name: (source, site) for name, source, site in Feed.objects.values_list("name", "source", "site")}
    feed_renamed = _feed_renames(plan)
    new = {f.name: f for f in plan.feeds}
    kept = set(plan.kept_feeds.values())
    diff: dict[str, Any] = {"feeds_added": [], "feeds_changed": [], "feeds_renamed": [], "feeds_removed": []}
    for name, feed in sorted(new.items()):
        was = next((old for old, now in feed_renamed.items() if now == name and old in current), None)
        if was is not None:
            diff["feeds_renamed"].append({"from": was, "to": name})
            if current[was] != dataclasses.replace(feed, name=was):
                diff["feeds_changed"].append({"name": name, "from": _feed_dict(current[was]), "to": _feed_dict(feed)})
        elif name not in current:
            diff["feeds_added"].append({"name": name, **_feed_dict(feed)})
        elif current[name] != feed:
            diff["feeds_changed"].append({"name": name, "from": _feed_dict(current[name]), "to": _feed_dict(feed)})
    gone_by_rename = {old for old, now in feed_renamed.items() if now in new}
    diff["feeds_removed"] = sorted(
        n for n, (source, site) in rows.items()
        if source == Source.NETBOX and n not in new and n not in kept and n not in gone_by_rename
        and _in_scope(plan, n, site, set(new))
    )
    changes, labels_kept = _label_changes(plan)
    diff["labels"] = changes
    renamed = renames_of(plan)
    diff["renamed"] = [{"from": old, "to": now} for old, now in sorted(renamed.items()) if not old.startswith("leg:")]
    feeds_after = _feeds_after(plan, stored, rows)
    unfed_after = _unfed_after(plan)
    diff["caps"] = _cap_changes(
        feed_services.caps_derived(stored), _caps(feeds_after, _labels_after(changes), unfed_after), renamed
    )
    diff["labels_kept"] = labels_kept
    diff["skipped"] = list(plan.skipped)
    diff["ambiguous"] = list(plan.ambiguous)
    diff["unfed_pdus"] = sorted(unfed_after)
    diff["notes"] = list(plan.notes)
    diff["needs_yes"] = needs_yes(diff)
    diff["first"] = _first(diff)
    return diff


def _feeds_after(plan: NetboxPlan, stored: list[pure.Feed], rows: dict[str, tuple[str, str]]) -> list[pure.Feed]:
    """Every feed once the plan is applied: others' feeds, this import's out-of-scope and kept ones, and its own."""
    new = {f.name for f in plan.feeds}
    renamed_away = {old for old, now in _feed_renames(plan).items() if now in new}
    kept = set(plan.kept_feeds.values())
    out = []
    for f in stored:
        source, site = rows.get(f.name, ("", ""))
        if f.name in new or f.name in renamed_away:
            continue
        if source != Source.NETBOX or f.name in kept or not _in_scope(plan, f.name, site, new):
            out.append(f)
    return out + plan.feeds


def _unfed_after(plan: NetboxPlan) -> list[str]:
    """The PDUs no feed reaches once the plan is applied: other sites' as recorded, this import's as found."""
    others = []
    if plan.site is not None:
        others = list(DcimObject.objects.filter(source=Source.NETBOX, kind=DcimObject.Kind.PDU, fed=False).exclude(
            site=plan.site).values_list("name", flat=True))
    return sorted(set(others) | set(plan.unfed_pdus))


def needs_yes(diff: dict[str, Any]) -> list[str]:
    """What a person must say yes to: a cap that rises or vanishes, a feed removed, a node taken out of a
    rack, row, room or PDU (its load leaves that domain's count)."""
    out = []
    for cap in diff["caps"]:
        if cap["to_watts"] is None or (cap["from_watts"] is not None and cap["to_watts"] > cap["from_watts"] + 1e-6):
            out.append(cap["text"])
    out += [f"feed {name} removed" for name in diff["feeds_removed"]]
    for node, changes in sorted(diff["labels"].items()):
        gone = sorted(k for k, v in changes.items() if v is None)
        if gone:
            out.append(f"node {node}: NetBox no longer gives {', '.join(gone)}")
    return out


def _first(diff: dict[str, Any]) -> list[str]:
    """The lines a person reads first: caps that fall below the use now, what waits for a yes, renames,
    devices two sites share, PDUs left unfed."""
    from facility.selectors import domain_uses, facility_settings

    margin = facility_settings().margin
    lines = []
    by_level: dict[str, dict] = {}
    for cap in diff["caps"]:
        if cap["to_watts"] is None:
            continue
        level, _, name = cap["domain"].partition(":")
        if level not in by_level:
            by_level[level] = domain_uses(level=level)
        figure = by_level[level].get(name)
        limit = cap["to_watts"] * (1 - margin)
        if figure is not None and figure.use_watts > limit + 1e-6:
            lines.append(
                f"{level} {name}: the new cap {kw(cap['to_watts'])} leaves a limit of {kw(limit)}, "
                f"{kw(figure.use_watts - limit)} below its use now ({kw(figure.use_watts)})"
            )
    lines += [f"waits for a yes: {text}" for text in diff["needs_yes"]]
    lines += [f"renamed: {r['from']} -> {r['to']} (its budget, hold, conditions and history follow)" for r in diff["renamed"]]
    lines += [f"renamed: feed {r['from']} -> {r['to']}" for r in diff["feeds_renamed"]]
    lines += [f"ambiguous: {text}" for text in diff["ambiguous"]]
    lines += [f"unfed: PDU {p}: no live feed reaches its input; it carries nothing" for p in diff["unfed_pdus"]]
    return lines


def change_count(diff: dict[str, Any]) -> int:
    """How many things an import changes: feeds, nodes relabelled, domains renamed and caps."""
    return sum(len(diff[k]) for k in ("feeds_added", "feeds_changed", "feeds_renamed", "feeds_removed", "labels",
                                        "caps", "renamed"))


def safe_plan(plan: NetboxPlan) -> NetboxPlan:
    """The part of a plan that needs no yes: a feed it would remove stays, one whose capacity would rise
    keeps its stored figures, and a node keeps every location label NetBox no longer gives."""
    stored = {f.name: f for f in feed_services.stored_feeds()}
    renamed = _feed_renames(plan)
    feeds = []
    for feed in plan.feeds:
        before = stored.get(feed.name) or stored.get(next((o for o, n in renamed.items() if n == feed.name), ""))
        if before is not None:
            # What it reached before it still reaches (a rack it leaves keeps its cap until the yes).
            reach = {"pdus": tuple(sorted(set(before.pdus) | set(feed.pdus))),
                     "racks": tuple(sorted(set(before.racks) | set(feed.racks)))}
            if feed.is_live and (not before.is_live or feed.capacity_watts > before.capacity_watts + 1e-6):
                feed = dataclasses.replace(before, name=feed.name, **reach)
            else:
                feed = dataclasses.replace(feed, **reach)
        feeds.append(feed)
    names = {f.name for f in feeds}
    rows = dict(Feed.objects.filter(source=Source.NETBOX).values_list("name", "site"))
    kept = dict(plan.kept_feeds)
    for name, site in rows.items():
        if name not in names and name not in renamed and _in_scope(plan, name, site, names):
            kept[-len(kept) - 1] = name  # removed in NetBox: stays until a person says yes
    out = dataclasses.replace(plan, feeds=feeds, kept_feeds=kept)
    changes, _ = _label_changes(plan)
    out.labels = {}
    for node, labels in plan.labels.items():
        out.labels[node] = dict(labels)
    mine = defaultdict(dict)
    for node, key, value in StoreLabel.objects.filter(key__in=MANAGED_KEYS, set_by=SET_BY).values_list(
            "node_name", "key", "value"):
        mine[node][key] = value
    for node, change in changes.items():
        for key, value in change.items():
            if value is None and key in mine[node]:
                out.labels.setdefault(node, {})[key] = mine[node][key]
    return out


def netbox_import(*, plan: NetboxPlan, dry_run: bool = False, confirm: bool = False) -> dict[str, Any]:
    """Apply a plan (``dry_run``: only its diff). What needs no yes is applied all-or-nothing at once; what
    does (``needs_yes``) with ``confirm`` only, else it is held back and listed. Returns the diff applied,
    with ``held_back``: what waits for a yes."""
    if len(plan.feeds) > feed_services.MAX_FEEDS:
        raise InvalidInput(
            f"feeds: at most {feed_services.MAX_FEEDS:,} feeds, and NetBox gave {len(plan.feeds):,} (import one "
            "site at a time: site)", field="feeds",
        )
    diff = plan_diff(plan)
    if dry_run:
        return {**diff, "held_back": [] if confirm else diff["needs_yes"], "applied": False, "dry_run": True}
    held: list[str] = []
    if diff["needs_yes"] and not confirm:
        held = diff["needs_yes"]
        plan = safe_plan(plan)
        diff = plan_diff(plan)
        if diff["needs_yes"]:  # what is left still moves a cap up: nothing is applied
            _sync_record(plan, held, applied=False)
            return {**diff, "held_back": held, "applied": False, "dry_run": False}
    with transaction.atomic():
        # The budgets first, then the nodes the labels lock: the lock order (llmgw.lock_order).
        feed_services.budgets_locked()
        domains_rename(renames_of(plan))
        # Devices named before they join are NetBox's own, as many as its site has: written at once; the
        # nodes that have joined one by one, their rows and domains locked.
        for node in store_labels_waiting_set(changes=diff["labels"], set_by=SET_BY):
            labels_set(node_name=node, changes=diff["labels"][node], set_by=SET_BY, waiting_bound=False)
        _feeds_write(plan)
        _objects_write(plan)
        _max_draws_write(plan)
        feed_services.feed_caps_refresh()
        _sync_record(plan, held, applied=True)
        facility_changed.send(sender=Feed)
    return {**diff, "held_back": held, "applied": True, "dry_run": False}


def _feeds_write(plan: NetboxPlan) -> None:
    """This import's feeds written, the feeds of its scope it no longer names removed (kept ones stay)."""
    keep = set(plan.kept_feeds.values())
    names = [f.name for f in plan.feeds]
    taken = dict(Feed.objects.filter(name__in=names).exclude(source=Source.NETBOX).values_list("name", "source"))
    if taken:
        name, other = sorted(taken.items())[0]
        raise InvalidInput(f"feeds: feed {name} was set by {Source(other).label}; remove it there first", field="feeds")
    gone = [n for n, site in Feed.objects.filter(source=Source.NETBOX).values_list("name", "site")
            if n not in names and n not in keep and _in_scope(plan, n, site, set(names))]
    Feed.objects.filter(name__in=gone).delete()
    fields = ("voltage", "amperage", "phase", "max_utilization", "pdus", "racks", "status", "supply", "site")
    stored = {f.name: f for f in Feed.objects.filter(name__in=names)}
    new, changed = [], []
    for feed in plan.feeds:
        values = dict(zip(fields, (feed.voltage, feed.amperage, feed.phase, feed.max_utilization, list(feed.pdus),
                                   list(feed.racks), feed.status, feed.supply, plan.feed_sites.get(feed.name, "")),
                          strict=True))
        row = stored.get(feed.name)
        if row is None:
            new.append(Feed(name=feed.name, source=Source.NETBOX, **values))
        elif any(getattr(row, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(row, k, v)
            changed.append(row)
    Feed.objects.bulk_create(new, batch_size=500)
    Feed.objects.bulk_update(changed, [*fields, "updated_at"], batch_size=500)


def _objects_write(plan: NetboxPlan) -> None:
    """What the import found, by NetBox id, for the next import to match on; what its scope no longer has goes."""
    found = {(o.kind, o.ext_id): o for o in plan.objects}
    kinds = {o.kind for o in plan.objects} | {"pdu", "rack", "feed"}
    scope = DcimObject.objects.filter(source=Source.NETBOX, kind__in=kinds)
    if plan.site is not None:
        scope = scope.filter(site=plan.site)
    kept_names = set(plan.kept_feeds.values())
    stale = [pk for pk, k, i, n in scope.values_list("pk", "kind", "ext_id", "name")
             if (k, i) not in found and not (k == "feed" and n in kept_names)]
    DcimObject.objects.filter(pk__in=stale).delete()
    if not plan.objects:
        return
    existing = {(o.kind, o.ext_id): o for o in DcimObject.objects.filter(source=Source.NETBOX, kind__in=kinds)}
    fields = ("site", "name", "named_from", "fed")
    new, changed = [], []
    for key, obj in found.items():
        values = {"site": obj.site, "name": obj.name, "named_from": obj.named_from[:600], "fed": obj.fed}
        row = existing.get(key)
        if row is None:
            new.append(DcimObject(source=Source.NETBOX, kind=obj.kind, ext_id=obj.ext_id, **values))
        elif any(getattr(row, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(row, k, v)
            changed.append(row)
    DcimObject.objects.bulk_create(new, batch_size=500)
    DcimObject.objects.bulk_update(changed, fields, batch_size=500)


def _max_draws_write(plan: NetboxPlan) -> None:
    """Each joined node's ceiling from its PSUs' maximum draw in NetBox (a reading above it is implausible)."""
    have = dict(Node.objects.filter(name__in=list(plan.max_draw)).values_list("name", "max_draw_watts"))
    for name, watts in sorted(plan.max_draw.items()):
        if name in have and have[name] != watts:
            node_max_draw_set(node_name=name, watts=min(watts, MAX_DRAW_WATTS_MAX))


def _sync_record(plan: NetboxPlan, held: list[str], *, applied: bool) -> None:
    """The site's import as it ran: when, and what waits for a yes (shown by ctl and the Facility page)."""
    from django.utils import timezone

    now = timezone.now()
    row, _ = DcimSync.objects.get_or_create(source=Source.NETBOX, site=plan.site or "")
    row.last_run_at = now
    row.last_error = ""
    if applied:
        row.last_applied_at = now
    row.pending = held[:1000]
    if not held:
        row.differs_since = None
    elif row.differs_since is None:
        row.differs_since = now
    row.save()
