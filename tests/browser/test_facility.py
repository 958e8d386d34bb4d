"""The Facility and Models pages in Chromium: a drain followed live without a reload, a typo caught with
its suggestion, the over-limit confirmation, Release asking first, filters applied on change."""

from __future__ import annotations

import textwrap
import threading

import pytest
from playwright.sync_api import expect

from tests.browser.test_console import join, readings

pytestmark = pytest.mark.browser


@pytest.fixture
def racks(transactional_db):
    """gpu01, gpu02 in rack r1-01 (dual-fed); gpu03 in r1-02, near its limit."""
    join("gpu01", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors=readings(60))
    join("gpu02", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors=readings(62))
    join("gpu03", rack="r1-02", pdu="r1-02-a", sensors=readings(58))
    from facility.services import budget_set

    budget_set(domain="rack:r1-01", cap_watts=16000)
    budget_set(domain="rack:r1-02", cap_watts=4000)  # 3.35 kW of a 3.6 kW limit: near


def in_thread(work) -> None:
    """Run database work in a thread of its own: Playwright's event loop owns this one, and a live update
    sent from it would wait for that loop."""
    from django.db import connection

    failure: list[BaseException] = []

    def run():
        try:
            work()
        except BaseException as exc:  # reported in the test's thread
            failure.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def test_a_drain_started_from_ctl_is_followed_to_drained_without_a_reload(transactional_db, redis_layer, redis_page):
    from placement.services import models_apply
    from tests.integration.drive import Cluster

    page = redis_page
    cluster = Cluster({"r1": 1, "r2": 1}, ready_delay=1.0)

    def start():
        cluster.tick()
        models_apply(text=textwrap.dedent("""\
            kind: Model
            name: llama
            replicas: 1
            profile:
              gpus: 8
              min_ready_seconds: 0
              command: "serve {model} --port {port}"
            """))
        for _ in range(5):
            cluster.tick()

    in_thread(start)
    from placement.models import Shard

    rack = Shard.objects.get().node.labels["llmgw.io/rack"]
    page.goto("/facility/")
    expect(page.locator("#live-status")).to_have_text("live")
    page.evaluate("window.notReloaded = true")

    def hold():
        from llmgw.ctl import main as ctl

        assert ctl(["facility", "hold", f"rack:{rack}", "--reason", "PDU swap", "--drain"]) == 0

    in_thread(hold)
    drain = page.locator(f"#hold-rack-{rack} .drain")
    expect(drain).to_contain_text("1 left")
    for _ in range(20):
        in_thread(cluster.tick)
        if "drained" in (drain.text_content() or ""):
            break
    expect(drain).to_have_text("drained")
    assert page.evaluate("window.notReloaded") is True


def test_a_typo_in_a_hold_is_caught_with_its_suggestion(racks, page):
    from facility.models import Hold

    page.goto("/facility/")
    page.fill("#hold-form input[name=domain]", "rack:r1-10")
    page.fill("#hold-form input[name=reason]", "PDU swap")
    page.click("#hold-form button[name=check]")
    expect(page.locator("#hold-warning")).to_contain_text(
        "no node is in rack r1-10 yet; known racks nearest that name: r1-01"
    )
    assert not Hold.objects.exists()
    page.click("#hold-confirm")
    expect(page.locator("#hold-rack-r1-10")).to_be_visible()
    assert Hold.objects.filter(domain="rack:r1-10").exists()


def test_a_location_typo_is_caught_and_needs_a_second_confirmation(racks, page):
    from agents.models import StoreLabel

    page.goto("/nodes/gpu03/")
    page.click("summary:has-text('Location…')")
    page.fill("#location-form input[name=rack]", "r1-10")
    page.click("#location-form button.primary")
    expect(page.locator("#location-warning")).to_contain_text("no node is in rack r1-10 yet; known racks nearest that name: r1-01")
    assert not StoreLabel.objects.exists()
    page.click("#location-warning button[name=confirm]")
    expect(page.locator("#node-where")).to_contain_text("rack r1-10")


