"""The Django admin refuses what the API and ctl refuse, with the same words, and saves through the services."""

from __future__ import annotations

import pytest

from facility.models import Budget, Hold, Source

pytestmark = pytest.mark.django_db


def test_a_budget_with_a_bad_domain_is_refused_with_the_services_words(admin_client):
    response = admin_client.post(
        "/admin/facility/budget/add/", {"domain": "shelf:s1", "cap_watts": "16000", "other_watts": "0"}
    )
    assert response.status_code == 200
    assert "domain: &#x27;shelf:s1&#x27;: unknown level &#x27;shelf&#x27;" in response.content.decode()
    assert not Budget.objects.exists()


@pytest.mark.parametrize(
    "cap, words",
    [
        ("-5", "cap_watts: must not be negative (got -5)"),
        ("2e8", "cap_watts: 2e+08 W is more than any domain carries (at most 100,000,000 W)"),
    ],
)
def test_a_bad_cap_gets_the_same_words_in_the_admin_the_api_and_ctl(admin_client, api, capsys, cap, words):
    import html

    from llmgw.ctl import main as ctl

    response = admin_client.post(
        "/admin/facility/budget/add/", {"domain": "rack:r1", "cap_watts": cap, "other_watts": "0"}
    )
    assert response.status_code == 200  # the form again, with the refusal on it: never a 500
    assert words in html.unescape(response.content.decode())

    answer = api.post("/api/v1/facility/budgets", {"domain": "rack:r1", "cap_watts": float(cap)}, format="json")
    assert answer.status_code == 400
    assert answer.json() == {"detail": words, "field": "cap_watts"}

    assert ctl(["facility", "budget", "set", "rack:r1", "--cap-watts", cap]) != 0
    assert words in capsys.readouterr().err
    assert not Budget.objects.exists()


def test_facility_settings_saved_in_the_admin_go_through_the_service(admin_client, monkeypatch):
    from facility import services
    from facility.models import FacilitySettings

    FacilitySettings.load()
    calls = []
    real = services.settings_set
    monkeypatch.setattr(services, "settings_set", lambda **kw: calls.append(kw) or real(**kw))
    fields = {"margin": "0.1", "gpu_watts": "650", "cpu_core_watts": "10", "node_watts": "300"}
    response = admin_client.post("/admin/facility/facilitysettings/1/change/", fields, follow=True)
    assert response.status_code == 200
    assert [str(m) for m in response.context["messages"]][-1].endswith("was changed successfully.")
    assert calls and calls[0]["source"] == Source.ADMIN
    settings = FacilitySettings.load()
    assert (settings.margin, settings.gpu_watts, settings.source) == (0.1, 650, Source.ADMIN)

    bad = admin_client.post("/admin/facility/facilitysettings/1/change/", {**fields, "margin": "1.5"})
    assert bad.status_code == 200
    assert "margin: must be in [0, 1) (a share of the cap kept free), got 1.5" in bad.content.decode()
    assert FacilitySettings.load().margin == 0.1


def test_a_budget_saved_in_the_admin_is_the_admins(admin_client):
    response = admin_client.post(
        "/admin/facility/budget/add/", {"domain": "rack:r1", "cap_watts": "16000", "other_watts": "800"},
        follow=True,
    )
    assert response.redirect_chain[0][1] == 302
    messages = [str(m) for m in response.context["messages"]]
    # The service's warning (no node is in that rack yet), then the admin's own line, linking the budget.
    budget = Budget.objects.get()
    assert messages[0] == "no node is in rack r1 yet; no node is in any rack"
    assert len(messages) == 2 and "was added successfully" in messages[1], messages
    assert f"/admin/facility/budget/{budget.pk}/change/" in messages[1]
    assert (budget.domain, budget.cap_watts, budget.other_watts, budget.source) == ("rack:r1", 16000, 800, Source.ADMIN)


def test_a_hold_made_in_the_admin_names_who_and_holds_the_nodes(admin_client, join_node):
    join_node("gpu01", rack="r1")
    response = admin_client.post(
        "/admin/facility/hold/add/", {"domain": "rack:r1", "reason": "PDU swap"}, follow=True
    )
    assert response.redirect_chain[0][1] == 302
    messages = [str(m) for m in response.context["messages"]]
    assert len(messages) == 1 and "was added successfully" in messages[0]
    hold = Hold.objects.get()
    assert (hold.domain, hold.reason, hold.created_by) == ("rack:r1", "PDU swap", "admin")
    from facility.nodes import node_rows

    assert [r.state for r in node_rows()] == ["held"]


