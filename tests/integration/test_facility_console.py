"""The Facility page at scale, below the browser: one hold flow (preview, warnings, the operator's reason) for
every interface, the overview read while nodes join, the socket sending only what changed, heat with power."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from facility.models import Hold
from llmgw.ctl import main as ctl
from llmgw.errors import InvalidInput

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pinned(join_node):
    """One replica whose selector allows only rack r1: draining r1 leaves it nowhere to go."""
    from placement.reconcile import reconcile_all
    from placement.services import models_apply

    join_node("a1", rack="r1", pdu="r1-a", labels={"llmgw.io/room": "hall-a", "llmgw.io/row": "1"})
    join_node("b1", rack="r2", pdu="r2-a", labels={"llmgw.io/room": "hall-a", "llmgw.io/row": "1"})
    models_apply(text="kind: Model\nname: m\nreplicas: 1\nprofile:\n  gpus: 8\n  command: serve\n"
                 "  node_selector: \"llmgw.io/rack = r1\"\n")
    reconcile_all()


def test_the_preview_is_the_dry_run_with_the_operators_reason_and_the_warnings_every_interface_gives(
    pinned, client, make_user, api, capsys
):
    from placement.services import hold_preview

    preview = hold_preview(domain="rack:r1", reason="PDU swap", drain=True)
    assert (preview.domain, preview.reason, preview.drain, preview.held_already) == ("rack:r1", "PDU swap", True, False)
    assert preview.what_if["nodes"] == ["a1"]
    [blocked] = preview.what_if["blocked"]
    assert "rack r1 is held: PDU swap" in blocked["reason"] and "what-if" not in blocked["reason"]
    assert preview.warnings == [f"m#1 could not move: {blocked['reason']}"]
    assert not Hold.objects.exists()
    with pytest.raises(InvalidInput) as refused:
        hold_preview(domain="rack:r1", reason=" ")
    assert refused.value.field == "reason"

    user, _ = make_user("op1", "operator")
    client.force_login(user)
    # The console: the preview (in place, htmx), then the hold once confirmed.
    page = client.post("/facility/holds", {"domain": "rack:r1", "reason": "PDU swap", "drain": "1"},
                       HTTP_HX_REQUEST="true").content.decode()
    assert page.startswith('<section class="card" id="hold-any">') or 'id="hold-any"' in page[:200]
    assert preview.warnings[0] in page.replace("&#x27;", "'") and "Hold rack:r1 anyway" in page
    assert not Hold.objects.exists()
    # Changed since its preview (no drain now): previewed again, not held.
    again = client.post("/facility/holds", {"domain": "rack:r1", "reason": "PDU swap", "confirm": "1",
                                            "previewed": "rack:r1|1"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'id="hold-preview"' in again and not Hold.objects.exists()
    done = client.post("/facility/holds", {"domain": "rack:r1", "reason": "PDU swap", "drain": "1", "confirm": "1",
                                           "previewed": "rack:r1|1"}, HTTP_HX_REQUEST="true").content.decode()
    assert "rack:r1 held and draining: PDU swap" in done
    assert '<section class="card" id="holds" hx-swap-oob="true">' in done  # the card at once, not after the socket
    Hold.objects.all().delete()

    # The API and ctl: the hold, with the same warning.
    response = api.post("/api/v1/facility/holds", {"domain": "rack:r1", "reason": "PDU swap", "drain": True},
                        format="json")
    assert response.status_code == 201 and response.json()["warning"] == preview.warnings[0]
    Hold.objects.all().delete()
    assert ctl(["facility", "hold", "rack:r1", "--reason", "PDU swap", "--drain"]) == 0
    assert capsys.readouterr().out.strip() == f"rack:r1 held and draining: PDU swap ({preview.warnings[0]})"
    assert ctl(["facility", "release", "rack:r1"]) == 0
    assert not Hold.objects.exists()


def test_heat_ranks_with_power_and_rolls_up_to_rows_and_rooms(pinned):
    from facility.selectors import domain_figures
    from facility.services import budget_set, condition_override_set
    from facility.views import facility_context

    budget_set(domain="rack:r1", cap_watts=40000)
    use = domain_figures(domain="rack:r2").use_watts
    budget_set(domain="rack:r2", cap_watts=round(use / 0.9 / 0.95))  # 5% of its limit left: near
    budget_set(domain="pdu:r2-a", cap_watts=100000)
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC 3 alarm", seconds=3600)
    context = facility_context({})
    ranked = [(d["domain"], d["state"]) for d in context["worst"].object_list]
    assert ranked[0] == ("rack:r1", "hot")
    assert ranked.index(("rack:r2", "near")) < ranked.index(("pdu:r2-a", "ok"))
    # The row and room are hot because of r1: listed once, with the rack, not again on their own.
    assert not [d for d, _ in ranked if d.startswith(("row:", "room:", "site:"))]
    row = context["domains_by_name"]["row:1"]
    assert (row["rolled"], row["rolled_from"]) == ("hot", "rack r1")
    assert [f["domain"] for f in context["domains_by_name"]["rack:r1"]["folded"]][:2] == ["row:1", "room:hall-a"]
    # Observe (the default) says what enforce would do; over the power limit is always refused.
    rack = context["domains_by_name"]["rack:r1"]
    assert rack["actions"] == ["would refuse new replicas"]
    summary = {s["key"]: s["count"] for s in context["summary"]}
    assert summary["hot"] == 1 and summary["near"] == 1  # the rack, not its row, room and site as well
    assert summary["pdu-near"] == 0
    [room] = context["rack_map"]
    assert [r["name"] for row in room["rows"] for r in row["racks"]] == ["r1", "r2"]  # as they stand
    assert room["rows"][0]["rolled"] == {"condition": "hot", "from": "rack r1"}


def test_every_domain_says_what_shedding_does_or_would_do(pinned, client, make_user):
    from facility.models import FacilitySettings
    from facility.selectors import domain_figures
    from facility.services import budget_set, condition_override_set, facility_apply
    from facility.views import facility_context

    settings = FacilitySettings.load()
    settings.shedding = {"enabled": True, "shed_after": "10m", "interval": "5m",
                         "domains": {"rack:r1": {"enabled": True, "shed_after": "90s", "interval": "2h"}}}
    settings.save()
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC 3 alarm", seconds=3600)
    budget_set(domain="rack:r2", cap_watts=round(domain_figures(domain="rack:r2").use_watts / 2))  # past its limit
    context = facility_context({})
    by_name = context["domains_by_name"]
    # Observe mode (the default): a hot domain would be shed under enforce, by its own rule.
    assert by_name["rack:r1"]["actions"] == ["would refuse new replicas",
                                             "would shed a replica every 2 h after 90 s hot"]
    # Past its power limit it is shed whatever the mode, by the cluster's rule.
    assert by_name["rack:r2"]["actions"] == ["refuses new replicas: past its power limit",
                                             "sheds a replica every 5 min after 10 min past its power limit"]
    # The page says it in the worst-first list and in the domain's detail.
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    page = client.get("/facility/").content.decode()
    row = page[page.index('id="wf-rack-r1"'):]
    assert '<div class="would">would shed a replica every 2 h after 90 s hot</div>' in row[: row.index("</tr>")]
    detail = client.get("/facility/domains/rack:r2/").content.decode()
    assert "Sheds a replica every 5 min after 10 min past its power limit" in detail
    # Under enforce the hot domain is shed (no "would"); with shedding off nothing is said of it.
    facility_apply(text="facility:\n  conditions:\n    mode: enforce\n  shedding:\n    enabled: true\n")
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC 3 alarm", seconds=3600)
    assert facility_context({})["domains_by_name"]["rack:r1"]["actions"] == [
        "refuses new replicas", "sheds a replica every 5 min after 10 min hot"]
    facility_apply(text="facility:\n  conditions:\n    mode: enforce\n  shedding:\n    enabled: false\n")
    assert facility_context({})["domains_by_name"]["rack:r1"]["actions"] == ["refuses new replicas"]


@pytest.mark.slow
def test_the_facility_socket_sends_only_what_changed(pinned, make_user):
    from agents.consumers import FacilityConsumer
    from facility.services import budget_set
    from tests.integration.test_console import communicate

    budget_set(domain="rack:r1", cap_watts=40000)
    budget_set(domain="rack:r2", cap_watts=40000)
    user, _ = make_user("viewer1", "viewer")

    import json

    from facility.views import facility_fragments, fragment_hashes, hashes_text

    async def messages(socket) -> list[str]:
        found = []
        while not await socket.receive_nothing(timeout=3):
            found.append(await socket.receive_from(timeout=5))
        return found

    async def run(form: str) -> tuple[list[str], list[str]]:
        socket = communicate("/ws/facility/", user, FacilityConsumer)
        assert (await socket.connect())[0]
        await socket.send_to(text_data=form)
        first = await messages(socket)
        await sync_to_async(budget_set)(domain="rack:r2", cap_watts=9000)
        second = await messages(socket)
        await socket.disconnect()
        return first, second

    # A page that does not say what it shows (a reconnect): every part, after the mark that it caught up.
    first, second = async_to_sync(run)('{"filter": ""}')
    assert first[0] == FacilityConsumer.SYNCED
    for part in ('id="facility-summary"', 'id="holds"', 'id="rack-map"', 'id="worst-first"', 'id="capping"'):
        assert part in "".join(first)
    # A budget of r2: its tile, its list row (the order held) and the summary; not r1's tile, holds, the map.
    sent = "".join(second)
    assert 'id="rack-r2"' in sent and 'id="rack-r1"' not in sent and 'id="wf-rack-r2"' in sent
    assert 'id="holds"' not in sent and 'id="rack-map"' not in sent and 'id="capping"' not in sent
    assert not any("<tr" in message and "<button" in message for message in second)  # rows apart
    assert len(sent) < len("".join(first)) / 2

    # A page that says what it shows, as rendered just now: only the mark, then only what changes.
    budget_set(domain="rack:r2", cap_watts=40000)
    now = fragment_hashes(facility_fragments({}))
    body = {"map": now["map"][0], "worst": now["worst"][0], **now["map"][1], **now["worst"][1]}
    form = {"filter": "", "parts": hashes_text(body), "cards": hashes_text(now["cards"])}
    first, second = async_to_sync(run)(json.dumps(form))
    assert first == [FacilityConsumer.SYNCED]  # nothing the page shows had changed
    assert 'id="rack-r2"' in "".join(second) and 'id="rack-r1"' not in "".join(second)


def test_the_console_speaks_from_the_latest_reading():
    """Hot, then the inlet back under the band while hot waits to leave: the detail says the inlet now, never
    the reading that made it hot (which read 35.0 °C beside a node's 23 °C)."""
    from facility import conditions as cond

    thresholds = cond.Thresholds(enter_seconds=60, leave_seconds=300)
    state = cond.DomainState(condition=cond.HOT, since=0.0, above_hot_since=None, under_hot_band_since=1000.0)
    text = cond.describe(cond.HOT, state, {cond.INLET: 23.0}, 1040.0, "inlet 35.0 °C for 15 s, hot above 32 °C",
                         thresholds)
    assert text == "inlet 23.0 °C, under 31 °C for 40 s of the 5 min hot takes to leave"
    hot = cond.DomainState(condition=cond.HOT, since=0.0, above_hot_since=100.0)
    assert cond.describe(cond.HOT, hot, {cond.INLET: 35.2}, 460.0, "", thresholds) == (
        "inlet 35.2 °C for 6 min, hot above 32 °C"
    )
    assert cond.describe(cond.HOT, state, {cond.INLET: 23.0}, 1040.0, "cooling alarm", thresholds) == (
        "cooling alarm; inlet 23.0 °C now"
    )


def test_a_domains_history_for_its_chart(pinned, client, make_user):
    from datetime import timedelta

    from django.utils import timezone

    from facility.models import DomainSample, Resolution
    from facility.services import budget_set

    budget_set(domain="rack:r1", cap_watts=16000)
    now = timezone.now().replace(second=0, microsecond=0)
    DomainSample.objects.bulk_create([
        DomainSample(domain="rack:r1", resolution=Resolution.MINUTE, at=now - timedelta(minutes=m), use_watts=9000.4,
                     reserved_watts=8000, measured_peak_watts=None if m % 2 else 8500,
                     inlet_celsius=None if m == 1 else 24.0 + m) for m in range(3)
    ])
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    body = client.get("/facility/domains/rack:r1/history?range=48h").json()
    assert body["use"] == [9000, 9000, 9000] and body["measured"] == [8500, None, 8500]
    assert body["limit"] == 14400 and body["cap"] == 16000 and body["t"] == sorted(body["t"])
    assert body["text"] == "use against the 14.4 kW limit (16.0 kW cap)"
    # Inlet air against the thresholds, where a reading was kept (not the minute without one).
    assert body["inlet"]["values"] == [26.0, 24.0] and (body["inlet"]["warm"], body["inlet"]["hot"]) == (27.0, 32.0)
    assert len(body["inlet"]["t"]) == 2
    assert client.get("/facility/domains/rack:r1/history?range=30d").json()["t"] == []
    detail = client.get("/facility/domains/rack:r1/").content.decode()
    assert re.search(r'class="chart" id="chart-rack-r1" data-src="/facility/domains/rack:r1/history"', detail)
    assert client.get("/facility/domains/rack:nope/").status_code == 404


def test_history_keeps_each_domains_inlet_and_a_quarter_its_highest(pinned):
    from datetime import timedelta

    from django.utils import timezone

    from facility.history import history_record
    from facility.models import DomainSample, Resolution

    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=40)
    start -= timedelta(minutes=start.minute % 15)
    readings = {0: 24.5, 1: 31.0, 2: 26.0}

    def record(minute: int) -> None:
        from facility.models import DomainCondition

        at = start + timedelta(minutes=minute)
        DomainCondition.objects.update_or_create(domain="rack:r1", defaults={
            "condition": "ok", "readings": {"inlet_temp_c": {"value": readings.get(minute, 25.0), "at": at.timestamp(),
                                                              "source": "agents"}},
            "evaluated_at": at,
        })
        history_record(now=at + timedelta(seconds=5))

    for minute in range(16):
        record(minute)
    points = dict(DomainSample.objects.filter(domain="rack:r1", resolution=Resolution.MINUTE)
                  .values_list("at", "inlet_celsius"))
    assert points[start] == 24.5 and points[start + timedelta(minutes=1)] == 31.0
    quarter = DomainSample.objects.get(domain="rack:r1", resolution=Resolution.QUARTER, at=start)
    assert quarter.inlet_celsius == 31.0
    # A domain judged unknown (no fresh reading) keeps no inlet, whatever its last reading was.
    from facility.models import DomainCondition

    at = start + timedelta(minutes=16)
    DomainCondition.objects.update_or_create(domain="rack:r2", defaults={
        "condition": "unknown", "evaluated_at": at,
        "readings": {"inlet_temp_c": {"value": 40.0, "at": (at - timedelta(hours=1)).timestamp(), "source": "agents"}},
    })
    history_record(now=at + timedelta(seconds=5))
    assert DomainSample.objects.get(domain="rack:r2", resolution=Resolution.MINUTE, at=at).inlet_celsius is None
    assert DomainSample.objects.get(domain="rack:r1", resolution=Resolution.MINUTE, at=at).inlet_celsius == 25.0


def test_a_page_that_sends_without_pause_gets_its_last_state_rendered_not_a_render_each(pinned, make_user, monkeypatch):
    from agents.consumers import FacilityConsumer
    from tests.integration.test_console import communicate

    user, _ = make_user("viewer1", "viewer")
    rendered: list[str] = []
    render = FacilityConsumer.render

    def counted(self, **kwargs):
        rendered.append(self.detail)
        return render(self, **kwargs)

    monkeypatch.setattr(FacilityConsumer, "render", counted)

    async def run() -> None:
        socket = communicate("/ws/facility/", user, FacilityConsumer)
        assert (await socket.connect())[0]
        await socket.send_to(text_data='{"filter": ""}')
        for i in range(60):  # a script flipping the open detail: 60 asks in a moment
            await socket.send_to(text_data='{"detail": "%s"}' % ("rack:r1" if i % 2 else "rack:r2"))
        while not await socket.receive_nothing(timeout=2.5):
            await socket.receive_from(timeout=5)
        await socket.disconnect()

    async_to_sync(run)()
    # The page's greeting at once, then the last state it asked, at the tick: not 61 renders.
    assert len(rendered) <= 3 and rendered[0] == "" and rendered[-1] == "rack:r1"
