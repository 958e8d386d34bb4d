"""Console page of the facility: every domain's power and holds, worst first, a rack map, a bar per rack and
PDU, history sparklines. The live socket (agents.consumers.FacilityConsumer) renders the same partials."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from agents.models import Node
from agents.views import CAPPING_FAILURES, require_operator, require_reader
from facility import feed_selectors, selectors, services
from facility.domains import LABEL_PREFIX, LEVELS, PDU_KEY
from facility.history import recent_use
from facility.models import Feed
from facility.power import NEAR_LIMIT_SHARE, kw
from llmgw.charts import sparkline
from llmgw.errors import LlmgwError
from llmgw.permissions import can_operate
from placement import whatif
from placement.capping import capping_config, capping_rows
from placement.planner import gpus_text
from placement.selectors import facility_overview

# Headroom (share of the limit still free) under which a rack is shown as tight.
TIGHT = 0.25
# Worst first: the order of the headroom classes.
HEADROOM_ORDER = {"over": 0, "near": 1, "tight": 2, "ok": 3, "none": 4}
# Conditions (facility.conditions) that put a domain before any power figure.
CONDITION_ORDER = {"critical": 0, "hot": 0, "warning": 1, "warm": 1}


def shown_watts(watts: float) -> float:
    """The value a person reads (watts_text's rounding), so a colour never disagrees with its figure."""
    return round(watts) if abs(watts) < 1000 else round(watts / 100) * 100


def watts_text(watts: float) -> str:
    """Under a kilowatt in watts (``40 W``), else in kW (``14.1 kW``): a near-cap rack never reads ``0.0 kW``."""
    return f"{watts:.0f} W" if abs(watts) < 1000 else kw(watts)


def headroom_class(domain: Mapping[str, Any]) -> str:
    """The colour a rack tile or bar takes, from the figures as shown: over, near (less than
    1 − NEAR_LIMIT_SHARE of its limit left), tight (≤25%), ok, or none (no budget)."""
    limit = domain["limit_watts"]
    if limit is None:
        return "none"
    left = shown_watts(limit - domain["use_watts"])
    if domain["over_limit"] or left < 0:
        return "over"
    share = left / limit if limit else 0
    if share < round(1 - NEAR_LIMIT_SHARE, 9):
        return "near"
    if share <= TIGHT:
        return "tight"
    return "ok"


def power_bar(domain: Mapping[str, Any]) -> dict[str, Any]:
    """A bar drawn against the cap: use filled, the margin (limit to cap) hatched, the limit marked."""
    use = domain["use_watts"]
    cap = domain["cap_watts"]
    limit = domain["limit_watts"]
    if cap is None or limit is None:
        return {"known": False, "text": f"{kw(use)} in use, no budget", "class": "none"}
    scale = max(cap, use) or 1
    left = limit - use
    return {
        "known": True,
        "use_pct": round(100 * use / scale, 1),
        "limit_pct": round(100 * limit / scale, 1),
        "margin_width": round(100 * (cap - limit) / scale, 1),
        "text": f"{kw(use)} of {kw(limit)} limit ({kw(cap)} cap)",
        "left_text": f"{watts_text(abs(left))} {'left' if left >= 0 else 'over'}",
        "left_share": left / limit if limit else 0.0,
        "class": headroom_class(domain),
    }


def rack_places() -> tuple[dict[str, tuple[str, str]], dict[str, set[str]]]:
    """Each rack's room and row (the first node that says), and the PDUs its nodes are fed from."""
    places: dict[str, tuple[str, str]] = {}
    feeds: dict[str, set[str]] = defaultdict(set)
    for labels in Node.objects.values_list("labels", flat=True):
        rack = labels.get(LABEL_PREFIX + "rack")
        if not rack:
            continue
        if rack not in places:
            places[rack] = (labels.get(LABEL_PREFIX + "room", ""), labels.get(LABEL_PREFIX + "row", ""))
        feeds[rack].update(p.strip() for p in labels.get(PDU_KEY, "").split(",") if p.strip())
    return places, feeds


def worst_first(domain: Mapping[str, Any]) -> tuple:
    """Sort key: a bad condition first, then least headroom (over, near, tight…), held, then name."""
    condition = domain.get("condition") or {}
    state = condition.get("condition") if isinstance(condition, Mapping) else condition
    return (
        CONDITION_ORDER.get(str(state), 2),
        HEADROOM_ORDER[domain["headroom"]],
        domain["hold"] is None,
        domain["bar"].get("left_share", 1.0),
        domain["domain"],
    )


def facility_filters(params: Mapping[str, str]) -> dict[str, str]:
    """The page's filter: search text (a domain or a node name), room and row."""
    return {key: (params.get(key) or "").strip()[:100] for key in ("q", "room", "row")}


def _matches(domain: Mapping[str, Any], q: str) -> bool:
    return not q or q in domain["domain"].lower() or any(q in n.lower() for n in domain["nodes"])


def facility_context(params: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything the Facility page shows, filtered by `params` (q, room, row); the live socket renders it too."""
    filters = facility_filters(params or {})
    q = filters["q"].lower()
    overview = facility_overview()
    history = recent_use()
    places, feeds = rack_places()
    pdu_racks: dict[str, list[str]] = defaultdict(list)
    for rack, pdus in feeds.items():
        if len(pdus) > 1:
            for pdu in pdus:
                pdu_racks[pdu].append(rack)
    by_level: dict[str, list[dict[str, Any]]] = defaultdict(list)
    rooms_known: set[str] = set()
    rows_known: set[str] = set()
    for domain in overview["domains"]:
        domain["bar"] = power_bar(domain)
        domain["headroom"] = domain["bar"]["class"]
        domain["use_text"] = kw(domain["use_watts"])
        for key in ("limit", "cap", "reserved", "measured"):
            value = domain[f"{key}_watts"]
            domain[f"{key}_kw"] = None if value is None else kw(value)
        domain["spark"] = sparkline(history.get(domain["domain"], []), limit=domain["limit_watts"])
        if domain["level"] == "rack":
            room, row = places.get(domain["name"], ("", ""))
            domain["room"], domain["row"] = room or "no room", row or "no row"
            rooms_known.add(domain["room"])
            rows_known.add(domain["row"])
            if len(feeds.get(domain["name"], ())) > 1:
                domain["dual_fed"] = sorted(feeds[domain["name"]])
        if domain["level"] == "pdu" and pdu_racks.get(domain["name"]):
            domain["feeds_racks"] = sorted(pdu_racks[domain["name"]])
        if not _matches(domain, q):
            continue
        if domain["level"] == "rack" and (
            (filters["room"] and domain["room"] != filters["room"]) or (filters["row"] and domain["row"] != filters["row"])
        ):
            continue
        by_level[domain["level"]].append(domain)
    for domains in by_level.values():
        domains.sort(key=worst_first)
    # The rack map: rooms (worst room first), rows, racks worst first; a room with nothing wrong starts folded.
    rooms: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rack in by_level.get("rack", []):
        rooms[rack["room"]][rack["row"]].append(rack)
    rack_map = []
    for room, rows in rooms.items():
        racks = [r for rs in rows.values() for r in rs]
        worst = min(racks, key=worst_first)
        trouble = sum(1 for r in racks if r["headroom"] in ("over", "near") or r["hold"])
        rack_map.append(
            {
                "room": room,
                "slug": "".join(c if c.isalnum() else "-" for c in room),
                "rows": [{"row": row, "racks": rs} for row, rs in sorted(rows.items())],
                "racks": len(racks),
                "trouble": trouble,
                "open": trouble > 0 or len(rooms) == 1 or bool(q or filters["room"] or filters["row"]),
                "key": worst_first(worst),
            }
        )
    rack_map.sort(key=lambda room: (room["key"], room["room"]))
    holds = [d for d in overview["domains"] if d["hold"]]
    for d in holds:
        d["release_text"] = services.release_text(domain=d["domain"])
    return {
        "settings": overview["settings"],
        "margin_pct": f"{round(overview['settings']['margin'] * 100, 2):g}%",
        "levels": [(level, by_level[level]) for level in LEVELS if by_level.get(level)],
        "racks": by_level.get("rack", []),
        "pdus": by_level.get("pdu", []),
        "rack_map": rack_map,
        "holds": holds,
        "filters": filters,
        "filter_query": urlencode({k: v for k, v in filters.items() if v}),
        "rooms": sorted(rooms_known),
        "rows": sorted(rows_known),
        "near_pct": f"{round((1 - NEAR_LIMIT_SHARE) * 100):g}%",
        **feeds_context(),
        **conditions_context(overview),
        "capping": capping_shown(),
    }


LEVER_WORDS = {"power_limit": "power limit", "locked_clocks": "locked SM clocks"}


def capping_failures(sensors: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """What a node's agent last said it could not do (each GPU's `capping` status), by status:
    ``[{status: "not permitted", gpus: "GPUs 0-7", why: "the agent is not root, …"}]``."""
    by_status: dict[str, list[int]] = defaultdict(list)
    for gpu in (sensors or {}).get("gpus") or ():
        if gpu.get("capping"):
            by_status[gpu["capping"]].append(gpu["index"])
    return [
        {
            "status": status,
            "gpus": f"GPU{'s' if len(indexes) > 1 else ''} {gpus_text(sorted(indexes))}",
            "why": CAPPING_FAILURES.get(status, ""),
        }
        for status, indexes in sorted(by_status.items())
    ]


def capping_shown() -> dict[str, Any]:
    """The GPU capping card: off, or each node capping acts on (capped, or would cap under observe mode),
    as `llmgw ctl facility capping` lists them, with what its agent reported it could not apply."""
    config = capping_config()
    if not config.enabled:
        return {"enabled": False}
    rows = capping_rows()
    sensors = dict(Node.objects.filter(name__in=[row["node"] for row in rows]).values_list("name", "sensors"))
    for row in rows:
        row["failures"] = capping_failures(sensors.get(row["node"]))
    return {
        "enabled": True,
        "lever": LEVER_WORDS.get(config.lever, config.lever),
        "floor_pct": f"{config.floor_fraction:.0%}",
        "rows": rows,
    }


# The Facility page's timeline shows this many newest changes (all of them: ctl facility events, the API).
EVENTS_SHOWN = 20
# Domains with no fresh reading named on the page; the rest are counted.
UNKNOWN_NAMED = 12


def conditions_context(overview: Mapping[str, Any]) -> dict[str, Any]:
    """The timeline of condition changes and the data that is missing: sources down, domains with no fresh
    reading (unknown places as ok, never blocks; the page says so)."""
    events = [{**e, "at": datetime.fromisoformat(e["at"])} for e in selectors.condition_events(limit=EVENTS_SHOWN)]
    unknown = [
        d["domain"] for d in overview["domains"]
        if d["condition"]["condition"] == "unknown" and not d["condition"]["overridden"]
    ]
    return {
        "condition_events": events,
        "missing": {
            "sources": overview["sources"],
            "sources_down": [s for s in overview["sources"] if not s["up"]],
            "unknown": unknown[:UNKNOWN_NAMED],
            "unknown_count": len(unknown),
            "unknown_more": max(0, len(unknown) - UNKNOWN_NAMED),
        },
    }


def _page(request: HttpRequest, context: dict[str, Any], status: int = 200) -> HttpResponse:
    template = "facility/_facility_body.html" if request.htmx and request.method == "GET" else "facility/facility.html"
    return render(request, template, context, status=status)


def feeds_context() -> dict[str, Any]:
    """Feeds with what the loss of each would pass (the page's minimal N−1 listing)."""
    if not Feed.objects.exists():
        return {"feeds": [], "feed_loss": {"text": "0 violations"}}
    loss = feed_selectors.feed_loss_report()
    by_feed = {item["feed"]: item["violations"] for item in loss["feeds"]}
    feeds = [{**f, "loss": by_feed.get(f["name"], [])} for f in feed_selectors.feeds_overview()["feeds"]]
    return {"feeds": feeds, "feed_loss": loss}


@login_required
def facility_page(
    request: HttpRequest,
    *,
    errors: dict[str, str] | None = None,
    warnings: list[str] | None = None,
    status: int = 200,
) -> HttpResponse:
    """Facility: worst first, search and room/row filter; use, limit, reserved, measured, holds, history."""
    require_reader(request)
    context = facility_context(request.GET)
    context.update(
        {
            "can_operate": can_operate(request.user),
            "errors": errors or {},
            "warnings": warnings or [],
            "values": request.POST,
            "shed_moves": shed_moves_shown(),
        }
    )
    return _page(request, context, status=status)


def shed_moves_shown() -> list[dict[str, Any]]:
    """What shedding would do next, as `llmgw ctl facility shed --dry-run` lists it (empty while it is off)."""
    from placement.shedding import shed_plan

    return shed_plan()


def hold_warnings(domain: str, drain: bool = False) -> list[str]:
    """What a person should confirm before holding `domain`: a name no node is in (a typo?), and with a
    drain the dry run's domains past their limit and replicas that cannot move (placement.whatif)."""
    try:
        return whatif.hold_warnings(domain=domain, drain=drain)
    except LlmgwError:
        return []  # hold_create refuses it, naming the field


@login_required
@require_POST
def hold_create(request: HttpRequest) -> HttpResponse:
    """Hold any domain from the facility page (facility.services.hold_create); a name no node is in asks
    for a second, explicit confirmation first."""
    require_operator(request)
    domain = request.POST.get("domain", "").strip()
    if not request.POST.get("confirm"):
        warnings = hold_warnings(domain, bool(request.POST.get("drain")))
        if warnings:
            return facility_page(request, warnings=warnings, status=200)
    try:
        services.hold_create(
            domain=domain,
            reason=request.POST.get("reason", ""),
            drain=bool(request.POST.get("drain")),
            created_by=request.user.get_username(),
        )
    except LlmgwError as exc:
        return facility_page(request, errors={exc.field or "form": exc.message}, status=422)
    return redirect("facility")


@login_required
@require_POST
def hold_release(request: HttpRequest) -> HttpResponse:
    """Release a held domain from the facility page (facility.services.hold_release), once confirmed."""
    require_operator(request)
    try:
        services.hold_release(domain=request.POST.get("domain", ""))
    except LlmgwError as exc:
        return facility_page(request, errors={"release": exc.message}, status=422)
    return redirect("facility")


@login_required
@require_POST
def what_if_preview(request: HttpRequest) -> HttpResponse:
    """The Hold form's Preview: the hold (and drain) as a dry run, shown on the facility page; nothing written."""
    require_reader(request)
    try:
        result = whatif.what_if(hold=request.POST.get("domain", "").strip(), drain=bool(request.POST.get("drain")))
    except LlmgwError as exc:
        return facility_page(request, errors={exc.field or "form": exc.message}, status=422)
    context = facility_context()
    context.update(
        {"can_operate": can_operate(request.user), "errors": {}, "values": request.POST, "what_if": result}
    )
    return render(request, "facility/facility.html", context)
