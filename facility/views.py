"""Console page of the facility: every domain's power and holds, a bar per rack and PDU, a rack map."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from agents.models import Node
from agents.views import require_operator, require_reader
from facility import feed_selectors, services
from facility.domains import LABEL_PREFIX, LEVELS
from facility.models import Feed
from facility.power import NEAR_LIMIT_SHARE, kw
from llmgw.errors import LlmgwError
from llmgw.permissions import can_operate
from placement.selectors import facility_overview

# Headroom (share of the limit still free) under which a rack is shown as near its cap, then tight.
TIGHT = 0.25


def headroom_class(domain: dict[str, Any]) -> str:
    """The colour a rack tile or bar takes: over, near (at most 1 − NEAR_LIMIT_SHARE of its limit left),
    tight (≤25%), ok, or none."""
    limit = domain["limit_watts"]
    if limit is None:
        return "none"
    if domain["over_limit"]:
        return "over"
    left = (limit - domain["use_watts"]) / limit if limit else 0
    if left <= round(1 - NEAR_LIMIT_SHARE, 9):
        return "near"
    if left <= TIGHT:
        return "tight"
    return "ok"


def watts_text(watts: float) -> str:
    """Under a kilowatt in watts (``40 W``), else in kW (``14.1 kW``): a near-cap rack never reads ``0.0 kW``."""
    return f"{watts:.0f} W" if watts < 1000 else kw(watts)


def power_bar(domain: dict[str, Any]) -> dict[str, Any]:
    """A bar drawn against the cap: use filled, the margin (limit to cap) hatched, the limit marked."""
    use = domain["use_watts"]
    cap = domain["cap_watts"]
    limit = domain["limit_watts"]
    if cap is None or limit is None:
        return {"known": False, "text": f"{kw(use)} in use, no budget"}
    scale = max(cap, use) or 1
    left = limit - use
    return {
        "known": True,
        "use_pct": round(100 * use / scale, 1),
        "limit_pct": round(100 * limit / scale, 1),
        "margin_width": round(100 * (cap - limit) / scale, 1),
        "text": f"{kw(use)} of {kw(limit)} limit ({kw(cap)} cap)",
        "left_text": f"{watts_text(abs(left))} {'left' if left >= 0 else 'over'}",
        "class": headroom_class(domain),
    }


def rack_places() -> dict[str, tuple[str, str]]:
    """Each rack's room and row, from the labels of the nodes in it (the first node that says)."""
    places: dict[str, tuple[str, str]] = {}
    for labels in Node.objects.values_list("labels", flat=True):
        rack = labels.get(LABEL_PREFIX + "rack")
        if rack and rack not in places:
            places[rack] = (labels.get(LABEL_PREFIX + "room", ""), labels.get(LABEL_PREFIX + "row", ""))
    return places


def facility_context() -> dict[str, Any]:
    overview = facility_overview()
    by_level: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for domain in overview["domains"]:
        domain["bar"] = power_bar(domain)
        domain["headroom"] = headroom_class(domain)
        by_level[domain["level"]].append(domain)
    places = rack_places()
    # The rack map: rooms, then rows, then racks, each tile coloured by its headroom.
    rooms: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rack in by_level.get("rack", []):
        room, row = places.get(rack["name"], ("", ""))
        rooms[room or "no room"][row or "no row"].append(rack)
    rack_map = [
        {"room": room, "rows": [{"row": row, "racks": racks} for row, racks in sorted(rows.items())]}
        for room, rows in sorted(rooms.items())
    ]
    return {
        "settings": overview["settings"],
        "margin_pct": f"{round(overview['settings']['margin'] * 100, 2):g}%",
        "levels": [(level, by_level[level]) for level in LEVELS if by_level.get(level)],
        "racks": by_level.get("rack", []),
        "pdus": by_level.get("pdu", []),
        "rack_map": rack_map,
        "holds": [d for d in overview["domains"] if d["hold"]],
        **feeds_context(),
    }


def feeds_context() -> dict[str, Any]:
    """Feeds with what the loss of each would pass (the page's minimal N−1 listing)."""
    if not Feed.objects.exists():
        return {"feeds": [], "feed_loss": {"text": "0 violations"}}
    loss = feed_selectors.feed_loss_report()
    by_feed = {item["feed"]: item["violations"] for item in loss["feeds"]}
    feeds = [{**f, "loss": by_feed.get(f["name"], [])} for f in feed_selectors.feeds_overview()["feeds"]]
    return {"feeds": feeds, "feed_loss": loss}


@login_required
def facility_page(request: HttpRequest, *, errors: dict[str, str] | None = None, status: int = 200) -> HttpResponse:
    """Facility: domains with nodes, use, limit, reserved and measured draw, holds; bars; the rack map."""
    require_reader(request)
    context = facility_context()
    context.update({"can_operate": can_operate(request.user), "errors": errors or {}, "values": request.POST})
    return render(request, "facility/facility.html", context, status=status)


@login_required
@require_POST
def hold_create(request: HttpRequest) -> HttpResponse:
    """Hold any domain from the facility page (facility.services.hold_create)."""
    require_operator(request)
    try:
        services.hold_create(
            domain=request.POST.get("domain", "").strip(),
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
    """Release a held domain from the facility page (facility.services.hold_release)."""
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
    from placement.whatif import what_if

    try:
        result = what_if(hold=request.POST.get("domain", "").strip(), drain=bool(request.POST.get("drain")))
    except LlmgwError as exc:
        return facility_page(request, errors={exc.field or "form": exc.message}, status=422)
    context = facility_context()
    context.update(
        {"can_operate": can_operate(request.user), "errors": {}, "values": request.POST, "what_if": result}
    )
    return render(request, "facility/facility.html", context)
