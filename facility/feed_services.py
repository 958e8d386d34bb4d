"""Writes for feeds: server.yaml's ``facility.feeds``, and the caps they imply kept as Budget rows.

Derived caps are materialised: each PDU on a feed, and each rack its feeds reach, gets a Budget row
with ``source=feed`` (and ``derived_from``, the words ``ctl facility`` shows). Placement, the guarded
commit's locked budget read and every report then see one kind of cap. A budget written by a person
(server.yaml's ``budgets``, the API, the admin) is never overwritten; when it is removed, the derived
cap comes back. :func:`feed_caps_refresh` rewrites the rows when feeds, budgets or labels change.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction

from agents.models import NodeDomain
from agents.node.protocol import value_shown
from facility import feeds as pure
from facility.domains import _NAME_RE
from facility.models import Budget, DcimObject, Feed, Source
from facility.power import kw
from facility.signals import facility_changed
from llmgw.errors import InvalidInput
from llmgw.lock_order import lock_clause, rows_locked

if TYPE_CHECKING:  # PyYAML is loaded by whoever parses a file, not by every process that starts Django
    from llmgw.yamldoc import Document

FEED_KEYS = ("name", "voltage", "amperage", "phase", "max_utilization", "pdus", "racks", "status", "supply")
# Bounds a real circuit stays within: a typo (4150 V, 3200 A) is refused, not turned into a cap.
VOLTAGE_MAX = 1000
AMPERAGE_MAX = 4000
# A feed supplies at most this many PDUs and names at most this many racks: each is a cap rewritten with the
# budgets locked and counted by every facility read (100,000 held placement off for a minute, then cost
# every read of the facility seconds).
MAX_FEED_NAMES = 1000
# Feeds in one file (two to a rack: a 10,000-node site has some 800); each derives the caps of its PDUs and racks.
MAX_FEEDS = 5_000


def _number(value: Any, field: str, low: float, high: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{field}: must be a number of {what}, not {value_shown(value)}", field=field)
    if not low < value <= high:
        raise InvalidInput(f"{field}: must be more than {low:g} and at most {high:g} {what} (got {value:g})", field=field)
    return float(value)


def _names(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InvalidInput(f"{field}: must be a list of names", field=field)
    if len(value) > MAX_FEED_NAMES:
        raise InvalidInput(f"{field}: at most {MAX_FEED_NAMES:,} names, not {len(value):,}", field=field)
    out: dict[str, None] = {}  # in order, and a name looked up at once (a list of 100,000 is no 10¹⁰ steps)
    for item in value:
        if not isinstance(item, str) or not _NAME_RE.fullmatch(item) or len(item) > 253:
            raise InvalidInput(
                f"{field}: {value_shown(item)} is not a name (letters, digits, '.', '_' and '-')", field=field
            )
        if item in out:
            raise InvalidInput(f"{field}: {item} is listed twice", field=field)
        out[item] = None
    return tuple(out)


def _choice(item: dict, key: str, choices: tuple[str, ...], default: str) -> str:
    value = item.get(key, default)
    if value not in choices:
        raise InvalidInput(f"{key}: must be one of {', '.join(choices)}, not {value_shown(value)}", field=key)
    return value


def feed_check(item: Any) -> pure.Feed:
    """One feed's fields checked, or InvalidInput naming the field (``voltage``, ``pdus`` …)."""
    if not isinstance(item, dict):
        raise InvalidInput("must be a mapping with name, voltage, amperage and phase", field="")
    for key in item:
        if key not in FEED_KEYS:
            raise InvalidInput(f"{key}: unknown key; a feed takes: {', '.join(FEED_KEYS)}", field=str(key))
    for key in ("name", "voltage", "amperage", "phase"):
        if key not in item:
            raise InvalidInput(f"{key} is required", field="")
    name = item["name"]
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or len(name) > 100:
        raise InvalidInput(f"name: {value_shown(name)} is not a feed name (letters, digits, '.', '_', '-')", field="name")
    if item["phase"] not in pure.PHASES:
        raise InvalidInput(f"phase: must be single or three, not {value_shown(item['phase'])}", field="phase")
    supply = _choice(item, "supply", pure.SUPPLIES, "ac")
    status = _choice(item, "status", pure.STATUSES, "active")
    if supply == "dc" and item["phase"] != "single":
        raise InvalidInput("phase: a DC feed is single (it has no phases)", field="phase")
    pdus = _names(item.get("pdus", []), "pdus")
    racks = _names(item.get("racks", []), "racks")
    if not pdus and not racks:
        raise InvalidInput("pdus: a feed supplies at least one PDU (pdus) or rack (racks)", field="pdus")
    voltage = item["voltage"]
    if supply == "dc" and isinstance(voltage, int | float) and not isinstance(voltage, bool) and voltage < 0:
        # −48 V telecom DC: the magnitude carries the power.
        voltage = -_number(-voltage, "voltage", 0, VOLTAGE_MAX, "volts")
    else:
        voltage = _number(voltage, "voltage", 0, VOLTAGE_MAX, "volts")
    return pure.Feed(
        name=name,
        voltage=voltage,
        amperage=_number(item["amperage"], "amperage", 0, AMPERAGE_MAX, "amperes"),
        phase=item["phase"],
        max_utilization=_number(item.get("max_utilization", 0.8), "max_utilization", 0, 1, "(a share of the rating)"),
        pdus=pdus,
        racks=racks,
        status=status,
        supply=supply,
    )


