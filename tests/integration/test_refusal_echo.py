"""A refusal quotes the bad value cut short, whatever its size: a server.yaml value or key, a domain in a
URL path. 900 KB sent is not 900 KB answered."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)

BIG = "a" * 900_000


@pytest.mark.parametrize(
    ("text", "field", "detail"),
    [
        (f"facility:\n  conditions: {{mode: {BIG}}}\n", "facility.conditions.mode",
         "server.yaml line 2: facility.conditions.mode: one of observe, enforce, not 'aaaa"),
        (f"facility:\n  shedding: {{enabled: {BIG}}}\n", "facility.shedding.enabled",
         "server.yaml line 2: facility.shedding.enabled: true or false, not 'aaaa"),
        (f"facility:\n  budgets:\n    - {{domain: 'rack:{BIG}', cap_watts: 1}}\n", None, "'rack:aaaa"),
        (f"facility:\n  location_from: {BIG}\n", "facility.location_from",
         "facility.location_from: agents, store, or a mapping of level to agents or store; not 'aaaa"),
        (f"facility:\n  ? {BIG}\n  : 1\n", None, "facility.aaaa"),
    ],
)
def test_a_server_yaml_refusal_quotes_the_value_cut_short(api, text, field, detail):
    response = api.post("/api/v1/facility/apply", {"text": text}, format="json")
    assert response.status_code == 400, response.content[:300]
    body = response.json()
    assert len(response.content) < 2_000, response.content[:300]
    assert detail in body["detail"]
    if field is not None:
        assert body["field"] == field


def test_a_domain_in_the_path_is_quoted_cut_short(api):
    response = api.delete("/api/v1/facility/holds/rack:" + "a" * 15_000)
    assert response.status_code == 400
    assert response.json()["detail"] == (
        "domain: 'rack:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa…: a domain name takes letters, digits, '.', '_' and '-' only"
    )


def test_a_pdu_given_twice_in_a_label_is_refused_naming_the_label(api, join_node):
    join_node("gpu01")
    response = api.post("/api/v1/nodes/gpu01/labels", {"labels": {"llmgw.io/pdu": "r4-02-a,r4-02-a"}}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "labels.llmgw.io/pdu"
    assert "llmgw.io/pdu='r4-02-a,r4-02-a': 'r4-02-a' is given twice" in response.json()["detail"]
