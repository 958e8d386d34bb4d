"""Console pages of nodes."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from agents import selectors


@login_required
def node_list(request):
    domain = request.GET.get("domain") or None
    rows = selectors.node_rows(domain=domain)
    template = "agents/_node_table.html" if request.htmx else "agents/node_list.html"
    return render(request, template, {"rows": rows, "domain": domain or ""})
