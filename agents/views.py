"""Console pages of nodes: the Nodes list (filter, sort, page) and a node's page with its menu.

Views only translate HTTP: every change goes through the operator's use cases (placement.services:
labels, cordon, hold, release, with their warnings), and the rows and panels are the same templates the
live updates (agents.consumers) render.

Kept in one module: the list, the page and their forms share the row and panel renderers (and the
node's menu) that the live updates render too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from agents import selectors, services
from agents.filtersets import STATES, NodeFilterSet, node_state_lines
from agents.models import Node, NodeDomain, StoreLabel
from facility import services as facility_services
from facility.domains import LABEL_PREFIX, LEVELS, parse_label_args
from facility.models import Hold
from facility.nodes import NodeRow, node_condition, node_rows
from facility.power import kw
from llmgw.errors import LlmgwError
from llmgw.permissions import can_operate, can_read
from placement import selectors as placement_selectors
from placement import services as placement_services

PAGE_SIZE = 100

THROTTLE_WORDS = {
    "sw_power_cap": "power cap",
    "hw_slowdown": "hardware slowdown",
    "sw_thermal": "thermal (software)",
    "hw_thermal": "thermal (hardware)",
    "power_brake": "power brake",
}

# A GPU's `capping` status (agents.node.protocol): why the last change of its limit or clocks failed.
CAPPING_FAILURES = {
    "not permitted": "the agent is not root, so it cannot set a power limit or lock clocks",
    "not supported": "the card or its driver has no such control",
}

# Column → how the list sorts by it; name breaks ties so a page is stable.
SORTS = ("name", "state", "gpus", "where", "power", "temp")
SORT_COLUMNS = [
    ("name", "NAME"),
    ("state", "STATE"),
    ("gpus", "GPUS free/total"),
    ("where", "WHERE"),
    ("power", "GPU POWER"),
    ("temp", "HOTTEST GPU"),
    ("", "THROTTLING"),
]


def require_reader(request: HttpRequest) -> None:
    """A signed-in user without the viewer role reads nothing (the API's rule)."""
    if not can_read(request.user):
        raise PermissionDenied("your role does not allow this: reading needs the viewer role")


def require_operator(request: HttpRequest) -> None:
    if not can_operate(request.user):
        raise PermissionDenied("your role does not allow this: changes need the operator role")


# -- what a row shows ----------------------------------------------------------------------------------------


def temperature_class(celsius: float | None) -> str:
    """hot, warm or nothing, from the temperature as shown (whole degrees): two cards both reading
    ``75 °C`` never differ in colour."""
    if celsius is None:
        return ""
    from decimal import ROUND_HALF_UP, Decimal

    # floatformat:0 rounds half up (84.5 shows as 85), not Python's round to even.
    shown = int(Decimal(str(celsius)).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    return "hot" if shown >= 85 else "warm" if shown >= 75 else ""


def reading_age(node: Node, now=None) -> dict[str, Any]:
    """How old a node's readings are (``12 s``, ``3 min``, ``2 h``), and whether they are stale (older than
    what power accounting counts: settings.LLMGW_MEASURED_FRESH_SECONDS)."""
    from django.conf import settings
    from django.utils import timezone

    if node.sensors_at is None:
        return {"age_text": "never read", "stale": True}
    seconds = max(0, int(((now or timezone.now()) - node.sensors_at).total_seconds()))
    if seconds < 120:
        text = f"{seconds} s"
    elif seconds < 7200:
        text = f"{seconds // 60} min"
    else:
        text = f"{seconds // 3600} h"
    return {"age_text": f"read {text} ago", "stale": seconds > settings.LLMGW_MEASURED_FRESH_SECONDS,
            "at": node.sensors_at.timestamp(), "since_text": text}


def throttle_text(reasons: Iterable[str]) -> str:
    """``["sw_thermal", "sw_power_cap"]`` → ``power cap, thermal (software)``."""
    return ", ".join(sorted(THROTTLE_WORDS.get(r, r) for r in reasons))


def sensor_summary(sensors: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the list shows of a node's latest readings: GPU power against limits, the hottest card, throttling."""
    gpus = list((sensors or {}).get("gpus") or [])
    power = [g["power_watts"] for g in gpus if g.get("power_watts") is not None]
    limits = [g["power_limit_watts"] for g in gpus if g.get("power_limit_watts") is not None]
    temps = [g["temperature_celsius"] for g in gpus if g.get("temperature_celsius") is not None]
    throttled = [g for g in gpus if g.get("throttle_reasons")]
    reasons = {r for g in throttled for r in g["throttle_reasons"]}
    return {
        "gpu_power_watts": sum(power) if power else None,
        "gpu_limit_watts": sum(limits) if limits and len(limits) == len(power) else None,
        "hottest_celsius": max(temps) if temps else None,
        "hottest_class": temperature_class(max(temps) if temps else None),
        "throttled_gpus": len(throttled),
        "throttle_text": throttle_text(reasons),
    }


def decorate(rows: Sequence[NodeRow]) -> list[NodeRow]:
    """Add the sensor summary and the location lines to each row (kept in row.extra)."""
    for row in rows:
        row.extra.update(sensor_summary(row.node.sensors))
        row.extra.update(reading_age(row.node))
        location = row.location
        row.extra["where_main"] = " · ".join(f"{lvl} {location[lvl]}" for lvl in ("rack", "pdu") if lvl in location)
        row.extra["where_more"] = " · ".join(
            f"{lvl} {location[lvl]}" for lvl in ("site", "room", "row") if lvl in location
        )
    return list(rows)


def rows_for(names_or_ids: Sequence[Any], *, by: str = "pk") -> list[NodeRow]:
    """Rows of the given nodes in the given order (a page of the list, or what a live update renders)."""
    qs = selectors.node_queryset().filter(**{f"{by}__in": list(names_or_ids)})
    rows = {getattr(row.node, by): row for row in node_rows(qs)}
    return decorate([rows[key] for key in names_or_ids if key in rows])


# -- the Nodes list ------------------------------------------------------------------------------------------


def _sort_keys(queryset, lines, column: str) -> dict[int, Any]:
    """The value each node sorts by in a column other than name and state."""
    pks = [line.pk for line in lines]
    if column == "gpus":
        totals = Node.objects.filter(pk__in=pks).annotate(n=Count("gpus", filter=Q(gpus__present=True)))
        booked = placement_selectors.booked_gpus(pks)
        return {pk: total - booked.get(pk, 0) for pk, total in totals.values_list("pk", "n")}
    if column == "where":
        from facility.domains import location_text

        return {pk: location_text(labels) for pk, labels in Node.objects.filter(pk__in=pks).values_list("pk", "labels")}
    field = "gpu_power_watts" if column == "power" else "hottest_celsius"
    out = {}
    for pk, sensors in Node.objects.filter(pk__in=pks).values_list("pk", "sensors"):
        value = sensor_summary(sensors)[field]
        out[pk] = -1.0 if value is None else value
    return out


def filtered_nodes(params) -> tuple[NodeFilterSet, Any]:
    """The Nodes list's filter (domain, state, name) applied: (filterset, queryset)."""
    filterset = NodeFilterSet(params or None, queryset=Node.objects.all())
    queryset = filterset.qs if filterset.is_bound and filterset.is_valid() else Node.objects.all()
    if filterset.is_bound and not filterset.is_valid():
        queryset = Node.objects.none()
    return filterset, queryset


def filter_suggestions(filterset: NodeFilterSet, params) -> list[dict[str, Any]]:
    """What each `domain` term no node has could have meant, each with the query that asks for it instead."""
    terms = filterset.form.cleaned_data.get("domain") or []
    out = []
    for hint in filterset.suggestions():
        links = []
        for match in hint["matches"]:
            query = params.copy()
            query.pop("page", None)
            query["domain"] = " ".join(match if t.text == hint["term"] else t.text for t in terms)
            links.append({"text": match, "query": query.urlencode()})
        out.append({**hint, "links": links})
    return out


def node_summary(params) -> dict[str, Any]:
    """The Nodes summary line for a filter: how many nodes, and how many in each state (the live socket
    sends it again as rows change)."""
    _, queryset = filtered_nodes(params)
    lines = node_state_lines(queryset)
    counts = {state: 0 for state in STATES}
    for line in lines:
        counts[line.state] += 1
    return {"total": len(lines), "counts": counts}


# A filter's text is sent back (in the sort and page links, the socket's form) up to this many characters
# a value: a longer one is refused by the filter, and is not worth repeating on every link of the page.
ECHOED_CHARS = 300


def echoed(params: QueryDict) -> QueryDict:
    """The query as the page repeats it: each value cut to ECHOED_CHARS."""
    out = QueryDict(mutable=True)
    for key, values in list(params.lists())[:20]:
        out.setlist(key[:100], [value[:ECHOED_CHARS] for value in values[:10]])
    return out


def node_list_context(request: HttpRequest) -> dict[str, Any]:
    """Filter, sort and page the nodes; only the page's rows are loaded whole."""
    filterset, queryset = filtered_nodes(request.GET)
    sort = request.GET.get("sort") or "name"
    descending = sort.startswith("-")
    column = sort.lstrip("-")
    if column not in SORTS:
        column, descending = "name", False
    lines = node_state_lines(queryset)
    counts = {state: 0 for state in STATES}
    for line in lines:
        counts[line.state] += 1
    if column == "name":
        lines.sort(key=lambda line: line.name, reverse=descending)
    elif column == "state":
        order = {s: i for i, s in enumerate(STATES)}
        lines.sort(key=lambda line: line.name)
        lines.sort(key=lambda line: order[line.state], reverse=descending)
    else:
        keys = _sort_keys(queryset, lines, column)
        lines.sort(key=lambda line: line.name)
        lines.sort(key=lambda line: keys.get(line.pk, -1), reverse=descending)
    page = Paginator(lines, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = rows_for([line.pk for line in page.object_list])
    params = echoed(request.GET)
    params.pop("page", None)
    params.pop("sort", None)
    return {
        "filterset": filterset,
        # A term no node has says so even when another term of its level found nodes (`r12-07 r12-7`).
        "suggestions": filter_suggestions(filterset, request.GET) if filterset.is_bound else [],
        "rows": rows,
        "page": page,
        "total": len(lines),
        "counts": counts,
        "sort": column,
        "descending": descending,
        "sort_columns": SORT_COLUMNS,
        "query": params.urlencode(),
        "filter_query": echoed(request.GET).urlencode(),
        "known_domains": NodeDomain.objects.order_by("domain").values_list("domain", flat=True).distinct(),
        "states": STATES,
    }


@login_required
def node_list(request: HttpRequest) -> HttpResponse:
    """Nodes: NAME, STATE, GPUS, WHERE, power and heat; htmx asks for the table alone."""
    require_reader(request)
    context = node_list_context(request)
    template = "agents/_node_table.html" if request.htmx and not request.htmx.boosted else "agents/node_list.html"
    return render(request, template, context)


# -- a node's page -------------------------------------------------------------------------------------------


def gpu_capping(reading: Mapping[str, Any]) -> dict[str, Any]:
    """What capping left on one card, from its own sensors only: the limit in force against its default
    (``490 W of 700 W``), the locked SM clock range (``210–1128 MHz of 1410``) and, when the agent's last
    change failed, why. Empty texts where the agent reported none of it (an older agent)."""
    enforced = reading.get("enforced_power_limit_watts")
    default = reading.get("default_power_limit_watts")
    limit_text = ""
    if enforced is not None:
        limit_text = f"{enforced:.0f} W" + (f" of {default:.0f} W" if default is not None else "")
    clocks_text = ""
    locked = reading.get("locked_clocks_mhz")
    if locked:
        top = reading.get("max_sm_clock_mhz")
        clocks_text = f"{locked[0]}–{locked[1]} MHz" + (f" of {top}" if top is not None else "")
    failure = reading.get("capping") or ""
    return {
        "limit_text": limit_text,
        "limit_lowered": enforced is not None and default is not None and enforced < default,
        "clocks_text": clocks_text,
        "capping_failure": failure,
    }


def gpu_lines(node: Node) -> list[dict[str, Any]]:
    """Each card with its live readings next to its inventory, and the replica that has it booked."""
    readings = {g.get("index"): g for g in (node.sensors or {}).get("gpus") or []}
    out = []
    bookers = placement_selectors.gpu_bookers(node_id=node.pk)
    for gpu in node.gpus.all():
        reading = readings.get(gpu.index, {})
        limit = reading.get("power_limit_watts", gpu.power_limit_watts)
        power = reading.get("power_watts")
        out.append(
            {
                "index": gpu.index,
                "model": gpu.model,
                "memory_gib": gpu.memory_gib,
                "present": gpu.present,
                "temperature_celsius": reading.get("temperature_celsius"),
                "temperature_class": temperature_class(reading.get("temperature_celsius")),
                "memory_temperature_celsius": reading.get("memory_temperature_celsius"),
                "power_watts": power,
                "power_limit_watts": limit,
                "power_pct": round(100 * power / limit) if power is not None and limit else None,
                "throttle_text": throttle_text(reading.get("throttle_reasons") or []),
                "replica": bookers.get(gpu.index, ""),
                **gpu_capping(reading),
            }
        )
    return out


def node_live_context(node: Node) -> dict[str, Any]:
    """What the live panel of a node's page shows; agents.consumers renders it with the same template."""
    row = rows_for([node.pk])[0]
    sensors = node.sensors or {}
    from placement.models import Shard

    shards = Shard.objects.filter(node=node).select_related("replica__model").order_by("replica_id")
    gpus = gpu_lines(node)
    return {
        "row": row,
        "node": node,
        "condition": node_condition(row.domains),
        "gpus": gpus,
        # The capping column only where the agent reports capping (an older agent: the table as before).
        "gpus_capping": any(g["limit_text"] or g["clocks_text"] or g["capping_failure"] for g in gpus),
        # Each refusal said once under the table, with why; the rows name it.
        "capping_failures": [
            {"status": status, "why": CAPPING_FAILURES.get(status, "")}
            for status in sorted({g["capping_failure"] for g in gpus if g["capping_failure"]})
        ],
        "cpu_temperature_celsius": sensors.get("cpu_temperature_celsius"),
        "cpu_power_watts": sensors.get("cpu_power_watts"),
        "inlet_temperature_celsius": sensors.get("inlet_temperature_celsius"),
        # What the last heartbeat read that the node cannot have read (agents.readings.plausible_heartbeat).
        "implausible": services.implausible_lines(sensors),
        "inventory_pending": services.inventory_pending(node),
        "shards": list(shards),
        "labels": selectors.node_label_sources(node.name, node.agent_labels or {}, node.labels),
        "age": reading_age(node),
        **node_power(node),
        "placed_kw": kw(placement_selectors.placed_watts([node.pk]).get(node.pk, 0.0)),
    }


def node_power(node: Node) -> dict[str, Any]:
    """The node's measured draw as the page shows it: its BMC's whole-chassis figure where the BMC is the
    source, else its GPUs' and CPUs' readings; and the BMC's state (down: why)."""
    power = services.power_source(node.sensors or {})
    watts = power["bmc_watts"] if power["power_source"] == "bmc" else node.measured_watts
    return {
        "measured_kw": kw(watts) if watts is not None else None,
        "power_source": power["power_source"],
        "bmc": power["bmc"] or {},
    }


# How nvidia-smi names each link between two GPUs, for the matrix's legend and its cells' classes.
TOPOLOGY_LEGEND = (
    ("NV#", "nv", "# NVLinks, direct or through NVSwitches"),
    ("PIX", "pix", "one PCIe switch"),
    ("PXB", "pxb", "several PCIe switches"),
    ("PHB", "phb", "a PCIe host bridge (the CPU)"),
    ("NODE", "node", "host bridges within a NUMA node"),
    ("SYS", "sys", "across NUMA nodes, over the socket interconnect"),
)


def topology_matrix(node: Node) -> dict[str, Any] | None:
    """The node's GPU topology as `nvidia-smi topo -m` prints it (rows of cells with their kind), or None
    when its agent reported none."""
    topology = node.gpu_topology or {}
    links, numa = topology.get("links") or [], topology.get("numa") or []
    if not links:
        return None
    rows = []
    for i, row in enumerate(links):
        cells = []
        for link in row:
            kind = "self" if link == "X" else "unknown" if link is None else "nv" if link.startswith("NV") else link.lower()
            cells.append({"text": link or "?", "kind": kind})
        node_of = numa[i] if i < len(numa) else None
        rows.append(
            {"index": i, "cells": cells, "numa": "N/A" if node_of is None or node_of < 0 else str(node_of)}
        )
    return {"rows": rows, "legend": TOPOLOGY_LEGEND, "one_node": bool(numa) and all(n == -1 for n in numa)}


def node_page_context(
    request: HttpRequest,
    node: Node,
    *,
    open_form: str = "",
    errors: Mapping[str, str] | None = None,
    values: Mapping[str, str] | None = None,
    warnings: Sequence[str] = (),
    preview: Any = None,
) -> dict[str, Any]:
    context = node_live_context(node)
    store = dict(StoreLabel.objects.filter(node_name=node.name).values_list("key", "value"))
    agent = node.agent_labels or {}
    location_fields = []
    for level in LEVELS:
        key = LABEL_PREFIX + level
        location_fields.append(
            {
                "level": level,
                "key": key,
                "value": (values or {}).get(level, store.get(key, "")),
                "agent_value": agent.get(key, ""),
                "error": (errors or {}).get(f"labels.{key}", ""),
            }
        )
    rack = context["row"].location.get("rack")
    rack_domain = f"rack:{rack}" if rack else ""
    context.update(
        {
            "can_operate": can_operate(request.user),
            "open_form": open_form,
            "errors": errors or {},
            "values": values or {},
            "location_fields": location_fields,
            "rack": rack or "",
            "rack_domain": rack_domain,
            "rack_hold": Hold.objects.filter(domain=rack_domain).first() if rack_domain else None,
            "release_text": facility_services.release_text(domain=rack_domain) if rack_domain else "",
            "warnings": list(warnings),
            "topology": topology_matrix(node),
            # Hold rack's preview (placement.services.hold_preview), shown in the menu before it holds.
            "preview": preview,
        }
    )
    return context


def _node(name: str) -> Node:
    node = Node.objects.filter(name=name).first()
    if node is None:
        raise Http404(f"node {name!r} is not known")
    return node


@login_required
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    """A node: location with label sources, hold, GPUs, CPU and inlet readings, replicas; its menu."""
    require_reader(request)
    node = _node(name)
    return render(request, "agents/node_detail.html", node_page_context(request, node))


def _after_change(request: HttpRequest, node: Node, **page) -> HttpResponse:
    """The node page again: htmx swaps its body in; a plain form post follows a redirect (or sees the errors)."""
    node.refresh_from_db()
    failed = bool(page.get("errors"))  # warnings waiting for a confirmation are not a failure
    status = 422 if failed else 200
    if request.htmx:
        return render(request, "agents/_node_page.html", node_page_context(request, node, **page), status=status)
    if failed or page.get("warnings") or page.get("preview"):
        return render(request, "agents/node_detail.html", node_page_context(request, node, **page), status=status)
    return redirect(reverse("node-detail", args=[node.name]))


def location_changes(
    post: Mapping[str, str], store: Mapping[str, str]
) -> dict[str, str | None]:
    """What the Location… form asks for: a level changed sets it, emptied removes the store's value.

    `more` takes the ctl syntax (`key=value`, `key-`), for other labels or a location key typed by hand.
    """
    changes: dict[str, str | None] = {}
    for level in LEVELS:
        key = LABEL_PREFIX + level
        new = (post.get(level) or "").strip()
        old = store.get(key, "")
        if new == old:
            continue
        changes[key] = new or None
    more = (post.get("more") or "").split()
    if more:
        changes.update(parse_label_args(more))
    return changes


@login_required
@require_POST
def node_location(request: HttpRequest, name: str) -> HttpResponse:
    """Location…: set or remove store labels through placement.services.labels_change (its warnings
    confirmed first, as labels_preview gives them); all or nothing."""
    require_operator(request)
    node = _node(name)
    store = dict(StoreLabel.objects.filter(node_name=node.name).values_list("key", "value"))
    values = {level: request.POST.get(level, "") for level in LEVELS}
    values["more"] = request.POST.get("more", "")
    try:
        changes = location_changes(request.POST, store)
        if not changes:
            return _after_change(request, node, open_form="location", errors={"form": "Nothing changed."}, values=values)
        if not request.POST.get("confirm"):
            # A refusal first (its error, not a warning), then the warnings to confirm.
            warnings = placement_services.labels_preview(node_name=node.name, changes=changes)
            if warnings:
                return _after_change(request, node, open_form="location", warnings=warnings, values=values)
        placement_services.labels_change(node_name=node.name, changes=changes, set_by=request.user.get_username())
    except LlmgwError as exc:
        field = exc.field or "form"
        errors = {field: exc.message}
        if field.startswith("labels.") and field.removeprefix(f"labels.{LABEL_PREFIX}") not in LEVELS:
            errors["more"] = exc.message  # a key typed in `more`: show it there
        if field == "labels":
            errors["more"] = exc.message
        return _after_change(request, node, open_form="location", errors=errors, values=values)
    return _after_change(request, node)


@login_required
@require_POST
def node_hold(request: HttpRequest, name: str) -> HttpResponse:
    """Hold rack: first the preview of what holding the node's rack (and draining it) would move, with its
    warnings (placement.services.hold_preview, as on the Facility page); once confirmed, the hold
    (placement.services.hold_create, the flow of the API and ctl too)."""
    require_operator(request)
    node = _node(name)
    domain = request.POST.get("domain", "")
    values = {"reason": request.POST.get("reason", ""), "drain": request.POST.get("drain", "")}
    try:
        if not request.POST.get("confirm") or request.POST.get("previewed", f"{domain}|{values['drain']}") != (
            f"{domain}|{values['drain']}"
        ):
            preview = placement_services.hold_preview(domain=domain, reason=values["reason"], drain=bool(values["drain"]))
            return _after_change(request, node, open_form="hold", values=values, preview=preview)
        placement_services.hold_create(
            domain=domain,
            reason=values["reason"],
            drain=bool(values["drain"]),
            created_by=request.user.get_username(),
        )
    except LlmgwError as exc:
        return _after_change(request, node, open_form="hold", errors={exc.field or "form": exc.message}, values=values)
    return _after_change(request, node)


@login_required
@require_POST
def node_release(request: HttpRequest, name: str) -> HttpResponse:
    """Release rack: undo the hold through placement.services.hold_release (the one hold flow)."""
    require_operator(request)
    node = _node(name)
    try:
        placement_services.hold_release(domain=request.POST.get("domain", ""))
    except LlmgwError as exc:
        return _after_change(request, node, open_form="hold", errors={"form": exc.message})
    return _after_change(request, node)


@login_required
@require_POST
def node_cordon(request: HttpRequest, name: str) -> HttpResponse:
    """Cordon (nothing new placed here) or Uncordon, through placement.services.cordon_change."""
    require_operator(request)
    node = _node(name)
    cordoned = request.POST.get("action") == "cordon"
    try:
        placement_services.cordon_change(
            node_name=node.name, cordoned=cordoned, reason=request.POST.get("reason", "").strip()
        )
    except LlmgwError as exc:
        return _after_change(request, node, open_form="cordon", errors={"form": exc.message})
    return _after_change(request, node)