def feeds_parse(doc: Document, raw: Any) -> list[pure.Feed]:
    """server.yaml's ``facility.feeds`` checked whole, or the file's line/field error."""
    if not isinstance(raw, list):
        raise doc.error(("facility", "feeds"), "must be a list of {name, voltage, amperage, phase, pdus}")
    if len(raw) > MAX_FEEDS:
        raise doc.error(("facility", "feeds"), f"at most {MAX_FEEDS:,} feeds, not {len(raw):,}")
    found: list[pure.Feed] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        path = ("facility", "feeds", i)
        try:
            feed = feed_check(item)
        except InvalidInput as exc:
            where = (*path, exc.field) if exc.field else path
            message = exc.message.split(": ", 1)[1] if exc.field else exc.message
            raise doc.error(where, message) from exc
        if feed.name in names:
            raise doc.error((*path, "name"), f"feed {feed.name} is named twice in this file")
        names.add(feed.name)
        found.append(feed)
    return found


def feeds_left_out(*, feeds: Iterable[pure.Feed], source: str) -> list[str]:
    """The feeds of ``source`` that :func:`feeds_replace` with ``feeds`` would remove, by name."""
    names = [f.name for f in feeds]
    return sorted(Feed.objects.filter(source=source).exclude(name__in=names).values_list("name", flat=True))


def feeds_replace(*, feeds: Iterable[pure.Feed], source: str) -> dict[str, Any]:
    """Make the feeds of ``source`` exactly ``feeds`` (call inside the caller's transaction)."""
    feeds = list(feeds)
    names = [f.name for f in feeds]
    taken = dict(Feed.objects.filter(name__in=names).exclude(source=source).values_list("name", "source"))
    if taken:
        name, other = sorted(taken.items())[0]
        raise InvalidInput(f"feeds: feed {name} was set by {Source(other).label}; remove it there first", field="feeds")
    created = updated = unchanged = 0
    fields = ("voltage", "amperage", "phase", "max_utilization", "pdus", "racks", "status", "supply", "source")
    stored = {row[0]: row[1:] for row in Feed.objects.filter(name__in=names).values_list("name", *fields)}
    for feed in feeds:
        values = (
            feed.voltage, feed.amperage, feed.phase, feed.max_utilization, list(feed.pdus), list(feed.racks),
            feed.status, feed.supply, source,
        )
        if stored.get(feed.name) == values:
            unchanged += 1  # as an earlier apply left it: nothing written
            continue
        _, was_created = Feed.objects.update_or_create(name=feed.name, defaults=dict(zip(fields, values, strict=True)))
        created += was_created
        updated += not was_created
    gone = Feed.objects.filter(source=source).exclude(name__in=names)
    removed = sorted(gone.values_list("name", flat=True))
    gone.delete()
    return {"created": created, "updated": updated, "unchanged": unchanged, "removed": removed}


def stored_feeds() -> list[pure.Feed]:
    """Every feed as the pure kernel takes it."""
    return [
        pure.Feed(
            f.name, f.voltage, f.amperage, f.phase, f.max_utilization, tuple(f.pdus), tuple(f.racks), f.status, f.supply
        )
        for f in Feed.objects.all()
    ]


def rack_pdus() -> dict[str, set[str]]:
    """Each rack's PDUs: those its nodes are plugged into, by their labels."""
    by_node: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for node_id, level, domain in NodeDomain.objects.filter(level__in=("rack", "pdu")).values_list(
        "node_id", "level", "domain"
    ):
        by_node[node_id][level].append(domain.split(":", 1)[1])
    return rack_pdus_of(by_node.values())


def rack_pdus_of(nodes: Iterable[Mapping[str, Iterable[str]]]) -> dict[str, set[str]]:
    """Each rack's PDUs from nodes' domains by level (``{"rack": [...], "pdu": [...]}``)."""
    out: dict[str, set[str]] = defaultdict(set)
    for levels in nodes:
        for rack in levels.get("rack", []):
            out[rack].update(levels.get("pdu", []))
    return dict(out)


def node_legs() -> set[str]:
    """Every leg a node draws from (its ``llmgw.io/leg`` domains)."""
    return {d.split(":", 1)[1] for d in NodeDomain.objects.filter(level="leg").values_list("domain", flat=True)}


def unfed_pdus() -> list[str]:
    """The PDUs a DCIM import found no live feed reaching: they carry nothing (facility.feeds.derived_caps)."""
    return sorted(DcimObject.objects.filter(kind=DcimObject.Kind.PDU, fed=False).values_list("name", flat=True))