def test_a_move_past_a_limit_shows_the_figures_and_needs_confirmation(racks, page):
    from agents.models import Node

    page.goto("/nodes/gpu01/")
    page.click("summary:has-text('Location…')")
    page.fill("#location-form input[name=rack]", "r1-02")
    page.click("#location-form button.primary")
    warning = page.locator("#location-warning")
    expect(warning).to_contain_text("rack r1-02 would be at")
    expect(warning).to_contain_text("over")
    assert Node.objects.get(name="gpu01").labels["llmgw.io/rack"] == "r1-01"
    page.click("#location-warning button[name=confirm]")
    expect(page.locator("#node-where")).to_contain_text("rack r1-02")


def test_release_asks_first_naming_what_is_placed_there_again(racks, page):
    from facility.services import hold_create

    hold_create(domain="rack:r1-01", reason="PDU swap")
    page.goto("/facility/")
    page.click("#release-rack-r1-01 summary")
    expect(page.locator("#release-rack-r1-01 .confirm")).to_contain_text(
        "new replicas may be placed on rack r1-01's 2 nodes (gpu01, gpu02) again"
    )
    page.click("#release-rack-r1-01 button[type=submit]")
    expect(page.locator("#holds")).to_contain_text("Nothing is held.")


def test_a_release_panel_opened_just_before_a_live_update_stays_open(racks, page):
    from facility.services import hold_create

    hold_create(domain="rack:r1-01", reason="PDU swap")
    page.goto("/facility/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "open")
    # Opened, and swapped by a live update in the same moment: its toggle event has not been handled yet
    # (it is queued, and would reach the element the swap took out), as when a person clicks Release… while
    # an update arrives. The swap is the ws extension's: htmx's oob events around the new element.
    page.evaluate(
        """() => {
        const old = document.getElementById("release-rack-r1-01");
        old.open = true;
        const fresh = old.cloneNode(true);
        fresh.open = false;
        document.body.dispatchEvent(new CustomEvent("htmx:oobBeforeSwap", {bubbles: true}));
        old.replaceWith(fresh);
        document.body.dispatchEvent(new CustomEvent("htmx:oobAfterSwap", {bubbles: true}));
    }"""
    )
    expect(page.locator("#release-rack-r1-01 button[type=submit]")).to_be_visible()
    page.click("#release-rack-r1-01 button[type=submit]")
    expect(page.locator("#holds")).to_contain_text("Nothing is held.")


def test_facility_filters_apply_on_change_and_typing_and_stay_in_the_url(racks, page):
    page.goto("/facility/")
    expect(page.locator("button.tile")).to_have_count(2)
    # The map as the racks stand (r1-01, r1-02); the list worst first (r1-02, near its limit).
    assert page.locator("button.tile").first.get_attribute("id") == "rack-r1-01"
    assert page.locator("#worst-rows tr").first.get_attribute("id") == "wf-rack-r1-02"
    page.fill("#facility-q", "gpu01")
    expect(page.locator("button.tile")).to_have_count(1)
    assert "q=gpu01" in page.url  # hx-push-url: the filtered view is a link
    page.fill("#facility-q", "")
    expect(page.locator("button.tile")).to_have_count(2)
    page.click("#rack-r1-02")
    expect(page.locator("#domain-live")).to_contain_text("3.4 kW of 3.6 kW limit")
    expect(page.locator("#domain-detail .chart-range")).to_contain_text("48 h")


def test_nodes_state_filter_applies_on_change(racks, page):
    from agents.services import node_cordon

    node_cordon(node_name="gpu02", cordoned=True)
    page.goto("/nodes/")
    expect(page.locator("#node-table tbody tr")).to_have_count(3)
    page.select_option("select[name=state]", "cordoned")
    expect(page.locator("#node-table tbody tr")).to_have_count(1)
    assert "state=cordoned" in page.url


def test_models_page_shows_the_rack_beside_each_node(racks, page):
    from placement.reconcile import reconcile_all
    from placement.services import models_apply

    models_apply(text="kind: Model\nname: llama\nreplicas: 1\nprofile:\n  gpus: 8\n")
    reconcile_all()
    page.goto("/models/")
    expect(page.locator("#model-llama .replicas")).to_contain_text("rack r1-0")
    expect(page.locator("#live-status")).to_have_text("live")


def test_a_condition_set_from_ctl_shows_on_the_open_facility_page_without_a_reload(racks, redis_layer, redis_page):
    page = redis_page
    page.goto("/facility/")
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#condition-events")).to_contain_text("No condition has changed yet.")
    expect(page.locator("#missing-data")).to_contain_text("with no fresh reading")
    page.evaluate("window.notReloaded = true")

    def hot():
        from llmgw.ctl import main as ctl

        assert ctl(["facility", "condition", "set", "rack:r1-01", "hot", "--reason", "CRAC 3 alarm", "--for", "1h"]) == 0

    in_thread(hot)
    first = page.locator("#condition-events tbody tr").first
    expect(first).to_contain_text("rack:r1-01")
    expect(first).to_contain_text("set by hand: CRAC 3 alarm")
    expect(first.locator(".cond-hot")).to_have_text("hot")
    expect(page.locator("#rack-r1-01 .tile-cond")).to_have_text("hot")
    expect(page.locator("#missing-data")).not_to_contain_text("rack:r1-01")
    assert page.evaluate("window.notReloaded") is True


def test_capping_turned_on_fills_in_live_as_a_rack_runs_hot(racks, redis_layer, redis_page, tmp_path):
    from tests.browser.test_console import join

    page = redis_page
    page.goto("/facility/")
    expect(page.locator("#live-status")).to_have_text("live")
    card = page.locator("#capping")
    expect(card).to_contain_text("Capping is off: every GPU holds its defaults.")
    expect(card).to_contain_text("facility.capping.enabled in server.yaml")
    page.evaluate("window.notReloaded = true")

    server_yaml = tmp_path / "server.yaml"
    server_yaml.write_text(
        "facility:\n"
        "  conditions: {mode: enforce}\n"
        "  capping: {enabled: true, lever: locked_clocks, floor_fraction: 0.7}\n"
        "  sources: {agents: false}\n"
    )

    def turn_on():
        from llmgw.ctl import main as ctl

        assert ctl(["facility", "apply", "-f", str(server_yaml)]) == 0

    in_thread(turn_on)
    expect(card).to_contain_text("locked SM clocks, down to 70% at most")
    expect(card).to_contain_text("Nothing is capped")

    def run_hot():
        from facility.evaluation import conditions_evaluate
        from llmgw.ctl import main as ctl

        # gpu01's agent reports its cards' limits and top SM clock (an A100's), and that it is not root.
        gpus = readings(60)["gpus"]
        for gpu in gpus:
            gpu.update(enforced_power_limit_watts=700, default_power_limit_watts=700, max_sm_clock_mhz=1410,
                       capping="not permitted")
        join("gpu01", rack="r1-01", pdu="r1-01-a,r1-01-b", sensors={**readings(60), "gpus": gpus})
        assert ctl(["facility", "condition", "set", "rack:r1-01", "hot", "--reason", "CRAC 3 alarm", "--for", "1h"]) == 0
        conditions_evaluate()  # capping acts after each evaluation

    in_thread(run_hot)
    first = page.locator("#capping-gpu01")
    expect(first).to_contain_text("capped to 1269 MHz")
    expect(first).to_contain_text("rack r1-01 hot")
    expect(first.locator(".cap-failure")).to_contain_text("not permitted on GPUs 0-7: the agent is not root")
    second = page.locator("#capping-gpu02")
    expect(second).to_contain_text("capped to 1782 MHz")
    expect(second).to_contain_text("no top SM clock reported: 1980 MHz assumed")
    expect(second.locator(".cap-failure")).to_have_count(0)
    expect(page.locator("#capping-gpu03")).to_have_count(0)
    assert page.evaluate("window.notReloaded") is True
    first.locator("a").click()
    expect(page.locator("#gpu-0 .gpu-capping")).to_contain_text("700 W of 700 W")
    expect(page.locator("#gpu-0 .gpu-capping")).to_contain_text("capping not permitted")
    expect(page.locator("#node-live")).to_contain_text("Capping not permitted: the agent is not root")
