"""Writes to the facility: settings and budgets (server.yaml or one at a time) and holds.

The API, the console, `llmgw ctl` and the admin all call these; each change asks for a reconcile.

Kept in one module: server.yaml's facility block is checked and applied whole here (settings,
budgets, feeds, conditions, sources, shedding, capping), all or nothing in one transaction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents.node.protocol import control_character_problem, value_shown
from facility import feed_services, power
from facility.conditions import CONDITIONS, parse_conditions_config
from facility.configuration import ConfigError, parse_duration
from facility.domains import (
    LABEL_PREFIX,
    LEVELS,
    MULTI_KEYS,
    DomainError,
    clean_domain,
    nearest_names,
    parse_domain,
    parse_location_from,
)
from facility.models import (
    Budget,
    ConditionEvent,
    ConditionOverride,
    DcimObject,
    FacilitySettings,
    Feed,
    Hold,
    ScenarioRun,
    Source,
)
from facility.netbox_sync import parse_netbox_config
from facility.response import parse_capping_config, parse_shedding_config
from facility.signals import facility_changed
from facility.sources import SourcesConfig, parse_scenario, parse_sources_config
from llmgw.errors import Conflict, Forbidden, InvalidInput, NotFound
from llmgw.lock_order import rows_locked
from llmgw.plugin_names import plugin_names
from llmgw.yamldoc import Document, load_documents, load_one, read_text

SETTINGS_KEYS = ("margin", "gpu_watts", "cpu_core_watts", "node_watts")
BUDGET_KEYS = ("domain", "cap_watts", "other_watts")
# The bounds of every watts figure a person sets (budgets, settings): the API's schema states them, the
# admin, the API, ctl and server.yaml are refused in the words of _watts below.
WATTS_MAX = 100_000_000


def facility_changed_send(*, sender: type = FacilitySettings) -> None:
    """Tell the layers above (placement reconciles) that a budget, a hold or the settings changed."""
    facility_changed.send(sender=sender)


def _is_number(value: Any) -> bool:
    # An int is compared as it is: math.isfinite(10**400) raises OverflowError.
    return not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    )


def _watts(value: Any, field: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if not _is_number(value):
        raise InvalidInput(f"{field}: must be a number of watts, not {value_shown(value)}", field=field)
    if value < 0:
        raise InvalidInput(f"{field}: must not be negative (got {value_shown(value)})", field=field)
    if value > WATTS_MAX:
        raise InvalidInput(
            f"{field}: {value_shown(value)} W is more than any domain carries (at most {WATTS_MAX:,} W)",
            field=field,
        )
    return float(value) + 0.0  # -0 is 0: never shown as "-0.0 kW"


def clean_margin(value: Any, field: str = "margin") -> float:
    if not _is_number(value):
        raise InvalidInput(f"{field}: must be a number in [0, 1), not {value_shown(value)}", field=field)
    if not 0 <= value < 1:
        raise InvalidInput(
            f"{field}: must be in [0, 1) (a share of the cap kept free), got {value_shown(value)}", field=field
        )
    return float(value)


# -- server.yaml ---------------------------------------------------------------------------------------------


def _parse_block(doc: Document, key: str, parse) -> Any:
    """facility.<key> through its pure parser, its ConfigError as the file, line and path."""
    try:
        return parse(doc.data["facility"].get(key))
    except ConfigError as exc:
        raise doc.error(("facility", key, *exc.path), exc.message) from exc


def _scenario_of(doc: Document, sources: SourcesConfig, files: Mapping[str, str] | None) -> Any:
    """The simulated source's scenario file, read and checked now (relative to the server.yaml); from
    ``files`` when they were sent with it (a remote apply): then nothing is read from this machine's disk."""
    if sources.simulated_file is None:
        return None
    field = ("facility", "sources", "simulated", "file")
    if files is not None:
        path = Path(sources.simulated_file)
        if not path.is_absolute() and doc.filename != "<stdin>":
            path = Path(doc.filename).parent / path  # shown as where the sender read it
        if sources.simulated_file not in files:
            raise doc.error(field, f"{path}: not among the files sent with {doc.filename}")
        text = files[sources.simulated_file]
    else:
        path = Path(sources.simulated_file)
        if not path.is_absolute() and Path(doc.filename).is_file():
            path = Path(doc.filename).parent / path
    try:
        data = load_one(text if files is not None else read_text(path), str(path), what="scenario").data
        parse_scenario(data)
    except InvalidInput as exc:
        raise doc.error(field, exc.message) from exc
    except ValueError as exc:
        raise doc.error(field, f"{path}: {exc}") from exc
    return data


