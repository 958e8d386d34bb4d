"""The reference is whole: every llmgw metric family /metrics serves is on the metrics page, every setting
the code reads from the environment is in the docs, and every URL the server routes is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
DOCS = "\n".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))


def test_every_served_metric_family_is_on_the_metrics_page(api, join_node):
    from llmgw.docgen import metrics_page

    join_node("gpu01", rack="r1-01")
    response = api.get("/metrics")
    assert response.status_code == 200
    served = {family.name + ("_total" if family.type == "counter" else "")
              for family in text_string_to_metric_families(response.content.decode())
              if family.name.startswith("llmgw_")}
    assert {"llmgw_gpu_throttled", "llmgw_placement_would_total", "llmgw_domain_held"} <= served
    page = metrics_page()
    assert sorted(name for name in served if f"| `{name}` |" not in page) == []


def test_every_setting_read_is_documented():
    read = set()
    for package in ("llmgw", "facility", "placement", "agents"):
        for path in (REPO / package).rglob("*.py"):
            read.update(re.findall(r'(?:env\w*|environ\.get|getenv|environ\[)\(?"([A-Z][A-Z0-9_]+)"', path.read_text()))
    assert {"LLMGW_DATA_DIR", "DATABASE_URL", "LLMGW_METRICS_TOKEN"} <= read
    assert sorted(name for name in read if not re.search(rf"`\$?{name}[`=/]", DOCS)) == []


def test_every_url_is_documented():
    from django.urls import URLPattern, URLResolver, get_resolver

    from llmgw.docgen import api_page

    documented = DOCS + api_page()

    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                if prefix + str(pattern.pattern) in {"admin/", ""}:
                    continue  # the admin's own pages; the console's, in docs/console.md by name
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern) and not str(pattern.pattern).startswith("^"):
                yield "/" + prefix + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))

    urls = sorted(set(walk(get_resolver().url_patterns)))
    assert "/api/v1/docs" in urls and "/metrics" in urls
    missing = [url for url in urls if url not in documented and url.removeprefix("/api/v1") not in documented]
    assert missing == []
