"""The console in Chromium: log in, filter Nodes by rack, Location…, a misspelt key, hold a rack, live heartbeats."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.conftest import node_spec

pytestmark = pytest.mark.browser


def join(name: str, *, rack: str, pdu: str | None = None, sensors: dict | None = None):
    """A node's heartbeat through the service (its agent's first POST)."""
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for

    body = heartbeat_for(node_spec(name, rack=rack, pdu=pdu, labels={"llmgw.io/room": "hall-a", "llmgw.io/row": "12"}))
    if sensors and sensors.get("cpu_power_watts") is not None:
        # A reading 1 W above first: one reading alone never sets the measured peak (the window's
        # second-highest does), so the node's figure is the one given.
        body["sensors"] = {**sensors, "cpu_power_watts": sensors["cpu_power_watts"] + 1}
        heartbeat_record(node_name=name, heartbeat=body)
    body["sensors"] = sensors or {}
    return heartbeat_record(node_name=name, heartbeat=body)


def readings(temperature: float, *, cpu: float = 50) -> dict:
    return {
        "gpus": [
            {"index": i, "temperature_celsius": temperature, "power_watts": 350, "power_limit_watts": 700}
            for i in range(8)
        ],
        "cpu_temperature_celsius": cpu,
        "cpu_power_watts": 200,
        "inlet_temperature_celsius": 23,
    }


@pytest.fixture
def racks(transactional_db):
    """gpu01, gpu02 in rack r12-07; gpu03 in r12-08."""
    join("gpu01", rack="r12-07", pdu="r12-07-a,r12-07-b", sensors=readings(60))
    join("gpu02", rack="r12-07", pdu="r12-07-a,r12-07-b", sensors=readings(62))
    join("gpu03", rack="r12-08", pdu="r12-08-a", sensors=readings(58))
    from facility.services import budget_set

    budget_set(domain="rack:r12-07", cap_watts=16000)
    budget_set(domain="rack:r12-08", cap_watts=4000)  # 3.35 kW of a 3.6 kW limit: near its cap
    budget_set(domain="pdu:r12-07-a", cap_watts=11000)


def test_log_in_and_filter_nodes_by_a_rack(racks, page):
    expect(page.locator("header .who")).to_have_text("facility")
    expect(page.locator("#node-table tbody tr")).to_have_count(3)
    page.fill("input[name=domain]", "rack:r12-08")
    page.press("input[name=domain]", "Enter")
    expect(page.locator("#node-table tbody tr")).to_have_count(1)
    expect(page.locator("#node-gpu03 td.where")).to_contain_text("rack r12-08 · pdu r12-08-a")
    assert "domain=rack%3Ar12-08" in page.url  # hx-push-url: the filtered view is a link to share


def test_set_a_nodes_rack_from_location_and_see_where_change(racks, page):
    page.goto("/nodes/gpu01/")
    page.click("summary:has-text('Location…')")
    page.fill("#location-form input[name=rack]", "r14-01")
    page.click("#location-form button.primary")
    # No node is in r14-01 yet: it asks first.
    expect(page.locator("#location-warning")).to_contain_text("no node is in rack r14-01 yet")
    page.click("#location-warning button[name=confirm]")
    expect(page.locator("#node-where")).to_contain_text("rack r14-01")
    page.goto("/nodes/?domain=rack:r14-01")
    expect(page.locator("#node-table tbody tr")).to_have_count(1)
    expect(page.locator("#node-gpu01 td.where")).to_contain_text("rack r14-01")


def test_a_misspelt_key_shows_the_error_and_saves_nothing(racks, page):
    from agents.models import StoreLabel

    page.goto("/nodes/gpu01/")
    page.click("summary:has-text('Location…')")
    page.fill("#location-form input[name=rack]", "r14-01")
    page.fill("#location-form input[name=more]", "llmgw.io/racks=r3")
    page.click("#location-form button[type=submit]")
    expect(page.locator("#location-form .error")).to_contain_text(
        "labels: unknown label key 'llmgw.io/racks': the llmgw.io/ keys are"
    )
    expect(page.locator("#node-where")).to_contain_text("rack r12-07")
    assert not StoreLabel.objects.exists()


def test_hold_a_rack_and_see_its_nodes_held(racks, page):
    page.goto("/nodes/gpu01/")
    page.click("summary:has-text('Hold rack r12-07')")
    page.fill("#hold-form input[name=reason]", "PDU swap")
    page.click("#hold-form button[type=submit]")
    page.click("#hold-confirm")  # after its preview
    expect(page.locator("#node-state")).to_have_text("held")
    expect(page.locator("#node-live .hold-note")).to_contain_text("rack:r12-07 held: PDU swap")
    page.goto("/nodes/")
    expect(page.locator("#node-gpu01 .badge")).to_have_text("held")
    expect(page.locator("#node-gpu02 .badge")).to_have_text("held")
    expect(page.locator("#node-gpu03 .badge")).to_have_text("ready")
    page.goto("/facility/")
    expect(page.locator("#rack-r12-07 .tile-held")).to_have_text("held")
    expect(page.locator("#rack-r12-08")).to_have_class("tile p-near c-unknown n-unknown")


def test_a_heartbeat_changes_the_open_page_without_a_reload(racks, page, server):
    from agents.services import node_token_create
    from agents.simulator.cluster import heartbeat_for

    token = node_token_create(node_name="gpu01")

    def beat(sensors: dict) -> None:
        body = heartbeat_for(node_spec("gpu01", rack="r12-07", pdu="r12-07-a,r12-07-b",
                                       labels={"llmgw.io/room": "hall-a", "llmgw.io/row": "12"}))
        body["sensors"] = sensors
        response = httpx.post(
            f"{server}/api/v1/agents/heartbeat", json=body, headers={"Authorization": f"Token {token}"}, timeout=10
        )
        assert response.status_code == 200, response.text

    expect(page.locator("#live-status")).to_have_attribute("data-state", "open")
    expect(page.locator("#node-gpu01 td.temp")).to_have_text("60 °C")
    page.evaluate("window.notReloaded = true")
    beat(readings(88))
    expect(page.locator("#node-gpu01 td.temp")).to_have_text("88 °C")
    expect(page.locator("#node-gpu02 td.temp")).to_have_text("62 °C")
    # Only its readings changed since: the socket sends the cells, swapped into the row in place.
    beat(readings(93))
    expect(page.locator("#node-gpu01 td.temp")).to_have_text("93 °C")
    expect(page.locator("#node-gpu01 > td")).to_have_count(7)
    expect(page.locator("#node-gpu01 td.power .age time.since")).to_have_count(1)
    assert page.evaluate("window.notReloaded") is True

    page.goto("/nodes/gpu01/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "open")
    page.evaluate("window.notReloaded = true")
    beat(readings(91, cpu=67))
    expect(page.locator("#cpu-temp")).to_have_text("67 °C")
    expect(page.locator("#gpu-0 td.gpu-temp")).to_have_text("91 °C")
    assert page.evaluate("window.notReloaded") is True
