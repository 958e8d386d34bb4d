"""Console page of models: replicas, where they run, why (explain-placement), pending and headroom."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from agents.views import require_reader


@login_required
def model_list(request: HttpRequest) -> HttpResponse:
    require_reader(request)
    return render(request, "placement/model_list.html", {"models": []})
