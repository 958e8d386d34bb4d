"""Console page of models: replicas, where they run and why (explain-placement), pending, headroom.

Reads through placement.selectors, the same dicts `llmgw ctl` and the API show; the live socket
(agents.consumers.ModelsConsumer) renders the same partial.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from agents.models import NodeDomain
from agents.views import require_reader
from llmgw.errors import NotFound
from placement import selectors

PENDING_SHOWN = 3


def models_context() -> dict[str, Any]:
    """Every model with its replicas (each with its explain-placement and the rack of each node)."""
    racks = dict(NodeDomain.objects.filter(level="rack").values_list("node__name", "domain"))
    models = []
    for row in selectors.model_rows():
        explain = selectors.model_explain(row["name"])
        # A model with thousands waiting would make a page nobody reads: the first few pending ones
        # stand for the rest (they wait for the same reason: the planner asks each the same question).
        pending = [r for r in explain["replicas"] if r["state"] == "pending"]
        if len(pending) > PENDING_SHOWN:
            hidden = {id(r) for r in pending[PENDING_SHOWN:]}
            explain["replicas"] = [r for r in explain["replicas"] if id(r) not in hidden]
            explain["more_pending"] = len(hidden)
        for replica in explain["replicas"]:
            replica["gpus_text"] = "; ".join(
                f"{s['node']}: {selectors.gpus_text(s['gpus']) or '—'}" for s in replica["shards"]
            )
            replica["where"] = [
                {"node": n, "rack": racks.get(n, "").removeprefix("rack:")} for n in replica["nodes"]
            ]
        models.append({**row, "profile_text": selectors.profile_text(row["profile"]), "explain": explain})
    return {"models": models}


@login_required
def model_list(request: HttpRequest) -> HttpResponse:
    """Every model with its replicas, each with its explain-placement; headroom loads per model after."""
    require_reader(request)
    return render(request, "placement/model_list.html", models_context())


@login_required
def model_headroom(request: HttpRequest, name: str) -> HttpResponse:
    """How many more replicas of a model fit now, and why the next does not (a dry run of the planner)."""
    require_reader(request)
    try:
        headroom = selectors.model_headroom(name)
    except NotFound as exc:
        return HttpResponse(exc.message, status=404)
    return render(request, "placement/_headroom.html", {"headroom": headroom})
