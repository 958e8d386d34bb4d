"""The Facility page a facility engineer runs a site from, in Chromium: one hold flow (preview first, in the
node menu too), forms that keep working after live updates, heat ranked with power (a hot rack first and
coloured hot, its row not ok), observe mode saying what enforce would do, history charts; and a server that
logs no exception while a thousand nodes join."""

from __future__ import annotations

import re
import threading

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import SERVER_LOGS, serve
from tests.browser.test_console import join, readings
from tests.browser.test_facility import in_thread

pytestmark = pytest.mark.browser


@pytest.fixture
def racks(transactional_db):
    """gpu01, gpu02 in rack r1-01 (dual-fed); gpu03 in r1-02, near its limit; room hall-a, row 12."""
    join("gpu01", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors=readings(60))
    join("gpu02", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors=readings(62))
    join("gpu03", rack="r1-02", pdu="r1-02-a", sensors=readings(58))
    from facility.services import budget_set

    budget_set(domain="rack:r1-01", cap_watts=16000)
    budget_set(domain="rack:r1-02", cap_watts=4000)  # 3.35 kW of a 3.6 kW limit: near


def test_release_works_after_a_live_update_swapped_the_holds_card(racks, redis_layer, redis_page):
    from facility.models import Hold
    from facility.services import hold_create

    page = redis_page
    hold_create(domain="rack:r1-01", reason="PDU swap")
    page.goto("/facility/")
    expect(page.locator("#live-status")).to_have_text("live")
    page.wait_for_selector("body[data-facility-synced]", state="attached")
    page.evaluate("document.getElementById('holds').dataset.fromPage = 'yes'")

    def hold_another():
        from llmgw.ctl import main as ctl

        assert ctl(["facility", "hold", "rack:r1-02", "--reason", "fan swap"]) == 0

    in_thread(hold_another)
    expect(page.locator("#hold-rack-r1-02")).to_be_visible()
    # The card is the socket's now, its Release form with a token of its own.
    expect(page.locator("#holds")).not_to_have_attribute("data-from-page", "yes")
    token = page.locator("#release-rack-r1-01 input[name=csrfmiddlewaretoken]")
    expect(token).to_have_attribute("value", re.compile(r"^\w{64}$"))
    page.click("#release-rack-r1-01 summary")
    page.click("#release-rack-r1-01 button[type=submit]")
    expect(page.locator("#hold-rack-r1-01")).to_have_count(0)
    expect(page.locator("#holds .error")).to_have_count(0)
    assert list(Hold.objects.values_list("domain", flat=True)) == ["rack:r1-02"]

    # A plain form post (no htmx) with the swapped-in card's token passes the CSRF check too.
    page.evaluate("""() => {
        const form = document.querySelector('#release-rack-r1-02 form');
        form.removeAttribute('hx-post');
        HTMLFormElement.prototype.submit.call(form);
    }""")
    page.wait_for_url("**/facility/")
    expect(page.locator("#holds")).to_contain_text("Nothing is held.")
    assert not Hold.objects.exists()


def test_hold_rack_from_the_node_menu_shows_its_preview_first(racks, page):
    from facility.models import Hold

    page.goto("/nodes/gpu01/")
    page.click("summary:has-text('Hold rack r1-01')")
    page.fill("#hold-form input[name=reason]", "PDU swap")
    page.check("#hold-form input[name=drain]")
    page.click("#hold-form button[type=submit]")
    preview = page.locator("#hold-preview")
    expect(preview).to_contain_text("Hold rack:r1-01 and drain it")
    expect(preview).to_contain_text("“PDU swap”")
    expect(preview).to_contain_text("2 nodes take nothing new: gpu01, gpu02")
    expect(preview).not_to_contain_text("what-if")
    assert not Hold.objects.exists()
    # Right under the button that asked for it, not at the foot of the page.
    button = page.locator("#hold-form button[type=submit]").first.bounding_box()
    shown = preview.bounding_box()
    assert 0 < shown["y"] - button["y"] < 150, (button, shown)
    page.click("#hold-confirm")
    expect(page.locator("#node-state")).to_have_text("held")
    hold = Hold.objects.get()
    assert (hold.domain, hold.reason, hold.drain) == ("rack:r1-01", "PDU swap", True)


