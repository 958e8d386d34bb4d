"""The Models page in Chromium: models by pages (the URL follows), a model's pending replicas said once with
the facility's causes first, a model's own page, and live updates for the page shown."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.test_console import join
from tests.browser.test_facility import in_thread

pytestmark = pytest.mark.browser


@pytest.fixture
def cluster(transactional_db):
    """Three nodes: gpu01, gpu02 in held rack r1-01; gpu03 in r1-02. Twelve models of one 8-GPU replica."""
    from facility.services import hold_create
    from placement.models import Model
    from placement.reconcile import reconcile_all

    for name, rack in (("gpu01", "r1-01"), ("gpu02", "r1-01"), ("gpu03", "r1-02")):
        join(name, rack=rack)
    hold_create(domain="rack:r1-01", reason="PDU swap")
    for i in range(12):
        Model.objects.create(name=f"m{i:02d}", replicas=1 if i else 6, gpus=8)
    reconcile_all()


def test_models_page_by_page_with_the_pending_reason_said_once(cluster, page):
    asked = []
    page.on("request", lambda r: asked.append(r.url) if "headroom" in r.url else None)
    page.goto("/models/")
    models = page.locator("#models section.model")
    expect(models).to_have_count(10)
    # Every card's headroom, from one request for the page's ten models (one read of the nodes for all).
    expect(page.locator("#headroom-m00")).to_contain_text("more replicas fit now; after placing 0 more")
    expect(page.locator("#headroom-m09")).to_contain_text("fit now")
    expect(page.locator("#models .headroom", has_text="working it out")).to_have_count(0)
    assert len(asked) == 1 and asked[0].endswith("/models/headroom?name=m00&name=m01&name=m02&name=m03&name=m04"
                                                 "&name=m05&name=m06&name=m07&name=m08&name=m09"), asked
    waiting = page.locator("#model-m00 .pending-group")
    expect(waiting).to_have_count(1)
    expect(waiting.locator(".waits")).to_have_text("pending 5 replicas (#2 … #6) wait:")
    expect(waiting.locator("ul.causes li")).to_have_text(["rack r1-01 held (2 nodes)", "1 node with fewer than 8 GPUs free"])
    expect(waiting.locator(".pending")).to_have_text(
        "no node fits (3 nodes): 2 × rack r1-01 is held: PDU swap; 1 × gpu: 8 requested, 0 free"
    )
    expect(page.locator("#model-m00 .replicas")).to_contain_text("rack r1-02")
    expect(page.locator("#live-status")).to_have_text("live")

    page.locator("nav.pages").first.get_by_text("next ›").click()
    expect(models).to_have_count(2)
    expect(page.locator("#model-m10")).to_be_visible()
    assert page.url.endswith("/models/?page=2")
    page.go_back()
    expect(models).to_have_count(10)

    page.fill("#model-q", "m11")
    expect(models).to_have_count(1)
    expect(page.locator("#model-m11")).to_be_visible()
    page.locator("#model-m11 h2 a").click()
    expect(page.locator("h1")).to_have_text("m11")
    assert page.url.endswith("/models/m11/")


def test_a_live_update_renders_the_page_shown(cluster, redis_layer, redis_page):
    page = redis_page
    page.goto("/models/?page=2")
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#model-m11 .counts")).to_contain_text("0 placed of 1 desired")
    page.evaluate("window.notReloaded = true")

    def scale():
        from placement.reconcile import reconcile_all
        from placement.services import models_apply

        models_apply(text="kind: Model\nname: m11\nreplicas: 3\nprofile: {gpus: 8}\n")
        reconcile_all()

    in_thread(scale)
    expect(page.locator("#model-m11 .counts")).to_contain_text("0 placed of 3 desired")
    expect(page.locator("#model-m11 .waits")).to_contain_text("3 replicas (#1 … #3) wait")
    # Still page 2: the socket rendered the page this browser shows, not the first.
    expect(page.locator("#models section.model")).to_have_count(2)
    assert page.evaluate("window.notReloaded") is True