def test_a_store_label_with_a_misspelt_key_is_refused(admin_client):
    from agents.models import StoreLabel

    response = admin_client.post(
        "/admin/agents/storelabel/add/", {"node_name": "gpu01", "key": "llmgw.io/rak", "value": "r1"}
    )
    assert response.status_code == 200
    assert "unknown label key" in response.content.decode()
    assert not StoreLabel.objects.exists()


def test_delete_selected_holds_releases_them_through_the_service(admin_client, join_node, monkeypatch):
    from facility import services
    from facility.nodes import node_rows
    from facility.services import hold_create

    join_node("gpu01", rack="r1")
    hold = hold_create(domain="rack:r1", reason="PDU swap")
    released = []
    real = services.hold_release
    monkeypatch.setattr(services, "hold_release", lambda **kw: released.append(kw["domain"]) or real(**kw))
    response = admin_client.post(
        "/admin/facility/hold/", {"action": "delete_selected", "_selected_action": [hold.pk], "post": "yes"},
        follow=True,
    )
    assert response.redirect_chain[0][1] == 302
    assert [str(m) for m in response.context["messages"]] == ["Successfully deleted 1 hold."]
    assert not Hold.objects.exists()
    assert released == ["rack:r1"]  # the service: a reconcile (a drain stops) and live updates follow
    assert [r.state for r in node_rows()] == ["ready"]


@pytest.mark.parametrize(
    "node_name, key, value",
    [
        ("gpu01", "llmgw.io/rak", "r1"),  # a misspelt key
        ("gpu 01", "llmgw.io/rack", "r1"),  # not a node name
        ("gpu01", "llmgw.io/rack", "r1 01"),  # not a rack name
    ],
)
def test_a_bad_store_label_gets_the_same_words_in_the_admin_and_the_api(admin_client, api, node_name, key, value):
    import html
    from urllib.parse import quote

    from agents.models import StoreLabel

    answer = api.post(f"/api/v1/nodes/{quote(node_name)}/labels", {"labels": {key: value}}, format="json")
    assert answer.status_code == 400
    words = answer.json()["detail"]
    response = admin_client.post("/admin/agents/storelabel/add/", {"node_name": node_name, "key": key, "value": value})
    assert response.status_code == 200  # the form again, with the refusal on it: never a 500
    assert words in html.unescape(response.content.decode())
    assert not StoreLabel.objects.exists()


def test_a_store_label_saved_in_the_admin_goes_through_the_service(admin_client, join_node):
    from agents.models import Node

    join_node("gpu01")
    response = admin_client.post(
        "/admin/agents/storelabel/add/", {"node_name": "gpu01", "key": "llmgw.io/rack", "value": "r1-01"}, follow=True
    )
    assert [str(m) for m in response.context["messages"]][-1].endswith("was added successfully.")
    assert Node.objects.get(name="gpu01").labels["llmgw.io/rack"] == "r1-01"


@pytest.mark.parametrize(
    "fields",
    [
        {"keep_within": "shelf"},
        {"node_selector": "gpu.model in ("},
        {"name": "Bad Name!"},
    ],
)
def test_a_bad_model_gets_the_same_words_in_the_admin_and_the_api(admin_client, api, fields):
    import html

    from placement.admin import document_of
    from placement.models import Model

    form = {"name": "m", "replicas": "1", "gpus": "0", "nodes": "1", "cpu_cores": "1", "memory_gib": "0",
            "health_path": "/health", "min_ready_seconds": "10", **fields}
    answer = api.post("/api/v1/models", document_of({**form, "replicas": 1, "gpus": 0, "nodes": 1, "cpu_cores": 1,
                                                     "memory_gib": 0, "min_ready_seconds": 10}), format="json")
    assert answer.status_code == 400
    words = answer.json()["detail"]
    response = admin_client.post("/admin/placement/model/add/", form)
    assert response.status_code == 200  # the form again, with the refusal on it: never a 500
    assert words in html.unescape(response.content.decode())
    assert not Model.objects.exists()


