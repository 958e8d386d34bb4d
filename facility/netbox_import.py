"""Import from NetBox: read it (its REST API through pynetbox, or its CSV export), show the diff, apply it.

The diff names every feed added, changed or removed, every node label the import adds, changes or
removes (only labels it set itself: an operator's label wins and is listed as kept), and every cap
that changes or disappears (``rack R-B02: no cap any more (was 5.9 kW)``). Applied all-or-nothing;
``dry_run`` computes the same diff and writes nothing. Re-importing unchanged data changes nothing.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from django.db import transaction

from agents.models import Node, StoreLabel
from agents.services import labels_set
from facility import feed_services
from facility import feeds as pure
from facility.domains import domains_of, effective_labels
from facility.models import Budget, Feed, Source
from facility.netbox import ENDPOINTS, MANAGED_KEYS, NetboxPlan, plan_from_objects
from facility.power import kw
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
            response = super().request(*args, **kwargs)
            try:
                body = outbound.read_within(
                    lambda n: response.raw.read1(n, decode_content=True),
                    deadline_at=time.monotonic() + left, max_bytes=NETBOX_MAX_BYTES, what="NetBox's answer",
                )
            except outbound.OutboundError as exc:
                response.close()
                raise requests.Timeout(str(exc)) from None
            response._content = body  # read whole within the bounds; .json() and .text read it from here
            response._content_consumed = True
            return response

    api = pynetbox.api(url.rstrip("/"), token=token)
    api.http_session = BoundedSession()
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


def objects_from_api(api: Any, *, site: str | None = None) -> dict[str, list[dict]]:
    """Every object of the endpoints a plan reads (of one site's, by its slug), as NetBox answers them."""
    import pynetbox
    import requests

    try:
        dcim = api.dcim
        if site and not list(dcim.sites.filter(slug=site)):
            raise InvalidInput(f"--site: NetBox has no site {site!r}", field="site")
        out = {}
        for name in ENDPOINTS:
            endpoint = getattr(dcim, name.replace("-", "_"))
            records = endpoint.filter(site=site) if site and name != "sites" else endpoint.all()
            out[name] = [dict(r) for r in records]
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


def plan_from_api(api: Any, *, site: str | None = None, roles: list[str] | None = None,
                  row_from: str = "location") -> NetboxPlan:
    """Read NetBox through a pynetbox ``api`` and plan the import; NetBox refusing is an InvalidInput."""
    objects = objects_from_api(api, site=site)
    return plan_from_objects(
        objects, nodes=known_nodes(), roles=set(roles) if roles else None, row_from=row_from, site=site
    )


# -- the diff -----------------------------------------------------------------------------------------------


def _feed_dict(f: pure.Feed) -> dict[str, Any]:
    return {"text": f.text, "pdus": list(f.pdus), "racks": list(f.racks), "status": f.status}


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
    # Nodes whose NetBox labels NetBox no longer gives (a device gone): only within the site imported.
    scope = set(plan.labels) | {
        n for n, labels in mine.items() if plan.site is None or labels.get(site_key) == plan.site
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


def _caps(feeds: list[pure.Feed], labels: dict[str, dict[str, str]]) -> dict[str, pure.DerivedCap]:
    by_node = []
    legs: set[str] = set()
    for node_labels in labels.values():
        levels: dict[str, list[str]] = defaultdict(list)
        for d in domains_of(node_labels):
            levels[d.level].append(d.name)
        legs.update(levels.get("leg", []))
        by_node.append(levels)
    caps = pure.derived_caps(feeds, feed_services.rack_pdus_of(by_node), legs) if feeds else {}
    return {str(d): c for d, c in caps.items()}


def _cap_changes(before: dict[str, pure.DerivedCap], after: dict[str, pure.DerivedCap]) -> list[dict[str, Any]]:
    written = dict(Budget.objects.exclude(source=Source.FEED).values_list("domain", "cap_watts"))
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
        if domain in written and new is not None:
            mine = written[domain]
            text += (f" (the written budget of {kw(mine)} holds: it is lower)" if mine < new.cap_watts
                     else f" (above it, the written budget of {kw(mine)} gives way)")
        out.append({
            "domain": domain,
            "from_watts": None if old is None else round(old.cap_watts, 1),
            "to_watts": None if new is None else round(new.cap_watts, 1),
            "text": text,
        })
    return out


def plan_diff(plan: NetboxPlan) -> dict[str, Any]:
    """What applying the plan changes: feeds, node labels and the caps they give, and what was skipped."""
    stored = feed_services.stored_feeds()
    current = {f.name: f for f in stored}
    sources = dict(Feed.objects.values_list("name", "source"))
    new = {f.name: f for f in plan.feeds}
    diff: dict[str, Any] = {"feeds_added": [], "feeds_changed": [], "feeds_removed": []}
    for name, feed in sorted(new.items()):
        if name not in current:
            diff["feeds_added"].append({"name": name, **_feed_dict(feed)})
        elif current[name] != feed:
            diff["feeds_changed"].append({"name": name, "from": _feed_dict(current[name]), "to": _feed_dict(feed)})
    diff["feeds_removed"] = sorted(n for n, s in sources.items() if s == Source.NETBOX and n not in new)
    changes, kept = _label_changes(plan)
    diff["labels"] = changes
    feeds_after = [f for f in stored if sources.get(f.name) != Source.NETBOX] + plan.feeds
    diff["caps"] = _cap_changes(
        feed_services.caps_derived(stored), _caps(feeds_after, _labels_after(changes))
    )
    diff["labels_kept"] = kept
    diff["skipped"] = list(plan.skipped)
    diff["notes"] = list(plan.notes)
    return diff


def change_count(diff: dict[str, Any]) -> int:
    """How many things an import changes: feeds, nodes relabelled and caps."""
    return sum(len(diff[k]) for k in ("feeds_added", "feeds_changed", "feeds_removed", "labels", "caps"))


def netbox_import(*, plan: NetboxPlan, dry_run: bool = False) -> dict[str, Any]:
    """Apply a plan all-or-nothing (``dry_run``: only its diff). Returns the diff."""
    if len(plan.feeds) > feed_services.MAX_FEEDS:
        raise InvalidInput(
            f"feeds: at most {feed_services.MAX_FEEDS:,} feeds, and NetBox gave {len(plan.feeds):,} (import one "
            "site at a time: site)", field="feeds",
        )
    diff = plan_diff(plan)
    if dry_run:
        return {**diff, "applied": False}
    with transaction.atomic():
        # The budgets first, then the nodes the labels lock: the guarded commit's lock order.
        feed_services.budgets_locked()
        for node, changes in diff["labels"].items():
            # Devices named before they join are NetBox's own, as many as its site has.
            labels_set(node_name=node, changes=changes, set_by=SET_BY, waiting_bound=False)
        feed_services.feeds_replace(feeds=plan.feeds, source=Source.NETBOX)
        feed_services.feed_caps_refresh()
        facility_changed.send(sender=Feed)
    return {**diff, "applied": True}
