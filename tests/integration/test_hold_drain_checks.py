"""A hold with drain checked before it is written: the dry run's domains past their limit (with the
figures) and replicas that cannot move, in the console (confirmation), the API's `warning` and ctl."""

from __future__ import annotations

import pytest

from facility.models import Hold
from llmgw.ctl import main as ctl
from placement.reconcile import reconcile_all
from placement.whatif import hold_result_warnings, hold_warnings

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pinned(join_node):
    """One replica whose selector allows only rack r1: draining r1 leaves it nowhere to go."""
    from placement.services import models_apply

    join_node("a1", rack="r1", pdu="r1-a")
    join_node("b1", rack="r2", pdu="r2-a")
    models_apply(text="kind: Model\nname: m\nreplicas: 1\nprofile:\n  gpus: 8\n  command: serve\n"
                 "  node_selector: \"llmgw.io/rack = r1\"\n")
    reconcile_all()


def test_the_figures_of_a_domain_the_drain_takes_past_its_limit():
    result = {
        "domains": [
            {"domain": "rack:r2", "use_watts_before": 5000.0, "use_watts_after": 9100.0, "limit_watts": 9000.0},
            {"domain": "rack:r3", "use_watts_before": 9500.0, "use_watts_after": 9500.0, "limit_watts": 9000.0},
            {"domain": "rack:r4", "use_watts_before": 1000.0, "use_watts_after": 8900.0, "limit_watts": 9000.0},
        ],
        "blocked": [],
    }
    # r3 was over before and the drain adds nothing; r4 stays under its limit.
    assert hold_result_warnings(result) == ["rack:r2 would reach 9.1 kW of its 9.0 kW limit (0.1 kW over; 5.0 kW now)"]


def test_no_warning_when_the_drain_fits_or_nothing_moves(pinned):
    assert hold_warnings(domain="rack:r2", drain=True) == []
    assert hold_warnings(domain="rack:r1", drain=False) == []


def test_a_replica_that_cannot_move_is_said_everywhere_and_the_console_asks_first(pinned, client, make_user, api, capsys):
    from placement.services import hold_preview

    assert hold_warnings(domain="rack:r1", drain=True)[0].startswith("m#1 could not move: ")
    # The one hold flow's preview: the refusal quotes the reason the operator gave, as the real hold's will.
    warnings = hold_preview(domain="rack:r1", reason="swap", drain=True).warnings
    assert len(warnings) == 1 and warnings[0].startswith("m#1 could not move: ") and "rack r1 is held: swap" in warnings[0]

    user, _ = make_user("op1", "operator")
    client.force_login(user)
    page = client.post("/facility/holds", {"domain": "rack:r1", "reason": "swap", "drain": "1"}).content.decode()
    assert "m#1 could not move: " in page and "Hold rack:r1 anyway" in page
    assert not Hold.objects.exists()
    response = client.post("/facility/holds", {"domain": "rack:r1", "reason": "swap", "drain": "1", "confirm": "1"})
    assert response.status_code == 302 and Hold.objects.get(domain="rack:r1").drain
    Hold.objects.all().delete()

    response = api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "swap", "drain": True}, format="json")
    assert response.status_code == 201 and response.json()["warning"] == warnings[0]
    Hold.objects.all().delete()

    assert ctl(["facility", "hold", "rack:r1", "--reason", "swap", "--drain"]) == 0
    assert capsys.readouterr().out.strip() == f"rack:r1 held and draining: swap ({warnings[0]})"


def test_holding_a_held_domain_again_says_its_reason_was_replaced(pinned, api):
    assert api.post("/api/v1/facility/holds", {"domain": "rack:r2", "reason": "PDU swap"}, format="json").status_code == 201
    answer = api.post("/api/v1/facility/holds", {"domain": "rack:r2", "reason": "breaker test"}, format="json")
    assert answer.json()["warning"] == "rack:r2 was held already (PDU swap): its reason is now breaker test"
    assert Hold.objects.get(domain="rack:r2").reason == "breaker test"
    # The same reason again replaces nothing: nothing to say.
    assert api.post("/api/v1/facility/holds", {"domain": "rack:r2", "reason": "breaker test"}, format="json").json().get("warning") is None
