"""The Nodes filter in Chromium: a bare rack name, a key=value label, both at once, the `rack:` form still;
a name or a label value no node has gets suggestions on the page; filtering while heartbeats stream in
leaves no htmx error (a live row of a node the new filter hides is not swapped in)."""

from __future__ import annotations

import threading

import pytest
from playwright.sync_api import expect

from tests.browser.test_console import join, readings

pytestmark = pytest.mark.browser

NODES = (("gpu01", "r12-07", "r12-07-a"), ("gpu02", "r12-07", "r12-07-b"), ("gpu03", "r12-08", "r12-08-a"),
         ("gpu04", "r13-01", "r13-01-a"))


@pytest.fixture
def racks(transactional_db):
    """gpu01, gpu02 (H200) in rack r12-07; gpu03 (H100) in r12-08; gpu04 (H200) in r13-01."""
    from agents.services import labels_set

    for name, rack, pdu in NODES:
        join(name, rack=rack, pdu=pdu, sensors=readings(60))
    for name, model in (("gpu01", "H200"), ("gpu02", "H200"), ("gpu03", "H100"), ("gpu04", "H200")):
        labels_set(node_name=name, changes={"gpu.model": model}, set_by="test")


def rows(page):
    return page.locator("#node-table tbody tr[id]")


def filter_by(page, text: str) -> None:
    page.fill("input[name=domain]", text)
    page.press("input[name=domain]", "Enter")


def test_a_bare_rack_a_label_and_both(racks, page):
    filter_by(page, "r12-07")
    expect(rows(page)).to_have_count(2)
    assert "domain=r12-07" in page.url
    filter_by(page, "gpu.model=H200")
    expect(rows(page)).to_have_count(3)
    filter_by(page, "gpu.model = H200 r12-07")  # the node_selector's spacing, and two terms
    expect(rows(page)).to_have_count(2)
    filter_by(page, "rack:r12-08")
    expect(rows(page)).to_have_count(1)
    expect(page.locator("#node-gpu03")).to_be_visible()
    filter_by(page, "pdu:r13-01-a gpu.model=H200")
    expect(rows(page)).to_have_count(1)
    expect(page.locator("#node-gpu04")).to_be_visible()
    expect(page.locator("#filter-suggestions")).to_have_count(0)


def test_an_unknown_rack_or_label_value_gets_suggestions(racks, page):
    filter_by(page, "r12-7")
    expect(rows(page)).to_have_count(0)
    hint = page.locator("#filter-suggestions")
    expect(hint).to_contain_text("No node is in rack r12-7. Did you mean r12-07, r12-08?")
    hint.get_by_role("link", name="r12-07").click()
    expect(rows(page)).to_have_count(2)
    expect(page.locator("input[name=domain]")).to_have_value("r12-07")

    filter_by(page, "r12-07 gpu.model=h200")
    expect(hint).to_contain_text("No node has gpu.model=h200. Did you mean gpu.model=H200?")
    hint.get_by_role("link", name="gpu.model=H200").click()
    expect(rows(page)).to_have_count(2)
    expect(page.locator("input[name=domain]")).to_have_value("r12-07 gpu.model=H200")

    filter_by(page, "gpu.modle=H100")
    expect(hint).to_contain_text("No node has a gpu.modle label. Did you mean gpu.model=H100?")
    filter_by(page, "rack:r99-99")
    expect(hint).to_contain_text("No node is in rack r99-99. No name is close to it.")
    filter_by(page, "rack")
    expect(page.locator("#filter-error")).to_contain_text("domain: 'rack' is not a domain: write level:name")


def test_filtering_while_heartbeats_stream_in_leaves_no_htmx_error(racks, redis_layer, redis_page):
    """The page fixture fails the test on any error in the browser's console (htmx:oobErrorNoTarget)."""
    from django.db import connection

    page = redis_page
    page.goto("/nodes/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "open")
    stop = threading.Event()

    def beat():
        try:
            temperature = 50
            while not stop.is_set():
                temperature = 50 + (temperature + 1) % 30
                for name, rack, pdu in NODES:
                    join(name, rack=rack, pdu=pdu, sensors=readings(temperature))
        finally:
            connection.close()

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        for _ in range(6):
            for text, count in (("r12-07", 2), ("r12-08", 1), ("", 4), ("r13-01", 1)):
                filter_by(page, text)
                expect(rows(page)).to_have_count(count)
            page.wait_for_timeout(150)
    finally:
        stop.set()
        thread.join()
    page.wait_for_timeout(500)