# facility.measured_window's bounds: shorter than a minute misses a prefill burst's neighbours; a day is
# longer than any use a peak has.
MEASURED_WINDOW_MIN = 60.0
MEASURED_WINDOW_MAX = 86400.0


def _measured_window(doc: Document, value: Any) -> float | None:
    """facility.measured_window as seconds (null: back to LLMGW_MEASURED_WINDOW_SECONDS)."""
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise doc.error(("facility", "measured_window"), str(exc)) from exc
    if not MEASURED_WINDOW_MIN <= seconds <= MEASURED_WINDOW_MAX:
        raise doc.error(
            ("facility", "measured_window"),
            f"{value_shown(value)} is outside 1m to 24h (the window of a node's measured peak)",
        )
    return seconds


def _parse_facility(doc: Document) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """Validate a server.yaml document whole; return (settings, budgets) or raise naming file, line, field."""
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a server.yaml is a mapping with a facility: block")
    for key in data:
        if key not in ("facility", "placement"):
            raise doc.error((key,), "unknown key; server.yaml takes: facility, placement")
    if "placement" in data:
        plugin_names(doc)
    block = data.get("facility") or {}
    if not isinstance(block, dict):
        raise doc.error(("facility",), "must be a mapping")
    known = (
        *SETTINGS_KEYS, "measured_window", "location_from", "budgets", "conditions", "sources", "feeds", "shedding",
        "capping", "netbox",
    )
    for key in block:
        if key not in known:
            raise doc.error(("facility", key), f"unknown key; facility takes: {', '.join(known)}")
    values: dict[str, float | None] = {}
    try:
        if "margin" in block:
            values["margin"] = clean_margin(block["margin"], "facility.margin")
        for key in ("gpu_watts", "cpu_core_watts", "node_watts"):
            if key in block:
                values[key] = _setting_watts(block[key], key, f"facility.{key}")
    except InvalidInput as exc:
        raise doc.error(("facility", exc.field.split(".")[-1]), exc.message.split(": ", 1)[1]) from exc
    if "measured_window" in block:
        values["measured_window_seconds"] = _measured_window(doc, block["measured_window"])
    if "location_from" in block:
        values["location_from"] = _parse_block(doc, "location_from", parse_location_from)
    budgets_raw = block.get("budgets") or []
    if not isinstance(budgets_raw, list):
        raise doc.error(("facility", "budgets"), "must be a list of {domain, cap_watts, other_watts}")
    if len(budgets_raw) > MAX_BUDGETS:
        raise doc.error(("facility", "budgets"), f"at most {MAX_BUDGETS:,} budgets, not {len(budgets_raw):,}")
    budgets: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(budgets_raw):
        path = ("facility", "budgets", i)
        if not isinstance(item, dict):
            raise doc.error(path, "must be a mapping with domain and cap_watts")
        for key in item:
            if key not in BUDGET_KEYS:
                raise doc.error((*path, key), f"unknown key; a budget takes: {', '.join(BUDGET_KEYS)}")
        for key in ("domain", "cap_watts"):
            if key not in item:
                raise doc.error(path, f"{key} is required")
        try:
            domain = str(parse_domain(item["domain"]))
        except DomainError as exc:
            raise doc.error((*path, "domain"), str(exc)) from exc
        if domain in seen:
            raise doc.error((*path, "domain"), f"{domain} has a budget already in this file")
        seen.add(domain)
        try:
            cap = _watts(item["cap_watts"], "cap_watts")
            other = _watts(item.get("other_watts", 0), "other_watts")
        except InvalidInput as exc:
            raise doc.error((*path, exc.field), exc.message.split(": ", 1)[1]) from exc
        budgets.append({"domain": domain, "cap_watts": cap, "other_watts": other})
    return values, budgets


def _refuse_new_prometheus(filename: str, sources: SourcesConfig) -> None:
    """Forbidden unless the file's Prometheus is the one in force (or none)."""
    wanted = sources.prometheus.url if sources.prometheus is not None else None
    if wanted is None:
        return
    current = parse_sources_config(FacilitySettings.load().sources or None).prometheus
    if current is None or current.url != wanted:
        raise Forbidden(
            f"{filename}: facility.sources.prometheus.url: only an admin may point the server at a "
            f"Prometheus ({wanted}) through the API; apply it on the server, or with an admin's token",
            field="text",
        )