def caps_derived(feeds: list[pure.Feed] | None = None, unfed: list[str] | None = None) -> dict[str, pure.DerivedCap]:
    """The caps the stored feeds (or ``feeds``) and unfed PDUs give, by domain text."""
    feeds = stored_feeds() if feeds is None else feeds
    unfed = unfed_pdus() if unfed is None else unfed
    caps = pure.derived_caps(feeds, rack_pdus(), node_legs(), unfed) if feeds or unfed else {}
    return {str(d): c for d, c in caps.items()}


def feed_cap_warning(budget: Budget) -> str | None:
    """``budget 8.0 kW is above feed B2's 2.9 kW``: a written cap its feeds cannot carry, or None."""
    if budget.source == Source.FEED or budget.feed_cap_watts is None or budget.feed_cap_watts >= budget.cap_watts:
        return None
    words = budget.derived_from.split()
    what = f"feed {words[1]}'s" if len(words) > 1 and words[0] == "feed" else "its feeds'"
    return f"budget {kw(budget.cap_watts)} is above {what} {kw(budget.feed_cap_watts)}"


def feed_cap_warnings() -> list[str]:
    """Every written budget above what its domain's feeds carry: ``rack:r1: budget 8.0 kW is above …``."""
    rows = Budget.objects.exclude(source=Source.FEED).filter(feed_cap_watts__isnull=False)
    return [f"{b.domain}: {w}" for b in rows if (w := feed_cap_warning(b))]


def budgets_locked() -> dict[str, Budget]:
    """Every Budget row, locked in the domains' order (inside the caller's transaction), by domain.

    A change that ends in :func:`feed_caps_refresh` (which locks every row) takes these locks first,
    before it writes a budget or locks a node: the guarded commit locks its budgets in that order and
    then its nodes, so a change holding one budget or a node while it waited for the rest could
    deadlock with a placement.
    """
    return {b.domain: b for b in rows_locked(Budget.objects.all())}


def budgets_joined_lock(*, domains: list[str], **_: Any) -> None:
    """A node is about to join ``domains`` (agents.signals.domains_joining): their budgets are locked
    for share, sorted, before the node's row, as a placement's commit takes them (budgets, then nodes).
    The relabel waits for the commits into those domains; relabels do not wait for each other. The
    budgets' trigger (migration 0005) takes the same lock for a writer that did not send the signal."""
    if connection.vendor != "postgresql" or not domains:
        return  # SQLite serialises its writers
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Budget._meta.db_table} WHERE domain = ANY(%s){lock_clause(Budget, share=True)}",
            [sorted(domains)],
        )


@transaction.atomic
def feed_caps_refresh() -> bool:
    """Rewrite the Budget rows derived from feeds; True when any changed (the caller signals it).

    Budgets people wrote win, but never above the feeds: a written cap above the derived one keeps the
    derived one beside it (``feed_cap_watts``), which then holds. Rows lock budgets only (no node), so
    this keeps the lock order (llmgw.lock_order: budgets before nodes).
    """
    existing = budgets_locked()
    caps = caps_derived()
    changed = False
    made: list[Budget] = []
    moved: list[Budget] = []
    for text, cap in sorted(caps.items()):  # by domain: a budget made takes its domain's lock in that order
        row = existing.get(text)
        if row is not None and row.source != Source.FEED:
            below = cap.cap_watts if cap.cap_watts < row.cap_watts - 1e-6 else None
            source = cap.source[:300] if below is not None else ""
            if row.feed_cap_watts != below or row.derived_from != source:
                Budget.objects.filter(pk=row.pk).update(feed_cap_watts=below, derived_from=source)
                changed = True
            continue
        if row is not None and abs(row.cap_watts - cap.cap_watts) < 1e-6 and row.derived_from == cap.source[:300]:
            continue
        if row is None:
            made.append(Budget(domain=text, cap_watts=cap.cap_watts, source=Source.FEED,
                               derived_from=cap.source[:300], feed_cap_watts=None))
        else:
            row.cap_watts, row.derived_from, row.feed_cap_watts = cap.cap_watts, cap.source[:300], None
            moved.append(row)
        changed = True
    # Written in the domains' order (each row its domain's lock, as a placement takes them), many a statement.
    Budget.objects.bulk_update(moved, ["cap_watts", "derived_from", "feed_cap_watts", "updated_at"], batch_size=500)
    Budget.objects.bulk_create(made, batch_size=500)
    stale = [d for d, b in existing.items() if b.source == Source.FEED and d not in caps]
    if stale:
        Budget.objects.filter(domain__in=stale).delete()
        changed = True
    unfed = [b.pk for d, b in existing.items() if b.source != Source.FEED and d not in caps and b.feed_cap_watts is not None]
    if unfed:
        Budget.objects.filter(pk__in=unfed).update(feed_cap_watts=None, derived_from="")
        changed = True
    return changed


def _refresh_and_signal() -> None:
    if (not Feed.objects.exists() and not Budget.objects.filter(source=Source.FEED).exists()
            and not DcimObject.objects.filter(kind=DcimObject.Kind.PDU, fed=False).exists()):
        return
    if feed_caps_refresh():
        facility_changed.send(sender=Feed)
