"""Console page of the facility, built to be read at a thousand nodes.

Top to bottom: a summary strip (over, near, hot, warm, held, draining, racks at risk under N−1); holds and
drains, with the hold form; the rack map in physical order (room → row → rack), coloured by power, condition
or N−1 margin at the flick of a switch; one worst-first list that ranks power and heat together (domains with
a budget or a condition only, a row or room carrying its worst rack's condition), by pages; a domain's detail
with its history charts; then the condition timeline, capping, shedding and feeds.

Every domain says what llmgw does there — or, in observe mode, what enforce would do ("would refuse new
replicas", "would cap 10 nodes to 490 W"). The live socket (agents.consumers.FacilityConsumer) renders the
same fragments (:func:`facility_fragments`) and sends only those whose HTML changed.

Kept in one module: the page, its forms and its live socket render the same fragments from one read
of the overview (:func:`facility_fragments`); split, each part would read the overview again.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from agents.models import Node
from agents.views import CAPPING_FAILURES, require_operator, require_reader
from facility import console_figures, selectors
from facility.conditions import SEVERITY
from facility.domains import ROLLED_LEVELS, natural_key
from facility.feeds import rating_text
from facility.import_jobs import jobs_shown
from facility.netbox_sync import sync_waiting
from facility.power import NEAR_LIMIT_SHARE, kw
from facility.response import CappingConfig, SheddingConfig
from llmgw.errors import LlmgwError
from llmgw.permissions import can_operate
from placement import services as placement_services
from placement.capping import capping_config, capping_rows
from placement.planner import gpus_text
from placement.selectors import facility_overview
from placement.shedding import shedding_config

# Headroom (share of the limit still free) under which a rack is shown as tight.
TIGHT = 0.25
# One scale of trouble for power and heat together: worst first.
STATE_ORDER = {"hot": 0, "over": 1, "warm": 2, "near": 3, "tight": 4, "ok": 5, "none": 6, "unknown": 6}
# Levels a condition rolls up to (a row with a hot rack is not ok); the most specific level first on a tie.
LEVEL_RANK = {"rack": 0, "pdu": 1, "leg": 2, "row": 3, "room": 4, "site": 5}
# Levels the summary counts apart from racks and PDUs when they are over or near their limit.
OTHER_POWER_LEVELS = ("leg", "row", "room", "site")
# The worst-first list shows this many domains a page.
WORST_PAGE = 15
# The colourings of the rack map.
COLOURINGS = (("power", "power"), ("condition", "condition"), ("n1", "N−1 margin"))


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


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)


def rack_places(domains: list[Mapping[str, Any]]) -> tuple[dict[str, tuple[str, str]], dict[str, set[str]], dict[str, str]]:
    """From the overview's domains and their nodes (no read of its own): each rack's room and row (its first
    node's), the PDUs its nodes are fed from, and each node's rack."""
    of_node: dict[str, dict[str, str]] = defaultdict(dict)
    pdus_of_node: dict[str, set[str]] = defaultdict(set)
    for domain in domains:
        if domain["level"] in ("rack", "room", "row"):
            for node in domain["nodes"]:
                of_node[node].setdefault(domain["level"], domain["name"])
        elif domain["level"] == "pdu":
            for node in domain["nodes"]:
                pdus_of_node[node].add(domain["name"])
    places: dict[str, tuple[str, str]] = {}
    feeds: dict[str, set[str]] = defaultdict(set)
    node_racks: dict[str, str] = {}
    for node in sorted(of_node):
        where = of_node[node]
        rack = where.get("rack")
        if not rack:
            continue
        node_racks[node] = rack
        places.setdefault(rack, (where.get("room", ""), where.get("row", "")))
        feeds[rack] |= pdus_of_node.get(node, set())
    return places, feeds, node_racks


def n1_by_rack(feeds: Mapping[str, set[str]], node_racks: Mapping[str, str]) -> dict[str, Any]:
    """What the loss of one feed would do to each rack: ``{known, report, racks: {rack: [text, …]}}`` — a rack
    is at risk when a feed's loss takes it, one of its PDUs or legs past what carries it, or leaves nodes of
    it dark. Not known without feeds."""
    report, at = console_figures.feed_loss_figures()
    if report is None:
        return {"known": False, "report": {"text": "0 violations", "feeds": []}, "racks": {}, "at": at}
    pdu_racks: dict[str, set[str]] = defaultdict(set)
    for rack, pdus in feeds.items():
        for pdu in pdus:
            pdu_racks[pdu].add(rack)
    racks: dict[str, list[str]] = defaultdict(list)
    for item in report["feeds"]:
        for v in item["violations"]:
            hit: set[str] = set()
            level, _, name = (v["domain"] or "").partition(":")
            if level == "rack":
                hit.add(name)
            elif level == "pdu":
                hit |= pdu_racks.get(name, set())
            elif level == "leg":
                hit |= pdu_racks.get(name.split(".", 1)[0], set())
            hit |= {node_racks[n] for n in v["dark_nodes"] if n in node_racks}
            for rack in hit:
                if v["text"] not in racks[rack]:
                    racks[rack].append(v["text"])
    return {"known": True, "report": report, "racks": dict(racks), "at": at}


def capping_by_domain(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What capping does (or, under observe mode, would do) in each domain it acts on, from its rows
    (placement.capping.capping_rows): ``{"rack:r12-07": {"nodes": 10, "text": "would cap 10 nodes to 490 W",
    "capped": False}}``."""
    by_domain: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        # The reason names the domain first: `rack r12-07 warm`, `pdu p1 within 5% of its power limit`.
        level, _, rest = row["reason"].partition(" ")
        name = rest.split(" ", 1)[0]
        if level in LEVEL_RANK and name:
            by_domain[f"{level}:{name}"].append(row)
    out = {}
    for domain, rows in by_domain.items():
        capped = any(r["state"] == "capped" for r in rows)
        limits = sorted({r["limit"] for r in rows}, key=natural_key)
        limit = limits[0] if len(limits) == 1 else f"{limits[0]} to {limits[-1]}"
        count = f"{len(rows)} node{'s' if len(rows) != 1 else ''}"
        out[domain] = {"nodes": len(rows), "capped": capped,
                       "text": f"{'caps' if capped else 'would cap'} {count} to {limit}"}
    return out


def actions_of(domain: Mapping[str, Any], capping: Mapping[str, dict[str, Any]],
               shedding: SheddingConfig | None = None) -> list[str]:
    """What llmgw does in a domain because of its condition and power — or, in observe mode, what enforce
    would do: ``would refuse new replicas``, ``would shed a replica every 5 min after 10 min hot``, ``would cap
    10 nodes to 490 W``. Shedding as placement.shedding judges it: a domain past its power limit is shed
    whatever the mode, a hot one under enforce only; only where ``facility.shedding`` is on for the domain."""
    condition = domain["condition"]
    state = condition["condition"]
    enforce = condition.get("mode") == "enforce"
    out = []
    if domain["headroom"] == "over":
        out.append("refuses new replicas: past its power limit")
    if state == "hot":
        out.append("refuses new replicas" if enforce else "would refuse new replicas")
    elif state == "warm":
        out.append("places new replicas elsewhere first" if enforce else "would place new replicas elsewhere first")
    rule = shedding.rule(domain["domain"]) if shedding is not None else None
    if rule is not None and rule.enabled:
        pace = f"a replica every {_short_duration(rule.interval)} after {_short_duration(rule.shed_after)}"
        if domain["over_limit"]:
            out.append(f"sheds {pace} past its power limit")
        elif state == "hot":
            out.append(f"sheds {pace} hot" if enforce else f"would shed {pace} hot")
    capped = capping.get(domain["domain"])
    if capped is not None:
        out.append(capped["text"])
    return out


def _short_duration(seconds: float) -> str:
    """``90 s``, ``10 min``, ``1.5 h``: a shedding rule's pace in words."""
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def inlet_shown(condition: Mapping[str, Any]) -> dict[str, Any] | None:
    """The latest inlet reading as the page shows it (the age and the time above the edge count up live)."""
    inlet = condition.get("inlet")
    if not inlet:
        return None
    state = condition["condition"]
    return {
        **inlet,
        "text": f"{inlet['celsius']:.1f} °C",
        "class": "hot" if inlet["celsius"] > inlet["hot_c"] else "warm" if inlet["celsius"] > inlet["warm_c"] else "",
        "edge": inlet["hot_c"] if state == "hot" else inlet["warm_c"] if state == "warm" else None,
    }


def decorate(domain: dict[str, Any], capping: Mapping[str, dict[str, Any]],
             shedding: SheddingConfig | None = None) -> dict[str, Any]:
    """A domain row of the overview with what the page shows of it (figures in kW, bar, inlet, actions)."""
    domain["bar"] = power_bar(domain)
    domain["headroom"] = domain["bar"]["class"]
    domain["use_text"] = kw(domain["use_watts"])
    for key in ("limit", "cap", "reserved", "measured"):
        value = domain[f"{key}_watts"]
        domain[f"{key}_kw"] = None if value is None else kw(value)
    domain["cond"] = domain["condition"]["condition"]
    domain["rolled"] = domain["cond"]  # a row's, room's or site's: the worst of its own and its racks'
    domain["rolled_from"] = ""
    domain["inlet"] = inlet_shown(domain["condition"])
    domain["observe"] = domain["condition"].get("mode") == "observe"
    domain["actions"] = actions_of(domain, capping, shedding)
    domain["slug"] = f"{domain['level']}-{slug(domain['name'])}"
    return domain


def domain_state(domain: Mapping[str, Any]) -> str:
    """Power and heat on one scale: hot, over, warm, near, tight, ok (none: no budget and no condition)."""
    heat = domain["rolled"] if domain["rolled"] in ("hot", "warm") else None
    power = domain["headroom"] if domain["headroom"] != "none" else None
    known = [s for s in (heat, power) if s is not None]
    if not known:
        return "ok" if domain["rolled"] == "ok" else "none"
    return min(known, key=lambda s: STATE_ORDER[s])


def worst_key(domain: Mapping[str, Any]) -> tuple:
    """Worst first: the state (hot, over, warm, near, tight, ok), held first, the most specific level, the
    least left, then the name."""
    return (
        STATE_ORDER[domain["state"]],
        domain["hold"] is None,
        LEVEL_RANK.get(domain["level"], 9),
        domain["bar"].get("left_share", 1.0),
        natural_key(domain["name"]),
    )


def roll_up(domains: list[dict[str, Any]], node_racks: Mapping[str, str]) -> None:
    """A row's, room's and site's condition is the worst of its own and its racks' (a row with a hot rack is
    not ok), with the rack that gives it (``rolled_from``), as the overview rolled it up (``rolled_up``);
    and its racks' worst (``racks_worst``)."""
    racks = {d["name"]: d for d in domains if d["level"] == "rack"}
    for domain in domains:
        if domain["level"] not in ROLLED_LEVELS:
            continue
        inside = [racks[name] for name in {node_racks[n] for n in domain["nodes"] if n in node_racks} if name in racks]
        domain["racks_worst"] = max((r["cond"] for r in inside), key=lambda c: SEVERITY.get(c, 0), default="unknown")
        rolled = domain.get("rolled_up")
        if rolled is not None:
            domain["rolled"], domain["rolled_from"] = rolled["condition"], rolled["from"]


def facility_filters(params: Mapping[str, str]) -> dict[str, str]:
    """The page's filter: search text (a domain or a node name), room and row; the worst-first list's page."""
    found = {key: (params.get(key) or "").strip()[:100] for key in ("q", "room", "row")}
    page = (params.get("page") or "").strip()
    found["page"] = page if page.isdigit() else ""
    return found


def _matches(domain: Mapping[str, Any], q: str) -> bool:
    return not q or q in domain["domain"].lower() or any(q in n.lower() for n in domain["nodes"])


def summary_of(domains: list[dict[str, Any]], n1: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The strip at the top: how many domains are over, near, hot, warm, held, draining, and racks at risk
    under N−1, each with the names (the first few) it counts. Heat counts the most specific domain: a hot rack
    is one hot domain, not also its row, room and site."""
    def heat(state: str) -> list[str]:
        return [
            d["domain"] for d in domains
            if d["cond"] == state
            and not (d["level"] in ROLLED_LEVELS and SEVERITY.get(d.get("racks_worst", "unknown"), 0) >= SEVERITY[state])
        ]

    def power(state: str, levels: tuple[str, ...]) -> list[str]:
        return [d["domain"] for d in domains if d["headroom"] == state and d["level"] in levels]

    # Racks and PDUs counted apart (a PDU over its limit is not another rack over); rows, rooms and the site
    # only when one of them is.
    groups = []
    for state, words in (("over", "over their power limit"), ("near", "near their power limit")):
        others = power(state, OTHER_POWER_LEVELS)
        groups += [
            (state, f"rack{{s}} {state}", f"racks {words}", power(state, ("rack",))),
            (f"pdu-{state}", f"PDU{{s}} {state}", f"PDUs {words}", power(state, ("pdu",))),
            *([(f"other-{state}", f"other domain{{s}} {state}", f"rows, rooms or legs {words}", others)]
              if others else []),
        ]
    groups += [
        ("hot", "hot", "hot", heat("hot")),
        ("warm", "warm", "warm", heat("warm")),
        ("held", "held", "held", [d["domain"] for d in domains if d["hold"]]),
        ("draining", "draining", "draining", [d["domain"] for d in domains if d["hold"] and d["hold"]["drain"]]),
        ("n1", "at risk under N−1", "racks that the loss of one feed takes past what carries them",
         [f"rack:{r}" for r in sorted(n1["racks"], key=natural_key)]),
    ]
    out = []
    for key, label, title, names in groups:
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        out.append({"key": key, "label": label.format(s="" if len(names) == 1 else "s"), "count": len(names),
                    "title": f"{title}: {shown}" if names else f"none {title}"})
    if not n1["known"]:
        out[-1].update(count=None, title="no feeds known: N−1 is not judged")
    return out


def facility_context(params: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything the Facility page shows, filtered by `params` (q, room, row, page); the socket renders it too."""
    filters = facility_filters(params or {})
    q = filters["q"].lower()
    overview = facility_overview()
    places, feeds, node_racks = rack_places(overview["domains"])
    config = capping_config()
    cap_rows = capping_rows() if config.enabled else []  # read once: the card and each domain's words
    capping = capping_by_domain(cap_rows)
    n1 = n1_by_rack(feeds, node_racks)
    shedding = shedding_config()
    domains = [decorate(d, capping, shedding) for d in overview["domains"]]
    roll_up(domains, node_racks)
    for d in domains:
        d["state"] = domain_state(d)
        d["folded"] = []
        if d["level"] == "rack":
            room, row = places.get(d["name"], ("", ""))
            d["room"], d["row"] = room or "no room", row or "no row"
            d["n1"] = "risk" if d["name"] in n1["racks"] else "ok" if n1["known"] else "unknown"
            d["n1_texts"] = n1["racks"].get(d["name"], [])
            if len(feeds.get(d["name"], ())) > 1:
                d["dual_fed"] = sorted(feeds[d["name"]])
    by_name = {d["domain"]: d for d in domains}

    def shown(d: Mapping[str, Any]) -> bool:
        if not _matches(d, q):
            return False
        if d["level"] == "rack" and (
            (filters["room"] and d["room"] != filters["room"]) or (filters["row"] and d["row"] != filters["row"])
        ):
            return False
        return True

    # The rack map, as the racks stand: rooms, rows, racks by name (r2 before r10).
    rooms: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for d in domains:
        if d["level"] == "rack" and shown(d):
            rooms[d["room"]][d["row"]].append(d)
    rack_map = []
    for room in sorted(rooms, key=natural_key):
        rows = []
        for row in sorted(rooms[room], key=natural_key):
            racks = sorted(rooms[room][row], key=lambda r: natural_key(r["name"]))
            own = by_name.get(f"row:{row}")
            rows.append({"row": row, "slug": slug(f"{room}-{row}"), "racks": racks, "domain": own,
                         "rolled": worst_of(racks, own), "power": power_worst(racks, own),
                         "counts": counts_of(racks)})
        all_racks = [r for row in rows for r in row["racks"]]
        own = by_name.get(f"room:{room}")
        rack_map.append({"room": room, "slug": slug(room), "rows": rows, "racks": len(all_racks), "domain": own,
                         "rolled": worst_of(all_racks, own), "power": power_worst(all_racks, own),
                         "counts": counts_of(all_racks)})
    # One worst-first list: power and heat together, only domains with a budget or a condition (or a hold).
    fold_roll_ups(domains, by_name)
    ranked = sorted(
        (
            d for d in domains
            if shown(d) and (
                d["limit_watts"] is not None or d["hold"]
                or (d["cond"] if d.get("folded_into") else d["rolled"]) != "unknown"
            )
        ),
        key=worst_key,
    )
    paginator = Paginator(ranked, WORST_PAGE)
    page = paginator.get_page(filters["page"] or 1)
    holds = [d for d in domains if d["hold"]]
    for d in holds:
        d["release_text"] = release_text(d["domain"])
    settings = overview["settings"]
    window = settings.get("measured_window_seconds")
    observe = sorted({d["condition"].get("mode") for d in domains if d["condition"].get("mode")})
    return {
        "settings": settings,
        "margin_pct": f"{round(settings['margin'] * 100, 2):g}%",
        "window_text": _duration(window) if window else "the measured window",
        "modes": observe,
        "summary": summary_of(domains, n1),
        "stale": stale_of(domains),
        "netbox_waiting": sync_waiting(),
        "netbox_jobs": jobs_shown(),
        "rack_map": rack_map,
        "racks_shown": sum(room["racks"] for room in rack_map),
        "worst": page,
        "worst_total": len(ranked),
        "holds": holds,
        "filters": filters,
        "filter_query": urlencode({k: v for k, v in filters.items() if v}),
        "page_query": urlencode({k: v for k, v in filters.items() if v and k != "page"}),
        "rooms": sorted({d["room"] for d in domains if d["level"] == "rack"}, key=natural_key),
        "rows": sorted({d["row"] for d in domains if d["level"] == "rack"}, key=natural_key),
        "near_pct": f"{round((1 - NEAR_LIMIT_SHARE) * 100):g}%",
        "colourings": COLOURINGS,
        "n1": n1,
        "domains_by_name": by_name,
        **feeds_context(n1),
        **conditions_context(overview),
        "capping": capping_shown(config, cap_rows),
    }


def fold_roll_ups(domains: list[dict[str, Any]], by_name: Mapping[str, dict[str, Any]]) -> None:
    """A row's, room's or site's heat that comes from one of its racks is listed once, with that rack: the
    rack names them (``folded``, the most specific first) and each is ranked for its own figures and its own
    condition only (``folded_into``: the rack; left out of the list with neither a budget nor a condition)."""
    for d in domains:
        if d["level"] not in ROLLED_LEVELS or not d["rolled_from"].startswith("rack "):
            continue
        rack = by_name.get(f"rack:{d['rolled_from'][len('rack '):]}")
        if rack is None:
            continue
        rack["folded"].append(d)
        d["folded_into"] = rack["domain"]
        d["state"] = domain_state({**d, "rolled": d["cond"]})
    for d in domains:
        d["folded"].sort(key=lambda f: LEVEL_RANK.get(f["level"], 9))


# Power on one scale, worst first, for a row's or room's heading.
POWER_RANK = {"over": 0, "near": 1, "tight": 2, "ok": 3}


def power_worst(racks: list[Mapping[str, Any]], own: Mapping[str, Any] | None) -> dict[str, str]:
    """A row's or room's power for its heading: the worst of its own budget's and its racks' (``over``,
    ``near``, ``tight``, ``ok``; ``none`` without a budget anywhere), and where from."""
    state, where = (own["headroom"], "its own budget") if own and own["headroom"] in POWER_RANK else ("none", "")
    for rack in racks:
        if rack["headroom"] in POWER_RANK and (state == "none" or POWER_RANK[rack["headroom"]] < POWER_RANK[state]):
            state, where = rack["headroom"], f"rack {rack['name']}"
    return {"state": state, "from": where}


# The stale banner names this many domains; the rest are counted.
STALE_NAMED = 8


def stale_of(domains: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The domains whose condition was judged longer ago than the evaluation's bound (the evaluation has
    stopped: each shows what was judged last), the first STALE_NAMED named, and the oldest judgement's time
    (epoch seconds); None when every condition is fresh."""
    found = sorted((d for d in domains if d["condition"].get("stale")), key=lambda d: d["condition"]["judged_at"])
    if not found:
        return None
    return {
        "count": len(found),
        "names": [d["domain"] for d in found[:STALE_NAMED]],
        "more": max(0, len(found) - STALE_NAMED),
        "oldest": found[0]["condition"]["judged_at"],
    }


def worst_of(racks: list[Mapping[str, Any]], own: Mapping[str, Any] | None) -> dict[str, str]:
    """A row's or room's condition for its label on the map: the worst of its own and its racks', and where from."""
    condition, where = (own["cond"], "") if own else ("unknown", "")
    for rack in racks:
        if SEVERITY.get(rack["cond"], 0) > SEVERITY.get(condition, 0):
            condition, where = rack["cond"], f"rack {rack['name']}"
    return {"condition": condition, "from": where}


def counts_of(racks: list[Mapping[str, Any]]) -> str:
    """``2 over · 1 near · 1 held`` for a room's heading (empty when nothing is wrong)."""
    parts = []
    for key, test in (("over", lambda r: r["headroom"] == "over"), ("near", lambda r: r["headroom"] == "near"),
                      ("held", lambda r: r["hold"]), ("at risk under N−1", lambda r: r.get("n1") == "risk")):
        n = sum(1 for r in racks if test(r))
        if n:
            parts.append(f"{n} {key}")
    return " · ".join(parts)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} seconds"


def release_text(domain: str) -> str:
    try:
        return placement_services.release_preview(domain=domain)
    except LlmgwError as exc:
        return exc.message


LEVER_WORDS = {"power_limit": "power limit", "locked_clocks": "locked SM clocks"}
# The capping card lists this many nodes; `llmgw ctl facility capping` lists them all.
CAPPING_SHOWN = 20


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


def capping_shown(config: CappingConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The GPU capping card: off, or each node capping acts on (capped, or would cap under observe mode),
    as `llmgw ctl facility capping` lists them (`rows`), with what its agent reported it could not apply;
    the first CAPPING_SHOWN (those whose agent failed first), the rest counted."""
    if not config.enabled:
        return {"enabled": False}
    rows = [dict(row) for row in rows]
    sensors = dict(Node.objects.filter(name__in=[row["node"] for row in rows]).values_list("name", "sensors"))
    for row in rows:
        row["failures"] = capping_failures(sensors.get(row["node"]))
    rows.sort(key=lambda r: (not r["failures"], natural_key(r["node"])))
    return {
        "enabled": True,
        "lever": LEVER_WORDS.get(config.lever, config.lever),
        "floor_pct": f"{config.floor_fraction:.0%}",
        "rows": rows[:CAPPING_SHOWN],
        "total": len(rows),
        "more": max(0, len(rows) - CAPPING_SHOWN),
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


def feeds_context(n1: Mapping[str, Any]) -> dict[str, Any]:
    """Feeds with what the loss of each would pass (the page's N−1 listing, from the report read once)."""
    if not n1["known"]:
        return {"feeds": [], "feed_loss": {"text": "0 violations"}}
    by_feed = {item["feed"]: item["violations"] for item in n1["report"]["feeds"]}
    feeds = [
        {
            **f,
            "rating": rating_text(f),
            **{f"{key}_text": watts_text(f[f"{key}_watts"]) for key in ("capacity", "load", "reserved", "measured")},
            "loss": by_feed.get(f["name"], []),
        }
        for f in console_figures.feeds_figures()[0]
    ]
    return {"feeds": feeds, "feed_loss": n1["report"]}


# -- the fragments: the page's parts, rendered alike for the page and for the live socket -------------------


def render_parts(context: dict[str, Any], *, oob: bool = False) -> dict[str, Any]:
    """Render the tiles, row and room headings and worst-first rows one by one (each kept in the context for
    the page's templates as ``html``), and return them by element id with the structures they sit in. With
    `oob` (the socket's), each part also as the socket sends it alone (``oob_parts``): its template writes
    hx-swap-oob on its own root element, while the whole map or list keeps the plain parts (an hx-swap-oob
    nested in a swapped element would be torn out of it and swapped on its own)."""
    tiles: dict[str, str] = {}
    heads: dict[str, str] = {}
    rows: dict[str, str] = {}
    sent: dict[str, str] = {}

    def part(template: str, key: str, into: dict[str, str], part_context: dict[str, Any]) -> str:
        html = mark_safe(render_to_string(template, part_context).strip())
        into[key] = html
        if oob:
            sent[key] = render_to_string(template, {**part_context, "oob": True}).strip()
        return html

    for room in context["rack_map"]:
        room["head_html"] = part("facility/_room_head.html", f"room-head-{room['slug']}", heads, {"room": room})
        for row in room["rows"]:
            row["head_html"] = part("facility/_row_head.html", f"row-head-{row['slug']}", heads, {"row": row})
            for rack in row["racks"]:
                rack["html"] = part("facility/_tile.html", f"rack-{rack['name']}", tiles, {"r": rack})
    for d in context["worst"].object_list:
        d["row_html"] = part("facility/_worst_row.html", f"wf-{d['slug']}", rows, {"d": d})
    map_shape = repr([(room["slug"], [(row["slug"], [r["name"] for r in row["racks"]]) for row in room["rows"]])
                      for room in context["rack_map"]])
    worst_shape = repr(([d["slug"] for d in context["worst"].object_list], context["worst"].number,
                        context["worst_total"]))
    return {"tiles": tiles, "heads": heads, "rows": rows, "map_shape": map_shape, "worst_shape": worst_shape,
            "oob_parts": sent}


def facility_fragments(params: Mapping[str, str], *, detail: str = "", can_operate: bool = False,
                       csrf_token: str = "") -> dict[str, Any]:
    """What the live socket compares and sends: each card by its element id (HTML with hx-swap-oob), the rack
    map and the worst-first list whole (with the shape they have) and part by part (tiles, headings, rows)."""
    context = facility_context(params)
    context.update(can_operate=can_operate, csrf_token=csrf_token, errors={}, oob=True)
    parts = render_parts(context, oob=True)
    sent = parts["oob_parts"]
    cards = {
        "facility-summary": render_to_string("facility/_summary.html", context),
        "holds": render_to_string("facility/_holds.html", context),
        "facility-conditions": render_to_string("facility/_conditions.html", context),
        "capping": render_to_string("facility/_capping.html", context),
    }
    if detail:
        found = context["domains_by_name"].get(detail)
        if found is not None:
            cards["domain-live"] = render_to_string("facility/_domain_live.html", {**context, "d": found})
    return {
        "cards": cards,
        "map": (parts["map_shape"], render_to_string("facility/_rack_map.html", context),
                {key: sent[key] for key in (*parts["heads"], *parts["tiles"])}),
        "worst": (parts["worst_shape"], render_to_string("facility/_worst.html", context),
                  {key: sent[key] for key in parts["rows"]}),
    }


def part_hash(html: str) -> str:
    """A part's fingerprint, alike whether rendered for the page or for the socket (hx-swap-oob aside)."""
    return hashlib.blake2s(html.replace(' hx-swap-oob="true"', "").strip().encode(), digest_size=6).hexdigest()


def fragment_hashes(fragments: Mapping[str, Any]) -> dict[str, Any]:
    """What a page shows, by fingerprints: ``{"cards": {id: hash}, "map": (shape, {id: hash}), "worst": …}``."""
    return {
        "cards": {key: part_hash(html) for key, html in fragments["cards"].items()},
        **{key: (part_hash(fragments[key][0]), {part: part_hash(html) for part, html in fragments[key][2].items()})
           for key in ("map", "worst")},
    }


def fragments_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The messages to send for what changed from `before` (:func:`fragment_hashes` of what the page shows) to
    `after` (:func:`facility_fragments`): each card that differs, and of the map and the list the parts that
    differ — or the whole when its shape changed. The list's rows go in a message of their own: HTML parses a
    `<tr>` only among table rows, so beside a tile or a card it would lose its tags (htmx: oobErrorNoTarget)."""
    cards = before.get("cards", {})
    out = [html for key, html in after["cards"].items() if cards.get(key) != part_hash(html)]
    rows: list[str] = []
    for key in ("map", "worst"):
        shape, whole, parts = after[key]
        old = before.get(key)
        if old is None or old[0] != part_hash(shape):
            out.append(whole)
        else:
            (rows if key == "worst" else out).extend(
                html for part, html in parts.items() if old[1].get(part) != part_hash(html)
            )
    return [message for message in ("".join(out), "".join(rows)) if message]


def hashes_text(hashes: Mapping[str, str]) -> str:
    """``id=hash id=hash …``: what the page's socket form carries."""
    return " ".join(f"{key}={value}" for key, value in hashes.items())


def page_hashes(context: dict[str, Any], parts: Mapping[str, Any]) -> None:
    """Put in the context what the page shows, by fingerprints, for its socket form (``body_hashes``: the
    map and the list, shapes and parts; ``card_hashes``: the cards the socket sends alike), so the socket's
    first message sends only what changed since the page was rendered."""
    body = {"map": part_hash(parts["map_shape"]), "worst": part_hash(parts["worst_shape"])}
    body |= {key: part_hash(html) for key, html in {**parts["heads"], **parts["tiles"], **parts["rows"]}.items()}
    context["body_hashes"] = hashes_text(body)
    cards = {key: part_hash(render_to_string(template, context)) for key, template in SHARED_CARDS.items()}
    context["card_hashes"] = hashes_text(cards)


# The cards the page and the socket render alike (Holds carries each its own CSRF token: sent once).
SHARED_CARDS = {
    "facility-summary": "facility/_summary.html",
    "facility-conditions": "facility/_conditions.html",
    "capping": "facility/_capping.html",
}


def hashes_of_page(body: str, cards: str | None, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The socket's picture of a page from its form's `body` and `cards` (:func:`page_hashes`); without
    `cards` (a filter swapped the body alone) the cards stay as the socket last sent them."""
    def parse(text: str) -> dict[str, str]:
        found = {}
        for item in text.split()[:5000]:
            key, _, value = item.partition("=")
            if key and value:
                found[key[:300]] = value[:32]
        return found

    parts = parse(body)
    shapes = {key: parts.pop(key, "") for key in ("map", "worst")}
    rows = {key: value for key, value in parts.items() if key.startswith("wf-")}
    return {
        "cards": parse(cards) if cards is not None else dict((previous or {}).get("cards", {})),
        "map": (shapes["map"], {key: value for key, value in parts.items() if key not in rows}),
        "worst": (shapes["worst"], rows),
    }


# -- views ---------------------------------------------------------------------------------------------------


def _page(request: HttpRequest, context: dict[str, Any], status: int = 200) -> HttpResponse:
    parts = render_parts(context)
    page_hashes(context, parts)
    if request.htmx and request.method == "GET":
        context["card_hashes"] = None  # the cards on the page may be the socket's since: it keeps its own
        return render(request, "facility/_facility_body.html", context, status=status)
    return render(request, "facility/facility.html", context, status=status)


def page_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    context = facility_context(request.GET)
    context.update(
        {
            "can_operate": can_operate(request.user),
            "errors": {},
            "values": {},
            "preview": None,
            "shed": shed_moves_shown(request.GET.get("shed_page") or 1),
            **extra,
        }
    )
    return context


@login_required
def facility_page(request: HttpRequest) -> HttpResponse:
    """Facility: the summary, holds, the rack map and worst-first list (search, room and row filter, pages)."""
    require_reader(request)
    return _page(request, page_context(request))


# The shedding card shows this many moves a page; `llmgw ctl facility shed --dry-run` lists them all.
SHED_PAGE = 20


def at_text(at: datetime, now: datetime) -> str:
    """A time as the page shows it, on the 24-hour UTC clock: ``17:05:00 UTC``, with its date when it is not
    today's (``Dec 08 00:15:00 UTC``)."""
    at = at.astimezone(UTC)
    return at.strftime("%H:%M:%S UTC") if at.date() == now.astimezone(UTC).date() else at.strftime("%b %d %H:%M:%S UTC")


def shed_moves_shown(page: str | int = 1) -> dict[str, Any]:
    """What shedding would do next, as `llmgw ctl facility shed --dry-run` lists it (empty while it is off),
    SHED_PAGE moves a page, from the figures kept in the cache (console_figures) and when they were worked
    out (``at``: epoch seconds)."""
    moves, at = console_figures.shed_figures()
    now = datetime.now(UTC)
    shown = Paginator(moves, SHED_PAGE).get_page(page)
    rows = [{**m, "at_text": at_text(datetime.fromisoformat(m["at"]), now)} for m in shown.object_list]
    return {"moves": rows, "page": shown, "total": len(moves), "at": at}


def _hold_form(request: HttpRequest, *, status: int = 200, **context: Any) -> HttpResponse:
    """The hold form again, in place (htmx), with its preview or its errors; a plain post gets the page."""
    values = {"domain": request.POST.get("domain", ""), "reason": request.POST.get("reason", ""),
              "drain": request.POST.get("drain", "")}
    form = {"values": values, "errors": {}, "preview": None, "can_operate": True, **context}
    if request.htmx:
        return render(request, "facility/_hold_form.html", form, status=status)
    return _page(request, page_context(request, **form), status=status)


@login_required
@require_POST
def hold_preview(request: HttpRequest) -> HttpResponse:
    """The hold form's Preview: what holding the domain (and draining it) would move, where, and the warnings
    to confirm (placement.services.hold_preview), shown under the form; nothing is written. An operator's, as
    the form is and as the API's what-if is: it works out a drain of every replica in the domain."""
    require_operator(request)
    try:
        preview = placement_services.hold_preview(
            domain=request.POST.get("domain", ""), reason=request.POST.get("reason", ""),
            drain=bool(request.POST.get("drain")),
        )
    except LlmgwError as exc:
        return _hold_form(request, errors={exc.field or "form": exc.message}, status=422)
    return _hold_form(request, preview=preview)


@login_required
@require_POST
def hold_create(request: HttpRequest) -> HttpResponse:
    """Hold a domain from the Facility page once its preview was seen and confirmed (``confirm``); without it,
    the preview (placement.services: the one hold flow of the node menu, the API and ctl)."""
    require_operator(request)
    asked = f"{request.POST.get('domain', '').strip()}|{'1' if request.POST.get('drain') else ''}"
    if not request.POST.get("confirm") or request.POST.get("previewed", asked) != asked:
        return hold_preview(request)  # not confirmed, or changed since its preview: the preview (again)
    try:
        created = placement_services.hold_create(
            domain=request.POST.get("domain", ""),
            reason=request.POST.get("reason", ""),
            drain=bool(request.POST.get("drain")),
            created_by=request.user.get_username(),
        )
    except LlmgwError as exc:
        return _hold_form(request, errors={exc.field or "form": exc.message}, status=422)
    if request.htmx:
        done = f"{created.hold.domain} held{' and draining' if created.hold.drain else ''}: {created.hold.reason}"
        response = render(request, "facility/_hold_form.html", {"values": {}, "errors": {}, "done": done, "can_operate": True})
        holds = facility_context({})
        response.content += render_to_string(
            "facility/_holds.html", {**holds, "oob": True, "can_operate": True, "errors": {}}, request
        ).encode()
        return response
    return redirect("facility")


@login_required
@require_POST
def hold_release(request: HttpRequest) -> HttpResponse:
    """Release a held domain from the facility page (placement.services.hold_release), once confirmed."""
    require_operator(request)
    try:
        placement_services.hold_release(domain=request.POST.get("domain", ""))
    except LlmgwError as exc:
        if request.htmx:
            context = {**facility_context({}), "can_operate": True, "errors": {"release": exc.message}}
            return render(request, "facility/_holds.html", context, status=422)
        return _page(request, page_context(request, errors={"release": exc.message}), status=422)
    if request.htmx:
        return render(request, "facility/_holds.html", {**facility_context({}), "can_operate": True, "errors": {}})
    return redirect("facility")


@login_required
def shed_card(request: HttpRequest) -> HttpResponse:
    """The shedding card alone, at the page of moves asked (`page`): its pages swap it in place."""
    require_reader(request)
    page = request.GET.get("page") or "1"
    return render(request, "facility/_shed.html", {"shed": shed_moves_shown(page if page.isdigit() else 1)})


@login_required
def domain_detail(request: HttpRequest, domain: str) -> HttpResponse:
    """A domain's detail (a tile or a row clicked): its figures, condition, what llmgw does there, its nodes,
    a hold button, and its history charts."""
    require_reader(request)
    context = facility_context({})
    found = context["domains_by_name"].get(domain)
    if found is None:
        raise Http404(f"{domain} is not known")
    context.update(d=found, can_operate=can_operate(request.user))
    return render(request, "facility/_domain_detail.html", context)


HISTORY_RANGES = {"48h": 48, "30d": 30 * 24}


def history_json(points: list[dict[str, Any]], hours: int) -> dict[str, Any]:
    """A series as the charts take it: epoch seconds and whole watts (a null where nothing was measured)."""
    return {
        "hours": hours,
        "t": [int(p["at"].timestamp()) for p in points],
        "use": [round(p["use_watts"]) for p in points],
        "reserved": [round(p["reserved_watts"]) for p in points],
        "measured": [None if p["measured_peak_watts"] is None else round(p["measured_peak_watts"]) for p in points],
    }


@login_required
def domain_history(request: HttpRequest, domain: str) -> JsonResponse:
    """A domain's power history for its chart (48 h of minute points, 30 d of quarter hours) with its limit
    and cap, and its inlet readings against the thresholds where they are kept."""
    from facility.evaluation import conditions_config
    from facility.history import domain_history as history

    require_reader(request)
    hours = HISTORY_RANGES.get(request.GET.get("range", "48h"), 48)
    overview = {d["domain"]: d for d in facility_overview()["domains"]}
    figures = overview.get(domain)
    points = history(domain=domain, hours=hours)["points"]
    body = history_json(points, hours)
    body.update(limit=figures["limit_watts"] if figures else None, cap=figures["cap_watts"] if figures else None)
    body["text"] = (f"use against the {kw(body['limit'])} limit ({kw(body['cap'])} cap)" if body["limit"] is not None
                    else "use (no budget)")
    body["inlet"] = None
    read = [p for p in points if p["inlet_celsius"] is not None]
    if read:
        thresholds = conditions_config().rule(domain).thresholds
        body["inlet"] = {"t": [int(p["at"].timestamp()) for p in read], "values": [p["inlet_celsius"] for p in read],
                         "warm": thresholds.warm_inlet_c, "hot": thresholds.hot_inlet_c}
    return JsonResponse(body)


@login_required
def node_history(request: HttpRequest, name: str) -> JsonResponse:
    """A node's power history for its chart (its own use, what is placed on it, its measured peak)."""
    from facility.history import node_history as history

    require_reader(request)
    hours = HISTORY_RANGES.get(request.GET.get("range", "48h"), 48)
    body = history_json(history(node_name=name, hours=hours)["points"], hours)
    body.update(limit=None, cap=None, text="this node's use, placed draw and measured peak")
    return JsonResponse(body)