@transaction.atomic
def facility_apply(
    *, text: str, filename: str = "server.yaml", files: Mapping[str, str] | None = None,
    may_change_sources: bool = True, confirm: bool = True,
) -> dict[str, Any]:
    """Apply a server.yaml's facility block: idempotent; the file owns the budgets it names.

    ``files``: the text of the files it names (the simulated source's scenario), sent with it by a
    remote ``llmgw ctl facility apply``; given, no file is read from this machine's disk.
    ``may_change_sources`` False (an API caller who is not an admin): a file that would point the
    server at another Prometheus is refused whole, as the server would then fetch from that address.

    When the file has a `budgets:` list, budgets an earlier apply of a file created and this list no
    longer names are removed (a file without `budgets:` changes no budget); budgets set through the
    API or the admin are left alone unless the file names their domain. Nothing is applied unless the
    whole file is valid.

    ``confirm`` False (the API and ctl, until a person says yes): a file that would remove budgets or
    feeds is refused whole, naming every one (:func:`removal_text`), as Conflict on the field ``confirm``.
    """
    docs = load_documents(text, filename)
    if len(docs) != 1:
        raise InvalidInput(f"{filename}: expected one YAML document, found {len(docs)}")
    doc = docs[0]
    values, budgets = _parse_facility(doc)
    block = doc.data.get("facility") if isinstance(doc.data, dict) else None
    owns_budgets = isinstance(block, dict) and "budgets" in block
    scenario = None
    if isinstance(block, dict):
        for key, parse in (
            ("conditions", parse_conditions_config), ("sources", parse_sources_config),
            ("shedding", parse_shedding_config), ("capping", parse_capping_config),
            ("netbox", parse_netbox_config),
        ):
            if key in block:
                parsed = _parse_block(doc, key, parse)
                values[key] = block[key] or {}
                if key == "sources":
                    if not may_change_sources:
                        _refuse_new_prometheus(filename, parsed)
                    scenario = _scenario_of(doc, parsed, files)
    # A file with `feeds:` owns the feeds it set (as with budgets); checked whole before anything is written.
    feeds = feed_services.feeds_parse(doc, block["feeds"] or []) if isinstance(block, dict) and "feeds" in block else None
    names = {b["domain"] for b in budgets}
    if not confirm:
        gone_budgets = (
            Budget.objects.filter(source=Source.FILE).exclude(domain__in=names).values_list("domain", flat=True)
            if owns_budgets else []
        )
        gone_feeds = feed_services.feeds_left_out(feeds=feeds, source=Source.FILE) if feeds is not None else []
        if gone_budgets or gone_feeds:
            raise Conflict(
                f"{filename} would remove {removal_text(budgets=gone_budgets, feeds=gone_feeds)}", field="confirm"
            )
    # The budgets first, before the nodes a location_from change locks: the lock order (llmgw.lock_order).
    feed_services.budgets_locked()
    settings = FacilitySettings.load()
    location_from = parse_location_from(settings.location_from or None)
    for key, value in values.items():
        setattr(settings, key, value)
    if values:
        settings.source = Source.FILE
        settings.save()
    if "location_from" in values and values["location_from"] != location_from:
        # Whose word each level is changed: every node's effective labels again (its domains, its conflicts).
        from agents.services import nodes_refresh_labels

        nodes_refresh_labels()
    if scenario is not None:
        scenario_start(data=scenario, speed=parse_sources_config(values["sources"]).simulated_speed, keep=True)
    created = updated = unchanged = 0
    stored = {
        b.domain: (b.cap_watts, b.other_watts, b.source, b.derived_from)
        for b in Budget.objects.filter(domain__in=names)
    }
    for item in budgets:
        values = (item["cap_watts"], item["other_watts"], Source.FILE, "")
        if stored.get(item["domain"]) == values:
            unchanged += 1  # the file as it was applied before: nothing written
            continue
        _, was_created = Budget.objects.update_or_create(
            domain=item["domain"],
            defaults=dict(zip(("cap_watts", "other_watts", "source", "derived_from"), values, strict=True)),
        )
        created += was_created
        updated += not was_created
    removed: list[str] = []
    if owns_budgets:
        gone = Budget.objects.filter(source=Source.FILE).exclude(domain__in=names)
        removed = sorted(gone.values_list("domain", flat=True))
        gone.delete()
    feeds_result: dict[str, Any] | None = None
    if feeds is not None:
        feeds_result = feed_services.feeds_replace(feeds=feeds, source=Source.FILE)
    feed_services.feed_caps_refresh()
    facility_changed_send()
    result = {
        "created": created, "updated": updated, "unchanged": unchanged, "removed": len(removed),
        "removed_domains": removed,
    }
    if feeds_result is not None:
        result["feeds"] = feeds_result
    result["warnings"] = budget_warnings(names) + feed_services.feed_cap_warnings()
    if isinstance(doc.data, dict) and "placement" in doc.data:
        # Code is loaded from the server's own file, never from a body sent to the API.
        result["warnings"].append(
            "placement.plugins: loaded from LLMGW_CONFIG when a server process starts, not by applying it"
        )
    return result


