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


def test_a_negative_cap_is_refused(admin_client):
    response = admin_client.post(
        "/admin/facility/budget/add/", {"domain": "rack:r1", "cap_watts": "-5", "other_watts": "0"}
    )
    assert response.status_code == 200
    assert not Budget.objects.exists()


def test_a_budget_saved_in_the_admin_is_the_admins(admin_client):
    response = admin_client.post(
        "/admin/facility/budget/add/", {"domain": "rack:r1", "cap_watts": "16000", "other_watts": "800"}
    )
    assert response.status_code == 302
    budget = Budget.objects.get()
    assert (budget.domain, budget.cap_watts, budget.other_watts, budget.source) == ("rack:r1", 16000, 800, Source.ADMIN)


def test_a_hold_made_in_the_admin_names_who_and_holds_the_nodes(admin_client, join_node):
    join_node("gpu01", rack="r1")
    response = admin_client.post("/admin/facility/hold/add/", {"domain": "rack:r1", "reason": "PDU swap"})
    assert response.status_code == 302
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
        "/admin/facility/hold/", {"action": "delete_selected", "_selected_action": [hold.pk], "post": "yes"}
    )
    assert response.status_code == 302
    assert not Hold.objects.exists()
    assert released == ["rack:r1"]  # the service: a reconcile (a drain stops) and live updates follow
    assert [r.state for r in node_rows()] == ["ready"]