def test_the_facility_hold_form_previews_in_kw_next_to_its_button(racks, page):
    from facility.models import Hold
    from placement.reconcile import reconcile_all
    from placement.services import models_apply

    models_apply(text="kind: Model\nname: llama\nreplicas: 2\nprofile:\n  gpus: 8\n  command: serve\n")
    reconcile_all()
    page.goto("/facility/")
    page.fill("#hold-form input[name=domain]", "rack:r1-01")
    page.fill("#hold-form input[name=reason]", "PDU swap")
    page.check("#hold-form input[name=drain]")
    page.click("#hold-form button[name=check]")
    preview = page.locator("#hold-preview")
    expect(preview).to_contain_text("Hold rack:r1-01 and drain it")
    text = preview.inner_text()
    assert " kW" in text and not re.search(r"\d W\b", text), text  # one unit: kW
    button = page.locator("#hold-form button[name=check]").bounding_box()
    assert 0 < preview.bounding_box()["y"] - button["y"] < 250
    assert not Hold.objects.exists()
    page.click("#hold-confirm")
    expect(page.locator("#hold-rack-r1-01")).to_be_visible()
    expect(page.locator("#hold-any .done")).to_contain_text("rack:r1-01 held and draining: PDU swap")


def test_a_hot_rack_is_first_coloured_hot_its_row_not_ok_and_observe_says_would_refuse(racks, page):
    from facility.services import condition_override_set

    condition_override_set(domain="rack:r1-01", condition="hot", reason="CRAC 3 alarm", seconds=3600)
    page.goto("/facility/")
    page.wait_for_selector("body[data-facility-synced]", state="attached")
    first = page.locator("#worst-rows tr").first
    expect(first).to_have_attribute("id", "wf-rack-r1-01")  # before r1-02, near its power limit
    expect(first).to_have_class("s-hot")
    expect(first.locator(".state")).to_have_text("hot")
    assert first.locator(".state").evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(179, 38, 30)"
    # Observe mode (the default): nothing is refused, and each place says what enforce would do.
    expect(first.locator(".actions")).to_have_text("would refuse new replicas")
    expect(page.locator("#facility-mode")).to_contain_text("Conditions in observe mode")
    expect(page.locator("#summary-hot")).to_contain_text("1 hot")

    tile = page.locator("#rack-r1-01")
    expect(tile.locator(".tile-cond")).to_have_text("hot")
    page.check("#map-card input[value=condition]")
    assert tile.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(242, 139, 130)"
    assert page.locator("#rack-r1-02").evaluate("e => getComputedStyle(e).backgroundColor") != "rgb(242, 139, 130)"

    # Its row (and room) carry the rack's condition: a row with a hot rack is not ok. The list names that
    # heat once, with the rack; the row and room are folded under it rather than listed again.
    expect(page.locator("#row-head-hall-a-12 .row-cond")).to_have_text("hot")
    expect(page.locator("#wf-row-12")).to_have_count(0)
    expect(page.locator("#wf-room-hall-a")).to_have_count(0)
    expect(first.locator(".folded")).to_contain_text("and so row:12, room:hall-a")

    # The colouring is kept across a reload.
    page.reload()
    page.wait_for_selector("body[data-facility-synced]", state="attached")
    assert page.locator("#map-card").get_attribute("data-colour") == "condition"

    # A rack's detail: what llmgw would do there, and its history chart with a range picker.
    page.click("#rack-r1-01")
    expect(page.locator("#domain-live")).to_contain_text("Would refuse new replicas")
    chart = page.locator("#chart-rack-r1-01")
    expect(chart.locator("button[data-range='48h']")).to_have_attribute("aria-pressed", "true")
    expect(chart.locator(".chart-note")).to_contain_text("No history yet")


def test_every_figure_is_the_latest_reading_its_time_above_counting_up(racks, page):
    from datetime import timedelta

    from django.utils import timezone

    from facility.evaluation import conditions_evaluate
    from facility.services import facility_apply, scenario_start

    facility_apply(text="facility:\n  sources:\n    agents: false\n")
    start = timezone.now() - timedelta(minutes=5)  # past the time a rack must stay above the edge to be hot
    scenario_start(data={"kind": "FacilityScenario", "name": "hot-aisle", "tracks": [
        {"domains": ["rack:r1-01"], "signal": "inlet_temp_c", "stale_after": "10m", "points": [["0s", 35.0], ["1h", 35.0]]},
    ]}, started_at=start)
    for seconds in range(0, 301, 30):
        conditions_evaluate(now=start + timedelta(seconds=seconds))
    page.goto("/facility/")
    expect(page.locator("#rack-r1-01 .tile-inlet")).to_have_text("inlet 35.0 °C")
    page.click("#rack-r1-01")
    line = page.locator("#domain-live .condition-line")
    expect(line.locator(".badge")).to_have_text("hot")
    expect(line.locator(".inlet")).to_have_text("inlet 35.0 °C")
    expect(line).to_contain_text("hot above 32 °C")
    expect(line.locator("time.since").first).to_have_text(re.compile(r"^[45] min$"))  # how long above the edge
    age = line.locator("time.since").last  # the reading's age: counted up by the page, never frozen
    expect(age).to_have_text(re.compile(r"^\d+ s$"))
    before = age.inner_text()
    expect(age).not_to_have_text(before, timeout=3000)
    # The node's page names the same latest reading as its rack's, beside the node's own sensor.
    page.goto("/nodes/gpu01/")
    condition = page.locator("#node-condition")
    expect(condition.locator(".badge")).to_have_text("hot")
    expect(condition.locator(".inlet-domain")).to_have_text("35.0 °C")
    expect(condition).to_contain_text("rack:r1-01 inlet 35.0 °C for")
    age = condition.locator("time.since").last
    expect(age).to_have_text(re.compile(r"^\d+ s$"))
    before = age.inner_text()
    expect(age).not_to_have_text(before, timeout=3000)