def removal_text(*, budgets: Iterable[str], feeds: Iterable[str]) -> str:
    """What an apply would remove, every name in order: ``8 budgets: rack:r1-01, …; 16 feeds: A101, …``."""
    parts = []
    for what, names in (("budget", sorted(budgets)), ("feed", sorted(feeds))):
        if names:
            parts.append(f"{len(names)} {what}{'' if len(names) == 1 else 's'}: {', '.join(names)}")
    return "; ".join(parts)


def facility_apply_file(*, path: str | Path) -> dict[str, int]:
    return facility_apply(text=read_text(path), filename=str(path))


# -- budgets and settings one at a time -------------------------------------------------------------------


def budget_check(*, domain: Any, cap_watts: Any, other_watts: Any = None) -> dict[str, Any]:
    """A budget's values checked (domain canonical, watts in bounds), or InvalidInput naming the field.

    other_watts stays None when not given: budget_set keeps the stored value then.
    """
    return {
        "domain": clean_domain(domain),
        "cap_watts": _watts(cap_watts, "cap_watts"),
        "other_watts": _watts(other_watts, "other_watts", allow_none=True),
    }


# How many of each the facility keeps. A domain no node is in yet may be budgeted, held or set by hand ahead
# of its nodes, so no count of nodes bounds them, and every listing and the console's facility page shows
# each: a 10,000-node site has some 400 racks, 800 PDUs and 2,400 legs to budget, and far fewer to hold.
MAX_BUDGETS = 10_000
MAX_HOLDS = 1_000
MAX_CONDITION_OVERRIDES = 1_000


def _one_more_check(model: Any, domain: str, bound: int, what: str) -> None:
    """InvalidInput naming ``domain`` when a new row for it would take ``model``'s past ``bound``."""
    if model.objects.filter(domain=domain).exists():
        return  # a change of one there is, not one more
    known = model.objects.count()
    if known >= bound:
        raise InvalidInput(
            f"domain: at most {bound:,} {what}, and {known:,} are set; remove one no longer needed first",
            field="domain",
        )


@transaction.atomic
def budget_set(*, domain: str, cap_watts: Any, other_watts: Any = None, source: str = Source.API) -> Budget:
    """Create or change one domain's budget; other_watts not given keeps its value (0 for a new one)."""
    values = budget_check(domain=domain, cap_watts=cap_watts, other_watts=other_watts)
    domain, cap, other = values["domain"], values["cap_watts"], values["other_watts"]
    if other is None:
        existing = Budget.objects.filter(domain=domain).values_list("other_watts", flat=True).first()
        other = existing or 0.0
    feed_services.budgets_locked()  # first: the lock order (llmgw.lock_order)
    _one_more_check(Budget, domain, MAX_BUDGETS, "budgets")
    budget, _ = Budget.objects.update_or_create(
        domain=domain,
        defaults={"cap_watts": cap, "other_watts": other, "source": source, "derived_from": "", "feed_cap_watts": None},
    )
    # A written cap above what the domain's feeds carry keeps the feeds' cap beside it (and says so).
    feed_services.feed_caps_refresh()
    budget.refresh_from_db()
    facility_changed_send()
    return budget


