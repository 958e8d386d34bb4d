"""/api/v1/docs: Swagger UI on the schema, its files served by the server itself (nothing from a CDN)."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def test_the_docs_page_is_swagger_ui_served_from_here(client, make_user):
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    response = client.get("/api/v1/docs", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    page = response.content.decode()
    assert "SwaggerUIBundle" in page and "/api/v1/schema" in page
    sources = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sources and all(s.startswith("/static/drf_spectacular_sidecar/") for s in sources if s.endswith((".js", ".css")))
    assert "//cdn" not in page and "jsdelivr" not in page and "unpkg" not in page
    for source in sources:
        if source.endswith(".js"):
            assert client.get(source).status_code == 200, source


def test_the_docs_page_asks_for_a_login(client):
    assert client.get("/api/v1/docs", HTTP_ACCEPT="text/html").status_code in {401, 403}
