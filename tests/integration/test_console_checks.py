"""Checks before saving (a name no node is in, a limit passed) in the API, ctl and the console; the power
history: recorded, rolled up, pruned, served by the API and drawn on the pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from llmgw.ctl import main as ctl

pytestmark = pytest.mark.django_db


@pytest.fixture
def racks(join_node):
    join_node("gpu01", rack="r1-01", pdu="r1-01-a,r1-01-b")
    join_node("gpu02", rack="r1-02", pdu="r1-02-a")


def test_domain_warning_names_the_nearest_known_racks(racks):
    from facility.services import domain_warning

    assert domain_warning(domain="rack:r1-01") is None
    assert domain_warning(domain="rack:r1-10") == "no node is in rack r1-10 yet; known racks nearest that name: r1-01, r1-02"
    assert domain_warning(domain="row:7") == "no node is in row 7 yet; no node is in any row"


def test_the_api_refuses_a_domain_nothing_knows_unless_new(racks, api):
    from facility.models import Hold

    response = api.post("/api/v1/facility/holds", {"domain": "rack:r1-O1", "reason": "swap"}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "domain"
    assert response.json()["detail"] == (
        "domain: no node is in rack r1-O1 yet; known racks nearest that name: r1-01, r1-02; to hold a domain "
        "ahead of its nodes, say it is new (new: true; ctl: --new)"
    )
    assert not Hold.objects.exists()  # nothing half-applied
    response = api.post("/api/v1/facility/holds", {"domain": "rack:r1-O1", "reason": "swap", "new": True}, format="json")
    assert response.status_code == 201
    assert response.json()["warning"].startswith("no node is in rack r1-O1 yet; known racks nearest that name: r1-01")
    response = api.post("/api/v1/facility/holds", {"domain": "rack:r1-01", "reason": "swap"}, format="json")
    assert response.status_code == 201 and response.json()["warning"] is None


def test_labels_api_warns_of_a_new_rack(racks, api):
    response = api.post("/api/v1/nodes/gpu02/labels", {"labels": {"llmgw.io/rack": "r1-10"}}, format="json")
    assert response.status_code == 200
    assert "no node is in rack r1-10 yet" in response.json()["warning"]
    response = api.post("/api/v1/nodes/gpu02/labels", {"labels": {"llmgw.io/rack": "r1-01"}}, format="json")
    assert response.json()["warning"] is None


def test_a_move_past_a_limit_shows_the_figures(racks, api):
    from facility.services import budget_set, location_warnings

    budget_set(domain="rack:r1-01", cap_watts=10000)  # gpu01 uses 350 W (no replica), limit 9 kW
    budget_set(domain="rack:r1-01", cap_watts=700, other_watts=0)  # limit 630 W: 350 W in use
    warnings = location_warnings(node_name="gpu02", changes={"llmgw.io/rack": "r1-01"})
    assert warnings == ["rack r1-01 would be at 0.7 kW of its 0.6 kW limit (0.3 kW now + 0.3 kW): 0.1 kW over"]


def test_ctl_hold_of_a_misspelt_rack_fails_and_says_the_nearest(racks, capsys):
    from facility.models import Hold

    assert ctl(["facility", "hold", "rack:r1-1", "--reason", "x"]) != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "error: domain: no node is in rack r1-1 yet; known racks nearest that name: r1-01, r1-02; to hold a domain "
        "ahead of its nodes, say it is new (new: true; ctl: --new)\n"
    )
    assert not Hold.objects.exists()
    assert ctl(["facility", "hold", "rack:zz-99", "--reason", "x", "--new"]) == 0
    assert capsys.readouterr().out == (
        "rack:zz-99 held: x (no node is in rack zz-99 yet)\n"
    )


def test_ctl_hold_and_release_take_a_bare_name_and_suggest_held_ones(racks, capsys):
    from facility.services import budget_set

    assert ctl(["facility", "hold", "r1-01", "--reason", "PDU swap"]) == 0
    assert capsys.readouterr().out == "rack:r1-01 held: PDU swap\n"
    # A domain a budget names is known (a site set up before its nodes join), no --new needed.
    budget_set(domain="row:7", cap_watts=90000)
    assert ctl(["facility", "hold", "row:7", "--reason", "x"]) == 0
    capsys.readouterr()
    assert ctl(["facility", "release", "rack:r1-0"]) != 0
    assert capsys.readouterr().err == "error: rack:r1-0 is not held; held nearest that name: rack:r1-01\n"
    assert ctl(["facility", "release", "r1-01"]) == 0
    assert capsys.readouterr().out == "rack:r1-01 released\n"
    # A bare name nothing has is refused with the names nearest it.
    assert ctl(["facility", "hold", "r1-1", "--reason", "x"]) != 0
    assert capsys.readouterr().err == (
        "error: domain: nothing is named r1-1; known names nearest it: r1-01, r1-02; write level:name (rack:r1-1)\n"
    )


def test_console_hold_of_a_typo_asks_again_before_holding(racks, client, make_user):
    from facility.models import Hold

    user, _ = make_user("op1", "operator")
    client.force_login(user)
    page = client.post("/facility/holds", {"domain": "rack:r1-10", "reason": "swap"}).content.decode()
    assert "no node is in rack r1-10 yet; known racks nearest that name: r1-01" in page
    assert "Hold rack:r1-10 anyway" in page
    assert not Hold.objects.exists()
    response = client.post("/facility/holds", {"domain": "rack:r1-10", "reason": "swap", "confirm": "1"})
    assert response.status_code == 302
    assert Hold.objects.filter(domain="rack:r1-10").exists()


def test_console_location_typo_saves_only_when_confirmed(racks, client, make_user):
    from agents.models import StoreLabel

    user, _ = make_user("op1", "operator")
    client.force_login(user)
    page = client.post("/nodes/gpu02/location", {"rack": "r1-10"}).content.decode()
    assert "no node is in rack r1-10 yet; known racks nearest that name: r1-01" in page
    assert not StoreLabel.objects.exists()
    client.post("/nodes/gpu02/location", {"rack": "r1-10", "confirm": "1"})
    assert StoreLabel.objects.get(node_name="gpu02").value == "r1-10"


def test_history_recorded_rolled_up_pruned_and_served(racks, api):
    from facility.history import history_record
    from facility.models import DomainSample, NodeSample, Resolution

    start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    for minute in range(16):
        history_record(now=start + timedelta(minutes=minute, seconds=5))
    minutes = DomainSample.objects.filter(domain="rack:r1-01", resolution=Resolution.MINUTE)
    assert minutes.count() == 16
    quarter = DomainSample.objects.get(domain="rack:r1-01", resolution=Resolution.QUARTER)
    assert quarter.at == start and quarter.use_watts == pytest.approx(350)
    assert NodeSample.objects.filter(node_name="gpu01", resolution=Resolution.QUARTER).count() == 1
    response = api.get("/api/v1/facility/domains/rack:r1-01/history?hours=2")
    assert response.status_code == 200
    body = response.json()
    assert body["resolution_minutes"] == 1 and len(body["points"]) == 16
    assert body["points"][0]["use_watts"] == pytest.approx(350)
    assert api.get("/api/v1/facility/domains/rack:r1-01/history?hours=100").json()["resolution_minutes"] == 15
    assert api.get("/api/v1/facility/domains/rack:r1-01/history?hours=nan").status_code == 400
    empty = api.get("/api/v1/facility/domains/rack:r1-01/history?hours=")  # given, and no number
    assert (empty.status_code, empty.json()["field"]) == (400, "hours")
    assert api.get("/api/v1/facility/domains/nope/history").status_code == 400
    # Two days later the minute points are gone, the quarter stays; 31 days later it is gone too.
    history_record(now=start + timedelta(hours=49))
    assert not DomainSample.objects.filter(resolution=Resolution.MINUTE, at__lt=start + timedelta(hours=1)).exists()
    assert DomainSample.objects.filter(resolution=Resolution.QUARTER, at=start).exists()
    history_record(now=start + timedelta(days=31))
    assert not DomainSample.objects.filter(resolution=Resolution.QUARTER, at=start).exists()


def test_facility_page_sorts_worst_first_filters_and_draws_history(racks, client, make_user):
    from facility.history import history_record
    from facility.services import budget_set

    budget_set(domain="rack:r1-02", cap_watts=400)  # 350 W of a 360 W limit: near
    budget_set(domain="rack:r1-01", cap_watts=20000)
    now = timezone.now()
    for minutes in (40, 20, 0):
        history_record(now=now - timedelta(minutes=minutes))
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    page = client.get("/facility/").content.decode()
    assert page.index('id="wf-rack-r1-02"') < page.index('id="wf-rack-r1-01"')  # near before ok
    assert page.index('id="rack-r1-01"') < page.index('id="rack-r1-02"')  # the map: as they stand
    assert "left-near" in page and "W left" in page
    assert "use</strong> = the domain's other draw" in page
    assert "measured</strong> in the last 15 minutes" in page  # the measured window, as set
    # A rack's detail: its bar (a dual-fed rack's note) and its history chart, drawn from the JSON.
    detail = client.get("/facility/domains/rack:r1-01/").content.decode()
    assert "each feed is sized to carry the rack alone" in detail and 'class="chart"' in detail
    assert len(client.get("/facility/domains/rack:r1-01/history").json()["t"]) == 3
    filtered = client.get("/facility/?q=gpu02", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="rack-r1-02"' in filtered and 'id="rack-r1-01"' not in filtered
    assert filtered.startswith('\n<div id="facility-body"') or 'id="facility-body"' in filtered[:200]


def test_temperature_colour_follows_the_shown_value():
    from agents.views import temperature_class

    assert temperature_class(74.6) == temperature_class(75.4) == "warm"
    assert temperature_class(74.4) == ""
    assert temperature_class(84.5) == "hot"


def test_facility_apply_warns_of_a_budget_no_node_is_in_where_nodes_are_in_others(racks, capsys, tmp_path):
    server = tmp_path / "server.yaml"
    server.write_text(
        "facility:\n  budgets:\n"
        "    - {domain: rack:r1-01, cap_watts: 16000}\n"
        "    - {domain: rack:r1-1, cap_watts: 16000}\n"   # a typo of r1-01
        "    - {domain: row:7, cap_watts: 90000}\n"       # no node is in any row yet: a site ahead of its nodes
    )
    assert ctl(["facility", "apply", "-f", str(server)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{server}: applied (3 budgets created, 0 updated, 0 removed)",
        "warning: budget rack:r1-1: no node is in rack r1-1 yet; known racks nearest that name: r1-01, r1-02",
    ]


def test_a_domain_with_only_a_stale_condition_left_is_no_longer_listed(racks):
    # A label typo reverted leaves the typo's rack a condition row, unknown once the agents' readings
    # are stale; a rack the site's own sources read stays listed, unknown or not: there it is the alarm.
    from facility.models import ConditionOverride, DomainCondition
    from facility.selectors import facility_overview

    def read_by(source: str) -> dict:
        return {"inlet_temp_c": {"value": 24.0, "at": 0.0, "source": source}}

    DomainCondition.objects.create(domain="rack:r1-1", condition="unknown", readings=read_by("agents"))
    DomainCondition.objects.create(domain="rack:r1-3", condition="ok", readings=read_by("agents"))  # still fresh
    DomainCondition.objects.create(domain="rack:r9-09", condition="unknown", readings=read_by("prometheus"))
    DomainCondition.objects.create(domain="rack:r9-10", condition="unknown", readings=read_by("agents"))
    ConditionOverride.objects.create(domain="rack:r9-10", condition="ok", reason="probe fault")
    listed = {row["domain"] for row in facility_overview()["domains"]}
    assert "rack:r1-1" not in listed
    assert {"rack:r1-3", "rack:r9-09", "rack:r9-10", "rack:r1-01"} <= listed