@transaction.atomic
def budget_delete(*, domain: str) -> None:
    domain = clean_domain(domain)
    feed_services.budgets_locked()  # first: the lock order (llmgw.lock_order)
    budget = Budget.objects.filter(domain=domain).first()
    if budget is None:
        raise NotFound(f"{domain} has no budget", field="domain")
    if budget.source == Source.FEED:
        # Removed, it would be derived again at once: saying "removed" would be untrue.
        raise InvalidInput(
            f"{domain} has no written budget to remove: its cap of {power.kw(budget.cap_watts)} comes from "
            f"{budget.derived_from}; change its feeds in server.yaml's facility.feeds to change it",
            field="domain",
        )
    budget.delete()
    # A cap derived from the feeds comes back where a written budget is removed.
    feed_services.feed_caps_refresh()
    facility_changed_send()


def settings_check(*, margin: Any, gpu_watts: Any, cpu_core_watts: Any, node_watts: Any) -> dict[str, Any]:
    """Facility settings checked (margin in [0, 1), watts in bounds or None), or InvalidInput naming the field."""
    values: dict[str, Any] = {"margin": clean_margin(margin)}
    for key, value in (("gpu_watts", gpu_watts), ("cpu_core_watts", cpu_core_watts), ("node_watts", node_watts)):
        values[key] = _setting_watts(value, key, key)
    return values


def _setting_watts(value: Any, key: str, field: str) -> float | None:
    """A settings figure in watts (None: not known), or InvalidInput naming ``field``."""
    watts = _watts(value, field, allow_none=True)
    if key == "gpu_watts" and watts == 0:
        # Counted for every card that reports no power limit: 0 W would take those out of every cap.
        raise InvalidInput(
            f"{field}: a card draws power: give what one that reports no limit draws (above 0 W), or leave it out",
            field=field,
        )
    return watts


@transaction.atomic
def settings_set(
    *, margin: Any, gpu_watts: Any, cpu_core_watts: Any, node_watts: Any, source: str = Source.API
) -> FacilitySettings:
    """Set the facility's margin and default draws (None: not assumed); asks for a reconcile."""
    values = settings_check(margin=margin, gpu_watts=gpu_watts, cpu_core_watts=cpu_core_watts, node_watts=node_watts)
    settings = FacilitySettings.load()
    for key, value in values.items():
        setattr(settings, key, value)
    settings.source = source
    settings.save()
    facility_changed_send()
    return settings


# -- holds -----------------------------------------------------------------------------------------------


def hold_check(*, domain: Any, reason: Any) -> dict[str, str]:
    """A hold's domain (canonical) and reason checked, or InvalidInput naming the field."""
    domain = clean_domain(domain)
    reason = (reason or "").strip() if isinstance(reason, str | None) else reason
    if not isinstance(reason, str) or not reason:
        raise InvalidInput("reason: say why the domain is held (it is shown with every refusal)", field="reason")
    if len(reason) > 500:
        raise InvalidInput("reason: at most 500 characters", field="reason")
    problem = control_character_problem(reason)
    if problem is not None:  # it is printed in every refusal, table and terminal that shows the hold
        raise InvalidInput(f"reason: {problem}", field="reason")
    return {"domain": domain, "reason": reason}


def known_domains() -> set[str]:
    """Every domain something names: a node's labels, a feed's PDUs and racks, a budget, a hold, a DCIM
    import's racks, PDUs and sites. A hold on any other is a typo unless said to be new."""
    from agents.models import NodeDomain

    known = set(NodeDomain.objects.values_list("domain", flat=True).distinct())
    known.update(Budget.objects.values_list("domain", flat=True))
    known.update(Hold.objects.values_list("domain", flat=True))
    for pdus, racks in Feed.objects.values_list("pdus", "racks"):
        known.update(f"pdu:{name}" for name in pdus or [] if isinstance(name, str))
        known.update(f"rack:{name}" for name in racks or [] if isinstance(name, str))
    for kind, name in DcimObject.objects.filter(kind__in=LEVELS).values_list("kind", "name"):
        known.add(name if ":" in name else f"{kind}:{name}")
    return known


