"""Console pages of models: replicas, where they run and why (explain-placement), pending, headroom.

Reads through placement.selectors, the same dicts `llmgw ctl` and the API show; the live socket
(agents.consumers.ModelsConsumer) renders the same partial, for the page the browser shows.

The Models page lists models by pages, each with its first replicas and its pending ones grouped by
their reason to wait (a thousand pending replicas of one model wait for one reason, said once); a
model's own page lists all its replicas, by pages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from agents.models import NodeDomain
from agents.views import require_reader
from llmgw.errors import NotFound
from placement import selectors
from placement.models import Model

MODELS_PER_PAGE = 10
# A model's first replicas (not pending) on the Models page; its own page lists them all.
REPLICAS_SHOWN = 10
REPLICAS_PER_PAGE = 50


def model_cards(rows: list[dict[str, Any]], *, offset: int = 0, limit: int = REPLICAS_SHOWN) -> list[dict[str, Any]]:
    """Each model row with the replicas shown (each with its explain and the rack of each node) and its
    pending replicas grouped by reason."""
    shown = selectors.models_shown([r["name"] for r in rows], offset=offset, limit=limit)
    nodes = {n for s in shown.values() for r in s["replicas"] for n in r["nodes"]}
    racks = dict(
        NodeDomain.objects.filter(level="rack", node__name__in=nodes).values_list("node__name", "domain")
    ) if nodes else {}
    cards = []
    for row in rows:
        found = shown.get(row["name"])
        if found is None:  # deleted between the two reads
            continue
        for replica in found["replicas"]:
            replica["gpus_text"] = "; ".join(
                f"{s['node']}: {selectors.gpus_text(s['gpus']) or '—'}" for s in replica["shards"]
            )
            replica["where"] = [
                {"node": n, "rack": racks.get(n, "").removeprefix("rack:")} for n in replica["nodes"]
            ]
        cards.append(
            {
                **row,
                "profile_text": selectors.profile_text(row["profile"]),
                "replicas_shown": found["replicas"],
                "listed_total": found["listed_total"],
                "more_listed": found["listed_total"] - offset - len(found["replicas"]),
                "pending_groups": found["pending_groups"],
            }
        )
    return cards


def models_context(params: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Models page for a query (``q``: part of a model's name, ``page``), or one model's page
    (``model``: its name, ``page`` over its replicas). The live socket renders the same."""
    params = params or {}
    if params.get("model"):
        return model_page_context(params["model"], params)
    q = (params.get("q") or "").strip()[:200]
    names = Model.objects.order_by("name").values_list("name", flat=True)
    if q:
        names = names.filter(name__icontains=q)
    page = Paginator(list(names), MODELS_PER_PAGE).get_page(params.get("page"))
    rows = selectors.model_rows(names=page.object_list)
    query = {"q": q} if q else {}
    cards = model_cards(rows)
    return {
        "models": cards,
        "headroom_query": urlencode([("name", card["name"]) for card in cards]),
        "page": page,
        "q": q,
        "query": urlencode(query),
        "filter_query": urlencode({**query, **({"page": page.number} if page.number > 1 else {})}),
    }


def model_page_context(name: str, params: Mapping[str, str]) -> dict[str, Any]:
    """One model with all its replicas, by pages of REPLICAS_PER_PAGE."""
    rows = selectors.model_rows(names=[name])
    if not rows:  # the view answers 404; an open page whose model went says so
        return {"models": [], "missing": name, "model": name, "query": "", "filter_query": urlencode({"model": name})}
    total = selectors.models_shown([name], limit=0)[name]["listed_total"]
    page = Paginator(range(total), REPLICAS_PER_PAGE).get_page(params.get("page"))
    offset = (page.number - 1) * REPLICAS_PER_PAGE
    return {
        "models": model_cards(rows, offset=offset, limit=REPLICAS_PER_PAGE),
        "headroom_query": urlencode({"name": name}),
        "page": page,
        "model": name,
        "query": "",
        "filter_query": urlencode({"model": name, **({"page": page.number} if page.number > 1 else {})}),
    }


def _page(request: HttpRequest, full: str, context: dict[str, Any]) -> HttpResponse:
    # htmx asks for the list alone when it pages or filters (not when it follows a boosted link).
    template = "placement/_models.html" if request.htmx and not request.htmx.boosted else full
    return render(request, template, context)


@login_required
def model_list(request: HttpRequest) -> HttpResponse:
    """Models by pages, each with its first replicas and why; headroom loads per model after."""
    require_reader(request)
    return _page(request, "placement/model_list.html", models_context(request.GET.dict()))


@login_required
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    """One model with every replica, by pages."""
    require_reader(request)
    context = model_page_context(name, request.GET.dict())
    if context.get("missing"):
        raise Http404(f"model {name!r} is not known")
    return _page(request, "placement/model_detail.html", context)


@login_required
def models_headroom(request: HttpRequest) -> HttpResponse:
    """The headroom of the page's models (``?name=…&name=…``, at most a page of them), each swapped into its
    card by id: one read of the nodes for all of them (most of a dry run's time), not one a card."""
    require_reader(request)
    names = list(dict.fromkeys(request.GET.getlist("name")))[:REPLICAS_PER_PAGE]
    found = selectors.models_headroom(names)
    return render(request, "placement/_headrooms.html", {"headrooms": [found[n] for n in names if n in found]})


@login_required
def model_headroom(request: HttpRequest, name: str) -> HttpResponse:
    """How many more replicas of a model fit now, and why the next does not (a dry run of the planner)."""
    require_reader(request)
    try:
        headroom = selectors.model_headroom(name)
    except NotFound as exc:
        return HttpResponse(exc.message, status=404)
    return render(request, "placement/_headroom.html", {"headroom": headroom})
