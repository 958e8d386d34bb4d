"""Thermal conditions on the console: the timeline and the missing data on the Facility page (and over its
socket), and a node's condition with its reading and age on the node's page."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.utils import timezone

from facility.evaluation import conditions_evaluate
from facility.models import SourceStatus
from facility.services import facility_apply, scenario_start

pytestmark = pytest.mark.django_db

CRAC = Path(__file__).resolve().parents[2] / "llmgw" / "demo" / "scenarios" / "crac-failure.yaml"


@pytest.fixture
def viewer(client, make_user):
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    return client


def replay(minutes: float) -> None:
    """crac-failure from ``minutes`` ago, evaluated every 30 s up to now (a fake clock)."""
    now = timezone.now()
    start = now - timedelta(minutes=minutes)
    scenario_start(data=yaml.safe_load(CRAC.read_text()), started_at=start)
    moment = start
    while moment <= now:
        conditions_evaluate(now=moment)
        moment += timedelta(seconds=30)


def test_facility_page_shows_the_timeline_and_the_missing_data(viewer, join_node):
    join_node("gpu01", rack="r1-01")
    join_node("gpu09", rack="r9-09")  # no scenario track: no fresh reading
    facility_apply(text="facility:\n  sources:\n    agents: false\n")
    page = viewer.get("/facility/").content.decode()
    assert "No condition has changed yet." in page and "No facility source has reported yet." in page
    replay(14)
    SourceStatus.objects.create(name="prometheus", up=False, last_error="ConnectError: refused")
    page = viewer.get("/facility/").content.decode()
    timeline = page[page.index('id="condition-events"'):]
    rows = timeline[: timeline.index("</table>")]
    # Newest first: r1-01 went ok → warm → hot.
    to_hot = '<span class="cond-warm">warm</span></td><td><span class="cond-hot">hot</span>'
    to_warm = '<span class="cond-ok">ok</span></td><td><span class="cond-warm">warm</span>'
    assert rows.index(to_hot) < rows.index(to_warm) and "rack:r1-01" in rows and "hot above 32 °C" in rows
    missing = page[page.index('id="missing-data"'):page.index('id="condition-events"')]
    assert "source prometheus down: ConnectError: refused (last success never)" in missing
    assert "with no fresh reading: " in missing and "rack:r9-09" in missing and "rack:r1-01" not in missing


def test_node_page_shows_the_worst_of_its_domains_with_reading_and_age(viewer, join_node):
    join_node("gpu01", rack="r1-01", pdu="r1-01-a")
    join_node("gpu09", rack="r9-09")
    facility_apply(text="facility:\n  sources:\n    agents: false\n")
    replay(14)
    line = viewer.get("/nodes/gpu01/").content.decode()
    line = line[line.index('id="node-condition"'):]
    line = line[: line.index("</p>")]
    assert 'cond-hot">hot<' in line and "from rack:r1-01 (observe mode: would refuse new replicas)" in line
    # The rack's latest reading, named as the rack's (the node's own inlet sensor is shown apart), with its
    # source and how long it has stood above the edge and how old it is, counted up live by the page.
    assert 'rack:r1-01 inlet <strong class="inlet-domain">35.0 °C</strong> for <time class="since" data-since="' in line
    assert "hot above 32 °C" in line and '(simulated, read <time class="since" data-since="' in line
    other = viewer.get("/nodes/gpu09/").content.decode()
    other = other[other.index('id="node-condition"'):]
    assert 'cond-unknown">unknown<' in other[: other.index("</p>")]


def test_the_facility_socket_sends_the_conditions_partial(join_node):
    from agents.consumers import FacilityConsumer

    join_node("gpu01", rack="r1-01")
    replay(14)
    consumer = FacilityConsumer()
    consumer.scope = {"user": None}
    consumer.filter = ""
    html = consumer.html()
    assert '<section class="card" id="facility-conditions" hx-swap-oob="true">' in html
    assert "rack:r1-01" in html[html.index('id="condition-events"'):]


def test_an_inlet_above_the_hot_edge_for_less_than_the_entry_time_says_when_it_turns_hot(viewer, join_node):
    """35 °C for 30 s is not hot yet (it takes 2 min): the pages say ok, and beside the reading how long it
    has stood above 32 °C and that it turns hot once it stays there 2 min, not "ok" beside 35 °C alone."""
    join_node("gpu01", rack="r1-01")
    facility_apply(text="facility:\n  sources:\n    agents: false\n    static: {rack:r1-01: {inlet_temp_c: 35}}\n")
    now = timezone.now()
    conditions_evaluate(now=now - timedelta(seconds=30))
    conditions_evaluate(now=now)
    since = round((now - timedelta(seconds=30)).timestamp())
    words = f'above 32 °C for <time class="since" data-since="{since}"></time>: hot once it stays there 2 min'
    line = viewer.get("/nodes/gpu01/").content.decode()
    line = line[line.index('id="node-condition"'):]
    line = line[: line.index("</p>")]
    assert 'cond-ok">ok<' in line and '<strong class="inlet-domain">35.0 °C</strong>' in line
    assert words in line, line
    assert words in viewer.get("/facility/").content.decode()