def hold_domain(text: Any, *, new: bool | None = False) -> str:
    """The domain a hold names, canonical: ``rack:r1-01``, or a bare name (``r1-01``) where one known
    domain has it (its rack first, as ``nodes --domain`` reads it). A domain nothing knows (no node, feed,
    budget or DCIM import names it) is refused as the typo it likely is, unless ``new``: held ahead of
    its nodes (the API's ``new``, ctl's ``--new``). ``new`` None: the interface showed the warning and had
    it confirmed itself (the console's "Hold anyway", the admin's form). InvalidInput names ``domain``."""
    if isinstance(text, str) and ":" not in text and _BARE_NAME_RE.fullmatch(text.strip()):
        name = text.strip()
        known = known_domains()
        found = sorted(d for d in known if d.partition(":")[2] == name)
        if f"rack:{name}" in found:
            found = [f"rack:{name}"]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise InvalidInput(f"domain: {name} names {', '.join(found)}: say which (level:name)", field="domain")
        # The racks' names first, then any domain's (as a node filter's suggestions).
        nearest = (nearest_names(name, [d[5:] for d in known if d.startswith("rack:")], count=NEAREST_SHOWN)
                   or nearest_names(name, {d.partition(":")[2] for d in known}, count=NEAREST_SHOWN))
        hint = f"; known names nearest it: {', '.join(nearest)}" if nearest else ""
        raise InvalidInput(f"domain: nothing is named {name}{hint}; write level:name (rack:{name})", field="domain")
    domain = clean_domain(text)
    if new is False and domain not in known_domains():
        warning = domain_warning(domain=domain) or f"nothing names {domain} yet"
        raise InvalidInput(
            f"domain: {warning}; to hold a domain ahead of its nodes, say it is new (new: true; ctl: --new)",
            field="domain",
        )
    return domain


_BARE_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")


@transaction.atomic
def hold_create(
    *, domain: str, reason: str, drain: bool | None = None, created_by: str = "", new: bool | None = None
) -> Hold:
    """Hold a domain: nothing new is placed in it (nodes labelled into it later included); drain moves out.

    Holding a domain already held updates its reason, and its drain flag when one is given. A domain
    nothing knows needs ``new`` (:func:`hold_domain`).
    """
    if new is not None and not isinstance(new, bool):
        raise InvalidInput("new: must be true or false", field="new")
    domain = hold_domain(domain, new=new)
    values = hold_check(domain=domain, reason=reason)
    domain, reason = values["domain"], values["reason"]
    if drain is None:
        drain = bool(Hold.objects.filter(domain=domain).values_list("drain", flat=True).first())
    _lock_members(domain)
    if not isinstance(drain, bool):
        raise InvalidInput("drain: must be true or false", field="drain")
    _one_more_check(Hold, domain, MAX_HOLDS, "holds")
    hold, _ = Hold.objects.update_or_create(
        domain=domain, defaults={"reason": reason, "drain": drain, "created_by": created_by}
    )
    facility_changed_send()
    _notify_nodes_changed()
    return hold


@transaction.atomic
def hold_release(*, domain: str) -> None:
    """Undo a hold (and its drain): its nodes take placements again; moved replicas stay where they are."""
    domain = held_domain(domain)
    deleted, _ = Hold.objects.filter(domain=domain).delete()
    if not deleted:
        raise NotFound(f"{domain} is not held", field="domain")
    facility_changed_send()
    _notify_nodes_changed()


def held_domain(text: Any) -> str:
    """The held domain a release names: ``rack:r1-01``, or a bare name one hold has; NotFound naming the
    held domains nearest it when none is held by that name."""
    held = sorted(Hold.objects.values_list("domain", flat=True))
    if isinstance(text, str) and ":" not in text and _BARE_NAME_RE.fullmatch(text.strip()):
        found = [d for d in held if d.partition(":")[2] == text.strip()]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise InvalidInput(f"domain: {text.strip()} names {', '.join(found)}: say which (level:name)",
                               field="domain")
        domain = text.strip()
    else:
        domain = clean_domain(text)
    if domain not in held:
        nearest = nearest_names(domain, held, count=NEAREST_SHOWN)
        hint = f"; held nearest that name: {', '.join(nearest)}" if nearest else ""
        raise NotFound(f"{domain} is not held{hint}", field="domain")
    return domain


def _lock_members(domain: str) -> None:
    """Lock the domain's nodes (by name, as a placement does) before the hold is written: a placement on
    one of them either commits first, or waits and then sees the hold in its guarded write."""
    from agents.models import Node

    list(rows_locked(Node.objects.filter(domains__domain=domain)).values_list("id", flat=True))


def _notify_nodes_changed() -> None:
    from agents.events import nodes_changed

    transaction.on_commit(nodes_changed)