def test_history_charts_draw_power_against_the_limit_with_a_range_picker(racks, page):
    from datetime import timedelta

    from django.utils import timezone

    from facility.models import DomainSample, Resolution

    now = timezone.now().replace(second=0, microsecond=0)
    DomainSample.objects.bulk_create(
        [DomainSample(domain="rack:r1-01", resolution=Resolution.MINUTE, at=now - timedelta(minutes=m),
                      use_watts=9000 + 10 * m, reserved_watts=8000, measured_peak_watts=8500,
                      inlet_celsius=24 + m / 20) for m in range(120)]
        + [DomainSample(domain="rack:r1-01", resolution=Resolution.QUARTER, at=now - timedelta(minutes=15 * q),
                        use_watts=7000, reserved_watts=6000, measured_peak_watts=6500) for q in range(200)]
    )
    page.goto("/facility/")
    page.click("#rack-r1-01")
    chart = page.locator("#chart-rack-r1-01")
    # Power against the limit and cap; inlet air against the warm and hot thresholds.
    expect(chart.locator(".uplot")).to_have_count(2)
    expect(chart.locator(".chart-note")).to_contain_text("use against the 14.4 kW limit (16.0 kW cap)")
    expect(chart.locator(".u-legend").first).to_contain_text("limit")
    expect(chart.locator(".u-legend").nth(1)).to_contain_text("hot above")
    expect(chart.locator(".u-legend").nth(1)).to_contain_text("32.0 °C")
    # Values on hover: the legend follows the cursor.
    plot = chart.locator(".u-over").first
    plot.scroll_into_view_if_needed()
    box = plot.bounding_box()
    plot.hover(position={"x": box["width"] * 0.5, "y": box["height"] * 0.5})
    expect(chart.locator(".u-legend").first.locator(".u-series").nth(1)).to_contain_text(re.compile(r"\d+\.\d kW"))
    expect(chart).to_have_attribute("data-drawn", "48h:120")  # minute points
    chart.locator("button[data-range='30d']").click()
    expect(chart.locator("button[data-range='30d']")).to_have_attribute("aria-pressed", "true")
    expect(chart).to_have_attribute("data-drawn", "30d:200")  # quarter hours (no inlet kept in them here)
    expect(chart.locator(".uplot")).to_have_count(1)


# -- a thousand nodes joining ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def busy_server(django_db_setup, django_db_blocker):
    """A server whose periodic round (conditions judged, capping after them, a reconcile) runs twice a second,
    as nodes join (the embedded server's round is the reconcile's: LLMGW_RECONCILE_INTERVAL)."""
    yield from serve({"LLMGW_RECONCILE_INTERVAL": "0.5"})


@pytest.mark.timeout(1200)
def test_no_exception_is_logged_while_a_thousand_nodes_join(transactional_db, busy_server):
    from django.db import connection

    from agents.models import Node
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for
    from facility.services import facility_apply
    from tests.conftest import node_spec

    facility_apply(text="facility:\n  conditions: {mode: observe}\n  capping: {enabled: true}\n"
                        "  budgets:\n" + "".join(f"    - {{domain: 'rack:r{r:02}', cap_watts: 150000}}\n" for r in range(40)))
    failures: list[BaseException] = []

    def joins(first: int) -> None:
        try:
            for i in range(first, 1000, 4):
                body = heartbeat_for(node_spec(f"gpu{i:04}", rack=f"r{i // 25:02}", pdu=f"r{i // 25:02}-{'ab'[i % 2]}",
                                               labels={"llmgw.io/room": "hall-a", "llmgw.io/row": f"{i // 250}"}))
                body["sensors"] = readings(60)
                heartbeat_record(node_name=f"gpu{i:04}", heartbeat=body)
        except BaseException as exc:  # reported in the test's thread
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=joins, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert Node.objects.count() == 1000
    log = SERVER_LOGS[busy_server].read_text()
    assert "Traceback" not in log and "KeyError" not in log and " ERROR " not in log, log[-6000:]
