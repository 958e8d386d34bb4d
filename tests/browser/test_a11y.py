"""Accessibility of every console page in Chromium: axe-core (vendored under tests/browser/vendor, for the
tests only) finds no serious or critical violation on the login page, Nodes (filtered too), a node's page
(its menus open), Facility, Models and a model's page, with a cluster that shows every state a page
colours: ready, held, cordoned, not-ready and stale nodes, warm and hot cards and racks, throttling, racks ok,
tight, near and over their limits, placed and pending replicas. Every power bar's fill stands out from its
track (3:1, WCAG's non-text contrast, which axe does not check). The node page's menus close on Escape,
one open at a time, the focus back on the button that opened it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import PASSWORD
from tests.browser.test_console import join, readings
from tests.browser.test_facility import in_thread

pytestmark = pytest.mark.browser

AXE = Path(__file__).parent / "vendor" / "axe-4.14.1.min.js"
# The level the console holds to: WCAG 2.1 A and AA, and axe's best practices.
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]

RUN_AXE = """async (tags) => {
  const result = await axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
  return result.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map(n => n.target.join(' ') + ' — ' + n.failureSummary.replace(/\\s+/g, ' ')),
  }));
}"""

# Each bar's fill against the track it sits in: the WCAG contrast ratio of their background colours.
BAR_CONTRAST = """() => {
  function rgb(text) { return text.match(/[\\d.]+/g).slice(0, 3).map(Number); }
  function luminance(c) {
    const [r, g, b] = c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  }
  function ratio(a, b) { const [x, y] = [luminance(a), luminance(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); }
  const out = [];
  document.querySelectorAll('.bar .fill, .minibar span').forEach(fill => {
    const track = fill.parentElement;
    const f = getComputedStyle(fill).backgroundColor, t = getComputedStyle(track).backgroundColor;
    if (getComputedStyle(fill).backgroundImage !== 'none' || f === 'rgba(0, 0, 0, 0)') { return; }
    out.push({bar: (track.closest('[id]') || track).id + ' ' + track.className + ' ' + fill.className,
              ratio: Math.round(ratio(rgb(f), rgb(t)) * 100) / 100});
  });
  return out;
}"""


def serious_violations(page) -> list[dict]:
    """axe-core's serious and critical violations on the page as it is now."""
    page.add_script_tag(path=str(AXE))
    found = page.evaluate(RUN_AXE, AXE_TAGS)
    return [v for v in found if v["impact"] in ("serious", "critical")]


def problems(page, what: str) -> list[str]:
    """What axe finds serious or critical on the page, and the bars under 3:1, in words (none: [])."""
    found = [
        f"{what}: {v['id']} ({v['impact']}, {len(v['nodes'])}): {v['help']}\n    " + "\n    ".join(v["nodes"][:8])
        for v in serious_violations(page)
    ]
    weak = [bar for bar in page.evaluate(BAR_CONTRAST) if bar["ratio"] < 3]
    if weak:
        found.append(f"{what}: bars whose fill is under 3:1 against their track: {weak}")
    return found


@pytest.fixture
def cluster(transactional_db):
    """Every state the pages colour, made through the services (in a thread of their own: the live updates
    they send must not wait for Playwright's loop)."""

    def build():
        from django.utils import timezone

        from agents.models import Node
        from agents.services import node_cordon
        from facility.services import budget_set, hold_create
        from llmgw.ctl import main as ctl
        from placement.reconcile import reconcile_all
        from placement.services import models_apply

        hot = readings(88)
        hot["gpus"][0]["throttle_reasons"] = ["sw_thermal", "sw_power_cap"]
        join("gpu01", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors=hot)
        join("gpu02", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors=readings(77))
        join("gpu03", rack="r1-02", pdu="r1-02-a", sensors=readings(58))
        join("gpu04", rack="r1-03", pdu="r1-03-a", sensors=readings(60))
        join("gpu05", rack="r1-04", pdu="r1-04-a", sensors=readings(61))
        join("gpu06", rack="r1-05", pdu="r1-05-a", sensors=readings(62))
        join("gpu07", rack="r1-05", pdu="r1-05-a", sensors=readings(63))
        budget_set(domain="rack:r1-01", cap_watts=16000)  # ok
        budget_set(domain="rack:r1-02", cap_watts=4000)  # near
        budget_set(domain="rack:r1-03", cap_watts=3000)  # over
        budget_set(domain="rack:r1-04", cap_watts=4600)  # tight
        hold_create(domain="rack:r1-05", reason="PDU swap")
        node_cordon(node_name="gpu04", cordoned=True, reason="fan")
        long_ago = timezone.now() - timedelta(hours=3)
        Node.objects.filter(name="gpu07").update(last_heartbeat_at=long_ago, sensors_at=long_ago)
        assert ctl(["facility", "condition", "set", "rack:r1-02", "hot", "--reason", "CRAC 3", "--for", "1h"]) == 0
        assert ctl(["facility", "condition", "set", "rack:r1-04", "warm", "--reason", "CRAC 4", "--for", "1h"]) == 0
        models_apply(text="kind: Model\nname: llama\nreplicas: 1\nprofile: {gpus: 8}\n")
        models_apply(text="kind: Model\nname: big\nreplicas: 4\nclass: batch\nprofile: {gpus: 8}\n")
        reconcile_all()

    in_thread(build)


def test_every_console_page_has_no_serious_violation(cluster, page, browser, server):
    login = browser.new_context(base_url=server, viewport={"width": 1440, "height": 900}).new_page()
    found: list[str] = []
    login.goto("/login/")
    found += problems(login, "login")
    login.fill("input[name=username]", "nobody")
    login.fill("input[name=password]", PASSWORD)
    login.click("button[type=submit]")
    expect(login.locator(".login .error")).to_be_visible()
    found += problems(login, "login, refused")
    login.context.close()

    for url, ready in (
        ("/nodes/", "#node-gpu01"),
        ("/nodes/?domain=r1-9", "#filter-suggestions"),
        ("/nodes/?domain=rack", "#filter-error"),
        ("/nodes/gpu01/", "#node-live"),
        ("/facility/", "#rack-r1-01"),
        ("/models/", "#model-big .pending-group"),
        ("/models/big/", "#model-big"),
    ):
        page.goto(url)
        expect(page.locator(ready).first).to_be_visible()
        expect(page.locator("#live-status")).to_have_text("live")
        found += problems(page, url)

    page.goto("/nodes/gpu01/")
    for menu in ("Location…", "Hold rack r1-01", "Cordon"):
        page.locator("summary", has_text=menu).click()
        found += problems(page, f"/nodes/gpu01/ with {menu} open")
    assert not found, "\n".join(found)


def test_menus_close_on_escape_one_at_a_time_and_give_the_focus_back(cluster, page):
    page.goto("/nodes/gpu01/")
    location = page.locator("#node-menu details.action", has=page.locator("summary", has_text="Location…"))
    cordon = page.locator("#node-menu details.action", has=page.locator("summary", has_text="Cordon"))
    location.locator("summary").click()
    expect(location).to_have_attribute("open", "")
    page.locator("#location-form input[name=rack]").focus()

    cordon.locator("summary").click()  # another menu opens: the first closes
    expect(cordon).to_have_attribute("open", "")
    expect(location).not_to_have_attribute("open", "")
    expect(page.locator("#node-menu details.action[open]")).to_have_count(1)

    page.locator("#node-menu details.action[open] input[name=reason]").focus()
    page.keyboard.press("Escape")
    expect(page.locator("#node-menu details.action[open]")).to_have_count(0)
    assert page.evaluate("document.activeElement.textContent") == "Cordon"

    # From the keyboard alone: Enter opens the focused menu, Escape closes it where it was opened.
    location.locator("summary").focus()
    page.keyboard.press("Enter")
    expect(location).to_have_attribute("open", "")
    page.keyboard.press("Escape")
    expect(location).not_to_have_attribute("open", "")
    assert page.evaluate("document.activeElement.textContent") == "Location…"