# -- warnings before saving: names nobody is in, limits a change would pass --------------------------------

# How many known names a warning offers for a name no node is in.
NEAREST_SHOWN = 2


def domain_warning(*, domain: str) -> str | None:
    """Why holding or labelling into `domain` may be a typo: no node is in it yet (nearest known names
    of its level offered), or None when nodes are in it. The API's `warning`, ctl and the console say it.

    Holding ahead of time is allowed (nodes labelled in later are held too); this only says so.
    """
    from agents.models import NodeDomain

    domain = clean_domain(domain)
    if NodeDomain.objects.filter(domain=domain).exists():
        return None
    level = domain.partition(":")[0]
    known = NodeDomain.objects.filter(level=level).values_list("domain", flat=True).distinct()
    return _nearest_text(domain, sorted(d.split(":", 1)[1] for d in known))


def budget_warnings(domains: Iterable[str]) -> list[str]:
    """``budget DOMAIN: no node is in …`` for each budget of a file whose domain no node is in while nodes
    are in others of its level (a typo: ``rack:r1-1`` for ``rack:r1-01``); a level no node is in yet (a
    site applied before its nodes join) is no typo, and says nothing. One read of every node's domains."""
    from agents.models import NodeDomain

    by_level: dict[str, set[str]] = {}
    for text in NodeDomain.objects.values_list("domain", flat=True).distinct():
        level, _, name = text.partition(":")
        by_level.setdefault(level, set()).add(name)
    warnings = []
    for domain in sorted(set(domains)):
        level, _, name = domain.partition(":")
        known = by_level.get(level)
        if known and name not in known:
            warnings.append(f"budget {domain}: {_nearest_text(domain, sorted(known))}")
    return warnings


def _nearest_text(domain: str, known: list[str]) -> str:
    """``no node is in rack r1-10 yet`` and the known names of its level nearest it."""
    level, _, name = domain.partition(":")
    nearest = nearest_names(name, known, count=NEAREST_SHOWN)
    text = f"no node is in {level} {name} yet"
    if nearest:
        text += f"; known {level}s nearest that name: {', '.join(nearest)}"
    elif not known:
        text += f"; no node is in any {level}"
    return text


def node_own_watts(*, node_name: str) -> float:
    """What a node counts for in each domain it is in (facility.power.node_use_watts), 0 when unknown."""
    from django.utils import timezone

    from agents.models import Node
    from facility.selectors import facility_settings

    node = Node.objects.filter(name=node_name).first()
    if node is None:
        return 0.0
    from agents import bookings

    placed = bookings.placed_watts([node.pk]).get(node.pk, 0.0)
    return power.node_use_watts(placed, node.fresh_measured_watts(timezone.now()), facility_settings())


def limit_warning(*, domain: str, add_watts: float) -> str | None:
    """The figures when adding `add_watts` would take `domain` past its limit, else None."""
    from facility.selectors import domain_figures

    figure = domain_figures(domain=clean_domain(domain))
    if figure.limit_watts is None or not add_watts:
        return None
    # A node moving in brings its whole term (node_watts and the larger of placed and measured).
    after = figure.use_watts + add_watts
    if not power.would_pass_limit(after, figure.limit_watts):
        return None
    return (
        f"{figure.domain.label} would be at {power.kw(after)} of its {power.kw(figure.limit_watts)} limit "
        f"({power.kw(figure.use_watts)} now + {power.kw(add_watts)}): {power.kw(after - figure.limit_watts)} over"
    )


def location_warnings(*, node_name: str, changes: dict[str, str | None]) -> list[str]:
    """What a Location… change would cause that a person should confirm: each new domain no node is in
    (a typo?) and each domain the node's draw would take past its limit."""
    from agents.models import Node, NodeDomain

    current = set(NodeDomain.objects.filter(node__name=node_name).values_list("domain", flat=True))
    own = None
    warnings: list[str] = []
    if not Node.objects.filter(name=node_name).exists():
        warnings.append(f"node {node_name} has not joined: its labels wait for it (a typo?)")
    for key, value in changes.items():
        if value is None or not key.startswith(LABEL_PREFIX) or key.removeprefix(LABEL_PREFIX) not in LEVELS:
            continue
        values = value.split(",") if key in MULTI_KEYS else [value]
        for name in values:
            domain = f"{key.removeprefix(LABEL_PREFIX)}:{name.strip()}"
            if domain in current:
                continue
            try:
                warning = domain_warning(domain=domain)
            except InvalidInput:
                continue  # labels_set refuses it, naming the field
            if warning:
                warnings.append(warning)
                continue
            if own is None:
                own = node_own_watts(node_name=node_name)
            warning = limit_warning(domain=domain, add_watts=own)
            if warning:
                warnings.append(warning)
    return warnings