def test_a_store_label_edited_or_deleted_in_the_admin_moves_the_nodes(admin_client, join_node):
    """A key or node changed in the admin is one change per node (the old key removed, the new set), and a
    bulk delete removes each node's labels: the nodes' labels follow."""
    from agents.models import Node, StoreLabel

    join_node("gpu01")
    join_node("gpu02")
    admin_client.post("/admin/agents/storelabel/add/", {"node_name": "gpu01", "key": "llmgw.io/row", "value": "r7"})
    label = StoreLabel.objects.get()
    admin_client.post(
        f"/admin/agents/storelabel/{label.pk}/change/", {"node_name": "gpu01", "key": "llmgw.io/room", "value": "h2"}
    )
    labels = Node.objects.get(name="gpu01").labels
    assert (labels.get("llmgw.io/row"), labels["llmgw.io/room"]) == (None, "h2")
    label = StoreLabel.objects.get()
    admin_client.post(
        f"/admin/agents/storelabel/{label.pk}/change/", {"node_name": "gpu02", "key": "llmgw.io/room", "value": "h3"}
    )
    assert "llmgw.io/room" not in Node.objects.get(name="gpu01").labels
    assert Node.objects.get(name="gpu02").labels["llmgw.io/room"] == "h3"
    admin_client.post("/admin/agents/storelabel/add/", {"node_name": "gpu01", "key": "llmgw.io/room", "value": "h4"})
    response = admin_client.post(
        "/admin/agents/storelabel/",
        {
            "action": "delete_selected",
            "_selected_action": list(StoreLabel.objects.values_list("pk", flat=True)),
            "post": "yes",
        },
    )
    assert response.status_code == 302
    assert not StoreLabel.objects.exists()
    assert [("llmgw.io/room" in n.labels) for n in Node.objects.order_by("name")] == [False, False]


def test_a_store_label_the_node_has_already_is_refused_in_the_admin_not_overwritten(admin_client, join_node):
    from agents.models import StoreLabel

    join_node("gpu01")
    join_node("gpu02")
    admin_client.post("/admin/agents/storelabel/add/", {"node_name": "gpu01", "key": "team", "value": "a"})
    admin_client.post("/admin/agents/storelabel/add/", {"node_name": "gpu02", "key": "team", "value": "b"})
    said = "node gpu02 has a label team already: change that one"
    response = admin_client.post("/admin/agents/storelabel/add/", {"node_name": "gpu02", "key": "team", "value": "c"})
    assert said in response.content.decode()
    mine = StoreLabel.objects.get(node_name="gpu01")
    response = admin_client.post(
        f"/admin/agents/storelabel/{mine.pk}/change/", {"node_name": "gpu02", "key": "team", "value": "a"}
    )
    assert said in response.content.decode()
    assert dict(StoreLabel.objects.values_list("node_name", "value")) == {"gpu01": "a", "gpu02": "b"}


def test_a_budgets_domain_is_not_changed_in_the_admin_only_its_figures(admin_client):
    from facility.services import budget_set

    budget = budget_set(domain="rack:r1", cap_watts=16000)
    page = admin_client.get(f"/admin/facility/budget/{budget.pk}/change/").content.decode()
    assert 'name="domain"' not in page  # shown, not an input
    response = admin_client.post(
        f"/admin/facility/budget/{budget.pk}/change/",
        {"domain": "rack:r2", "cap_watts": "12000", "other_watts": "0"}, follow=True,
    )
    assert response.status_code == 200
    assert list(Budget.objects.values_list("domain", "cap_watts")) == [("rack:r1", 12000)]


def test_a_holds_domain_is_not_changed_in_the_admin_only_its_reason(admin_client, join_node):
    from facility.services import hold_create

    join_node("n1", rack="r1")
    hold = hold_create(domain="rack:r1", reason="PDU swap")
    response = admin_client.post(
        f"/admin/facility/hold/{hold.pk}/change/", {"domain": "rack:r2", "reason": "PDU swap, then a fan"},
        follow=True,
    )
    assert response.status_code == 200
    assert list(Hold.objects.values_list("domain", "reason")) == [("rack:r1", "PDU swap, then a fan")]
