"""The Facility page left open while its counts change, in Chromium: what the live socket sends leaves the
page as a fresh load shows it (the summary, the rack map's headings and tiles, the worst-first list); a
condition judged long ago is shown stale; the history charts read on the 24-hour UTC clock."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from playwright.sync_api import expect

from tests.browser.test_console import join, readings
from tests.browser.test_facility import in_thread

pytestmark = pytest.mark.browser

# An element as a person's browser holds it: tags, attributes and text, with what htmx leaves while it
# swaps (its classes, hx-swap-oob) and the ages console.js counts up (a second apart between two pages)
# left out.
SHAPE = """(selector) => {
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { return node.textContent.replace(/\\s+/g, " ").trim(); }
    if (node.nodeType !== Node.ELEMENT_NODE) { return ""; }
    if (node.tagName === "TIME") { return "<time " + (node.dataset.since || "") + ">"; }
    const attrs = [...node.attributes].filter((a) => a.name !== "hx-swap-oob").map((a) => a.name === "class"
      ? "class=" + a.value.split(/\\s+/).filter((c) => c && !c.startsWith("htmx-")).sort().join(".")
      : a.name + "=" + a.value).sort();
    return "<" + node.tagName.toLowerCase() + " " + attrs.join(" ") + ">"
      + [...node.childNodes].map(walk).filter((t) => t).join("") + "</" + node.tagName.toLowerCase() + ">";
  };
  const found = document.querySelector(selector);
  return found ? walk(found) : null;
}"""


@pytest.fixture
def racks(transactional_db):
    """gpu01, gpu02 in rack r1-01 (3.35 kW each); gpu03 in r1-02, near its limit; room hall-a, row 12."""
    join("gpu01", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors=readings(60))
    join("gpu02", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors=readings(62))
    join("gpu03", rack="r1-02", pdu="r1-02-a", sensors=readings(58))
    from facility.services import budget_set

    budget_set(domain="rack:r1-01", cap_watts=16000)
    budget_set(domain="rack:r1-02", cap_watts=4000)  # 3.35 kW of a 3.6 kW limit: near


def test_what_the_socket_sends_leaves_the_page_as_a_fresh_load_shows_it(racks, redis_layer, redis_page):
    page = redis_page
    page.goto("/facility/")
    expect(page.locator("#live-status")).to_have_text("live")
    page.wait_for_selector("body[data-facility-synced]", state="attached")
    page.evaluate("window.notReloaded = true")
    expect(page.locator("#room-head-hall-a")).to_contain_text("1 near")

    def squeeze():
        from facility.services import budget_set

        budget_set(domain="rack:r1-01", cap_watts=7000)  # 6.7 kW of a 6.3 kW limit: over

    in_thread(squeeze)
    # The room's heading (an h3) and the tile come on their own, swapped in by id.
    expect(page.locator("#room-head-hall-a")).to_contain_text("1 over · 1 near")
    expect(page.locator("#rack-r1-01")).to_have_class(re.compile(r"\bp-over\b"))
    expect(page.locator("#summary-over")).to_contain_text("1 rack over")
    assert page.evaluate("window.notReloaded") is True
    assert page.locator("#rack-map h3").count() == 1
    assert page.locator("#rack-map h").count() == 0
    assert page.locator("#worst-first").count() == 1

    fresh = page.context.new_page()
    fresh.goto("/facility/")
    for region in ("#facility-summary", "#rack-map", "#worst-first"):
        assert page.evaluate(SHAPE, region) == fresh.evaluate(SHAPE, region), region
    fresh.close()


def test_a_condition_judged_long_ago_is_shown_stale(racks, page):
    from django.utils import timezone

    from facility.models import DomainCondition

    DomainCondition.objects.update_or_create(
        domain="rack:r1-02", defaults={"condition": "ok", "evaluated_at": timezone.now() - timedelta(hours=1)}
    )
    DomainCondition.objects.update_or_create(
        domain="rack:r1-01", defaults={"condition": "ok", "evaluated_at": timezone.now()}
    )
    page.goto("/facility/")
    banner = page.locator("#conditions-stale")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("Conditions not judged for 60 min: rack:r1-02.")
    expect(banner).to_contain_text("The evaluation that judges them has stopped")
    expect(banner).not_to_contain_text("rack:r1-01")
    expect(page.locator("#rack-r1-02 .tile-stale")).to_have_text("stale")
    expect(page.locator("#rack-r1-01 .tile-stale")).to_have_count(0)
    expect(page.locator("#wf-rack-r1-02 .badge.stale")).to_have_text("stale")

    # Judged again: the banner goes.
    DomainCondition.objects.filter(domain="rack:r1-02").update(evaluated_at=timezone.now())
    page.reload()
    expect(page.locator("#conditions-stale")).to_have_count(0)


def test_history_charts_read_on_the_24_hour_utc_clock_wherever_the_browser_is(racks, browser, server, operator, request):
    from datetime import UTC, datetime

    from django.utils import timezone

    from facility.models import DomainSample, Resolution
    from tests.browser.conftest import open_page

    now = timezone.now().replace(second=0, microsecond=0)
    DomainSample.objects.bulk_create(
        [DomainSample(domain="rack:r1-01", resolution=Resolution.MINUTE, at=now - timedelta(minutes=m),
                      use_watts=9000, reserved_watts=8000, measured_peak_watts=8500) for m in range(30)]
    )
    # A browser five hours behind UTC: the charts still read the server's clock.
    pages = open_page(browser, server, operator, request, timezone_id="America/New_York")
    page = next(pages)
    page.goto("/facility/")
    page.click("#rack-r1-01")
    chart = page.locator("#chart-rack-r1-01")
    expect(chart).to_have_attribute("data-drawn", "48h:30")
    plot = chart.locator(".u-over").first
    plot.scroll_into_view_if_needed()
    box = plot.bounding_box()
    plot.hover(position={"x": box["width"] * 0.5, "y": box["height"] * 0.5})
    time_value = chart.locator(".u-legend").first.locator(".u-series").first.locator(".u-value")
    expect(time_value).to_have_text(re.compile(r"^\d{1,2} [A-Z][a-z]{2} \d\d:\d\d UTC$"))
    shown = time_value.inner_text()
    at = datetime.strptime(f"{now.year} {shown[:-4]}", "%Y %d %b %H:%M").replace(tzinfo=UTC)
    assert now - timedelta(minutes=30) <= at <= now, (shown, now)
    next(pages, None)
