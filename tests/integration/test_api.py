"""The REST API: authentication everywhere, roles, nodes, labels, facility, holds, budgets, schema."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

READS = ["/api/v1/facility", "/api/v1/nodes", "/api/v1/nodes/gpu01", "/api/v1/schema"]


@pytest.mark.parametrize("url", READS)
def test_every_endpoint_needs_authentication(anon_api, join_node, url):
    join_node("gpu01")
    assert anon_api.get(url).status_code == 401


def test_writes_need_authentication_too(anon_api):
    assert anon_api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "x"}, format="json").status_code == 401
    assert anon_api.delete("/api/v1/facility/holds/rack:r1").status_code == 401
    assert anon_api.post("/api/v1/nodes/gpu01/labels", {"labels": {"a": "b"}}, format="json").status_code == 401
    assert anon_api.post("/api/v1/agents/heartbeat", {"node": "gpu01"}, format="json").status_code == 401


def test_a_viewer_reads_but_cannot_change(viewer_api, join_node):
    join_node("gpu01")
    assert viewer_api.get("/api/v1/nodes").status_code == 200
    response = viewer_api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "x"}, format="json")
    assert response.status_code == 403
    response = viewer_api.post("/api/v1/nodes/gpu01/labels", {"labels": {"llmgw.io/rack": "r1"}}, format="json")
    assert response.status_code == 403


def test_a_user_without_a_role_reads_nothing(make_user):
    from django.contrib.auth.models import Group
    from rest_framework.test import APIClient

    user, key = make_user("nobody", "viewer")
    user.groups.remove(*Group.objects.all())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/nodes").status_code == 403


def test_nodes_list_filters_by_domain_and_shows_location(api, join_node):
    join_node("gpu01", rack="r12-07", pdu="r12-07-a,r12-07-b")
    join_node("gpu02", rack="r12-08")
    body = api.get("/api/v1/nodes", {"domain": "rack:r12-07"}).json()
    assert [n["name"] for n in body] == ["gpu01"]
    assert body[0]["location"] == {"rack": "r12-07", "pdu": "r12-07-a,r12-07-b"}
    assert body[0]["gpus"] == {"free": 8, "total": 8}
    assert body[0]["state"] == "ready"
    bad = api.get("/api/v1/nodes", {"domain": "rack"})
    assert bad.status_code == 400
    assert bad.json()["field"] == "domain"


def test_labels_through_the_api_and_their_sources(api, join_node):
    join_node("gpu01", rack="r1")
    response = api.post(
        "/api/v1/nodes/gpu01/labels", {"labels": {"llmgw.io/rack": "r12-07", "llmgw.io/row": "12"}}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["labels"]["llmgw.io/rack"] == "r12-07"
    detail = api.get("/api/v1/nodes/gpu01").json()
    sources = {item["key"]: (item["value"], item["source"]) for item in detail["labels"]}
    assert sources["llmgw.io/rack"] == ("r12-07", "store")
    assert sources["gpu.model"] == ("H100", "agent") if "gpu.model" in sources else True

    response = api.post("/api/v1/nodes/gpu01/labels", {"labels": {"llmgw.io/rack": None}}, format="json")
    assert response.json()["labels"]["llmgw.io/rack"] == "r1"

    bad = api.post("/api/v1/nodes/gpu01/labels", {"labels": {"llmgw.io/racks": "r2"}}, format="json")
    assert bad.status_code == 400
    assert bad.json()["detail"].startswith("labels: unknown label key 'llmgw.io/racks'")
    assert bad.json()["field"] == "labels.llmgw.io/racks"


def test_hold_and_release_through_the_api(api, join_node):
    join_node("gpu01", rack="r12-07")
    created = api.post(
        "/api/v1/facility/holds", {"domain": "rack:r12-07", "reason": "PDU swap", "drain": True}, format="json"
    )
    assert created.status_code == 201
    assert created.json()["created_by"] == "operator1"
    facility = api.get("/api/v1/facility").json()
    rack = next(d for d in facility["domains"] if d["domain"] == "rack:r12-07")
    assert rack["hold"]["reason"] == "PDU swap"
    assert rack["nodes"] == ["gpu01"]
    assert api.get("/api/v1/nodes/gpu01").json()["state"] == "held"
    assert api.delete("/api/v1/facility/holds/rack:r12-07").status_code == 204
    gone = api.delete("/api/v1/facility/holds/rack:r12-07")
    assert gone.status_code == 404
    assert gone.json() == {"detail": "rack:r12-07 is not held", "field": "domain"}


def test_a_bad_hold_names_the_field(api):
    response = api.post("/api/v1/facility/holds", {"domain": "rack:r1"}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "reason"
    response = api.post("/api/v1/facility/holds", {"domain": "cage:1", "reason": "x"}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("domain: 'cage:1': unknown level 'cage'")


def test_facility_power_figures_follow_the_accounting(api, join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1")
    assert api.post("/api/v1/facility/budgets", {"domain": "rack:r1", "cap_watts": 16000, "other_watts": 800},
                    format="json").status_code == 200
    rack = next(d for d in api.get("/api/v1/facility").json()["domains"] if d["domain"] == "rack:r1")
    # Two idle nodes at node_watts 350 each plus the rack's 800 W of switches; limit 16 kW less 10 %.
    assert rack["use_watts"] == 1500
    assert rack["limit_watts"] == 14400
    assert rack["reserved_watts"] == 0
    assert rack["measured_watts"] is None
    negative = api.post("/api/v1/facility/budgets", {"domain": "rack:r1", "cap_watts": -1}, format="json")
    assert negative.status_code == 400
    assert negative.json() == {"detail": "cap_watts: must not be negative (got -1)", "field": "cap_watts"}


def test_openapi_schema_is_served(api):
    response = api.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for p in ("/api/v1/facility", "/api/v1/facility/holds", "/api/v1/nodes", "/api/v1/nodes/{name}/labels",
              "/api/v1/agents/heartbeat"):
        assert p in paths


def test_an_unknown_field_is_refused_not_dropped(api):
    response = api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "x", "drian": True}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "drian"
    response = api.post("/api/v1/facility/budgets", {"domain": "rack:r1", "cap_watts": 1, "other_wats": 5},
                        format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "other_wats"


def test_what_a_change_does_not_name_stays_as_it_was(api):
    api.post("/api/v1/facility/budgets", {"domain": "rack:r1", "cap_watts": 16000, "other_watts": 800}, format="json")
    api.post("/api/v1/facility/budgets", {"domain": "rack:r1", "cap_watts": 20000}, format="json")
    rack = next(d for d in api.get("/api/v1/facility").json()["domains"] if d["domain"] == "rack:r1")
    assert (rack["cap_watts"], rack["other_watts"]) == (20000, 800)
    api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "PDU swap", "drain": True}, format="json")
    api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "PDU swap, phase 2"}, format="json")
    rack = next(d for d in api.get("/api/v1/facility").json()["domains"] if d["domain"] == "rack:r1")
    assert (rack["hold"]["reason"], rack["hold"]["drain"]) == ("PDU swap, phase 2", True)


@pytest.mark.parametrize(
    "method, path, field",
    [
        ("get", "/api/v1/nodes/%00", "name"),
        ("get", "/api/v1/models/%00", "name"),
        ("get", "/api/v1/models/%00/headroom", "name"),
        ("delete", "/api/v1/models/%00", "name"),
        ("get", "/api/v1/replicas?model=%00", "model"),
        ("get", "/api/v1/nodes?q=%00", "q"),
    ],
)
def test_a_nul_in_the_path_or_query_is_a_400_naming_it(api, method, path, field):
    answer = getattr(api, method)(path)
    assert answer.status_code == 400
    assert answer.json() == {"detail": f"{field}: must not contain NUL characters", "field": field}


def test_bodies_with_nul_surrogates_or_deep_nesting_are_refused_naming_the_field(api):
    nul = api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "a\x00b"}, format="json")
    assert nul.json() == {"detail": "reason: must not contain NUL characters", "field": "reason"}
    lone = api.post(
        "/api/v1/models", b'{"kind": "Model", "name": "m", "profile": {"gpus": 0, "command": "\\ud800"}}',
        content_type="application/json",
    )
    assert lone.status_code == 400
    assert lone.json()["field"] == "profile.command"
    deep = api.post("/api/v1/models", b"[" * 100_000 + b"]" * 100_000, content_type="application/json")
    assert deep.status_code == 400
    assert deep.json()["field"] is None


def test_text_with_a_bidirectional_control_is_refused_wherever_it_is_sent(api, join_node, client, make_user):
    # "PDU swap" that shows as something else: U+202E (right-to-left override) reverses what follows it.
    reason = "PDU \u202epaws"
    hold = api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": reason}, format="json")
    assert hold.status_code == 400
    assert hold.json() == {
        "detail": "reason: must not contain bidirectional control characters (U+202E at character 5): they show "
        "the text in another order than it is",
        "field": "reason",
    }
    join_node("gpu01", rack="r1")
    label = api.post("/api/v1/nodes/gpu01/labels", {"labels": {"team": "ml\u2067x"}}, format="json")
    assert label.status_code == 400 and label.json()["field"] == "labels.team"
    assert api.get("/api/v1/nodes", {"q": "\u202d"}).json()["field"] == "q"
    client.force_login(make_user("op1", "operator")[0])
    form = client.post("/facility/holds", {"domain": "rack:r1", "reason": reason, "confirm": "1"})
    assert form.status_code == 422 and "reason: holds a bidirectional control" in form.content.decode()
    from facility.models import Hold

    assert not Hold.objects.exists()
    # Marks that only set a direction (U+200F) are text like any other.
    assert api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "swap \u200f"}, format="json").status_code == 201


def test_a_name_with_a_trailing_newline_is_not_a_name(api):
    answer = api.post("/api/v1/models", {"kind": "Model", "name": "m\n", "profile": {"gpus": 0}}, format="json")
    assert answer.status_code == 400
    assert answer.json()["field"] == "name"


def test_the_nodes_list_filters_through_the_consoles_filterset(api, join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r2")
    assert [n["name"] for n in api.get("/api/v1/nodes?domain=rack:r2").json()] == ["gpu02"]
    assert [n["name"] for n in api.get("/api/v1/nodes?q=01").json()] == ["gpu01"]
    assert [n["name"] for n in api.get("/api/v1/nodes?state=ready").json()] == ["gpu01", "gpu02"]
    bad = api.get("/api/v1/nodes?state=gone")
    assert bad.status_code == 400 and bad.json()["field"] == "state"


@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete"])
def test_a_path_naming_no_endpoint_is_a_json_404_whatever_the_method(make_user, method):
    from django.test import Client

    _, key = make_user("operator1", "operator")
    client = Client(enforce_csrf_checks=True)  # as a token client meets it: no session, no CSRF cookie
    answer = getattr(client, method)("/api/v1/nonexistent", HTTP_AUTHORIZATION=f"Token {key}")
    assert answer.status_code == 404
    assert answer.json() == {"detail": "/api/v1/nonexistent is not an API endpoint", "field": None}
    # A path of any length is said back cut short: the answer is no echo of what was sent.
    answer = getattr(client, method)("/api/v1/" + "x" * 12_000, HTTP_AUTHORIZATION=f"Token {key}")
    assert answer.json() == {"detail": "/api/v1/" + "x" * 31 + "… is not an API endpoint", "field": None}


@pytest.mark.parametrize(
    ("url", "text", "detail"),
    [
        ("/api/v1/apply", "kind: Model\nname: [\n", "models.yaml line 3: not valid YAML: "),
        ("/api/v1/facility/apply", "facility: [\n", "server.yaml line 2: not valid YAML: "),
    ],
)
def test_a_file_that_is_not_yaml_is_refused_naming_the_body_field_that_held_it(admin_client, url, text, detail):
    answer = admin_client.post(url, {"text": text}, content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["field"] == "text" and answer.json()["detail"].startswith(detail)


def test_a_reason_that_ends_a_line_or_holds_only_blanks_is_refused_for_a_cordon_as_for_a_hold(api, join_node):
    join_node("gpu01", rack="r1")
    for path, body in (("/api/v1/facility/holds", {"domain": "rack:r1"}), ("/api/v1/nodes/gpu01/cordon", {"cordoned": True})):
        # U+2028 ends a line where a console's text or a script reads one: the reason would be two lines.
        answer = api.post(path, {**body, "reason": "PDU\u2028swap"}, format="json")
        assert answer.status_code == 400 and answer.json()["field"] == "reason"
        assert "holds a line or paragraph separator ('\\u2028') at character 3" in answer.json()["detail"]
    from agents.models import Node

    # A no-break space alone is no reason: none is kept.
    assert api.post("/api/v1/nodes/gpu01/cordon", {"cordoned": True, "reason": "\u00a0"}, format="json").status_code == 200
    assert Node.objects.get(name="gpu01").cordon_reason == ""


def test_a_query_parameter_given_twice_is_refused_naming_it(viewer_api):
    # `domain=r1 &domain=r2` read as the last alone would answer for r2 as if r1 had been asked too.
    answer = viewer_api.get("/api/v1/nodes?domain=rack:r1-01&domain=rack:r1-02")
    assert answer.status_code == 400
    assert answer.json() == {
        "detail": "domain: given 2 times; give it once (a filter takes several terms in one value, separated by spaces)",
        "field": "domain",
    }
    assert viewer_api.get("/api/v1/replicas?limit=1&limit=2000").json()["field"] == "limit"