def release_text(*, domain: str) -> str:
    """What releasing a hold puts back in play, for the confirmation: ``new replicas may be placed on
    rack r1-01's 4 nodes (gpu01, gpu02, gpu03, gpu04) again``."""
    from agents.models import Node

    domain = clean_domain(domain)
    level, _, name = domain.partition(":")
    nodes = sorted(Node.objects.filter(domains__domain=domain).values_list("name", flat=True))
    if not nodes:
        return f"no node is in {level} {name}: releasing changes no placement"
    shown = ", ".join(nodes[:6]) + (f" and {len(nodes) - 6} more" if len(nodes) > 6 else "")
    return f"new replicas may be placed on {level} {name}'s {len(nodes)} node{'s' if len(nodes) != 1 else ''} ({shown}) again"


# -- conditions: manual overrides and the simulated source ---------------------------------------------

MAX_OVERRIDE_SECONDS = 366 * 86_400


def condition_override_set(
    *, domain: Any, condition: Any, reason: Any, seconds: float | None = None, created_by: str = ""
) -> ConditionOverride:
    """Set a domain's condition by hand (a known probe fault), for ``seconds`` or until cleared; kept as an event."""
    values = hold_check(domain=domain, reason=reason)
    if condition not in CONDITIONS:
        raise InvalidInput(f"condition: one of {', '.join(CONDITIONS)}", field="condition")
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= MAX_OVERRIDE_SECONDS
    ):
        raise InvalidInput("for: a duration above 0, at most a year", field="for")
    now = timezone.now()
    until = now + timezone.timedelta(seconds=seconds) if seconds else None
    with transaction.atomic():
        _one_more_check(ConditionOverride, values["domain"], MAX_CONDITION_OVERRIDES, "conditions set by hand")
        override, _ = ConditionOverride.objects.update_or_create(
            domain=values["domain"],
            defaults={"condition": condition, "reason": values["reason"], "until": until, "created_by": created_by},
        )
        ConditionEvent.objects.create(
            domain=values["domain"], before=_evaluated(values["domain"]), after=condition,
            reason=f"set by hand: {values['reason']}" + (f" (by {created_by})" if created_by else ""), at=now,
        )
        facility_changed_send()
    return override


def condition_override_clear(*, domain: Any) -> None:
    """Clear a manual condition: the evaluated one counts again."""
    domain = clean_domain(domain)
    with transaction.atomic():
        override = ConditionOverride.objects.filter(domain=domain).first()
        if override is None:
            raise NotFound(f"{domain} has no condition set by hand", field="domain")
        override.delete()
        ConditionEvent.objects.create(
            domain=domain, before=override.condition, after=_evaluated(domain), reason="cleared by hand",
            at=timezone.now(),
        )
        facility_changed_send()


def _evaluated(domain: str) -> str:
    from facility.models import DomainCondition

    return DomainCondition.objects.filter(domain=domain).values_list("condition", flat=True).first() or "unknown"


def scenario_start(*, data: Any, speed: float = 1.0, keep: bool = False, started_at=None) -> ScenarioRun:
    """Replay a scenario into the simulated source from now (``keep``: leave one of that name running)."""
    try:
        scenario = parse_scenario(data)
    except ValueError as exc:
        raise InvalidInput(f"scenario: {exc}", field="scenario") from exc
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0 < speed <= 10_000:
        raise InvalidInput("speed: a number above 0, at most 10000", field="speed")
    with transaction.atomic():
        current = ScenarioRun.objects.first()
        if keep and current is not None and current.name == scenario.name:
            return current
        ScenarioRun.objects.all().delete()
        return ScenarioRun.objects.create(
            name=scenario.name, data=data, speed=float(speed), started_at=started_at or timezone.now()
        )


def scenario_stop() -> int:
    """Stop replaying: the simulated readings age out."""
    deleted, _ = ScenarioRun.objects.all().delete()
    return deleted

