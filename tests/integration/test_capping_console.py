"""GPU capping on the console: the Facility page's card (off, capped, would cap, an agent that could not apply
it) over HTTP and its live socket, and each GPU's limit in force, locked clocks and refusal on the node's page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from facility.services import condition_override_set, facility_apply
from placement.capping import capping_run
from tests.integration.test_console import communicate, heartbeat

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client, make_user):
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    return client


def capping_on(*, mode: str = "enforce", lever: str = "power_limit") -> None:
    facility_apply(text=f"facility:\n  conditions: {{mode: {mode}}}\n"
                        f"  capping: {{enabled: true, lever: {lever}, floor_fraction: 0.7}}\n  sources: {{agents: false}}\n")


def hot(domain: str, steps: int) -> None:
    """`domain` hot by hand, and `steps` evaluations' capping one minute apart."""
    condition_override_set(domain=domain, condition="hot", reason="CRAC 2 down", seconds=7200)
    t0 = timezone.now()
    for minute in range(steps):
        capping_run(now=t0 + timedelta(minutes=minute))


def gpus(count: int = 8, **reading) -> dict:
    """What an agent that reports capping sends: each GPU's reading with the capping keys given."""
    return {"gpus": [{"index": i, "uuid": f"GPU-{i}", "power_watts": 300, "power_limit_watts": 700, **reading}
                     for i in range(count)]}


def card(page: str) -> str:
    start = page.index('id="capping"')
    return page[start:page.index("</section>", start)]


def row(page: str, node: str) -> str:
    html = card(page)
    start = html.index(f'id="capping-{node}"')
    return html[start:html.index("</tr>", start)]


def test_with_capping_off_the_card_says_so_and_where_to_turn_it_on(viewer, join_node):
    join_node("gpu01", rack="r1")
    html = card(viewer.get("/facility/").content.decode())
    assert "<h2>GPU capping" in html
    assert "Capping is off: every GPU holds its defaults." in html
    assert "<code>facility.capping.enabled</code> in server.yaml" in html
    assert "<table" not in html


def test_capping_on_with_nothing_pressed_says_every_gpu_holds_its_defaults(viewer, join_node):
    join_node("gpu01", rack="r1")
    capping_on()
    capping_run()
    html = card(viewer.get("/facility/").content.decode())
    assert "power limit, down to 70% at most" in html
    assert "Nothing is capped: no domain is warm, hot or within 5% of its power limit" in html


def test_a_capped_node_shows_its_locked_clock_and_why_linked_to_its_page(viewer, join_node):
    join_node("gpu01", rack="r1")
    heartbeat("gpu01", rack="r1", sensors=gpus(max_sm_clock_mhz=1410))
    join_node("gpu02", rack="r2")  # not pressed: not listed
    capping_on(lever="locked_clocks")
    hot("rack:r1", steps=2)
    page = viewer.get("/facility/").content.decode()
    line = row(page, "gpu01")
    assert '<a href="/nodes/gpu01/">gpu01</a>' in line
    assert '<span class="cap-capped">capped to 1128 MHz</span>' in line
    assert "<td>rack r1 hot</td>" in line
    assert "capping-gpu02" not in card(page)
    assert "locked SM clocks, down to 70% at most" in card(page)


def test_cards_that_differ_show_one_clock_per_gpu_group_and_what_was_assumed(viewer, join_node):
    join_node("gpu01", rack="r1", gpus=4)
    readings = gpus(4)
    for g, top in zip(readings["gpus"], (1410, 1410, 2520, None), strict=True):
        if top:
            g["max_sm_clock_mhz"] = top
    heartbeat("gpu01", rack="r1", gpus=4, sensors=readings)
    capping_on(lever="locked_clocks")
    hot("rack:r1", steps=2)
    line = row(viewer.get("/facility/").content.decode(), "gpu01")
    assert "capped to 1128 MHz on GPUs 0-1, 2016 MHz on GPU 2, 1584 MHz on GPU 3" in line
    assert '<div class="sub">no top SM clock reported for GPU 3: 1980 MHz assumed</div>' in line


def test_observe_mode_shows_what_it_would_cap_in_watts(viewer, join_node):
    join_node("gpu03", rack="r12-07")
    capping_on(mode="observe")
    hot("rack:r12-07", steps=3)
    line = row(viewer.get("/facility/").content.decode(), "gpu03")
    assert '<span class="cap-would-cap">would cap to 490 W</span>' in line
    assert "<td>rack r12-07 hot</td>" in line
    assert "cap-failure" not in line


def test_an_agent_that_could_not_apply_the_cap_is_warned_of_on_its_row(viewer, join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1")
    capping_on()
    hot("rack:r1", steps=1)
    readings = gpus(enforced_power_limit_watts=700, default_power_limit_watts=700, capping="not permitted")
    readings["gpus"][7]["capping"] = "not supported"
    heartbeat("gpu01", rack="r1", sensors=readings)
    heartbeat("gpu02", rack="r1", sensors=gpus(enforced_power_limit_watts=630, default_power_limit_watts=700))
    page = viewer.get("/facility/").content.decode()
    line = row(page, "gpu01")
    assert '<tr id="capping-gpu01" class="cap-failed">' in card(page)
    assert "capped to 630 W" in line
    assert ('<div class="cap-failure" role="alert"><strong>not permitted</strong> on GPUs 0-6: the agent is not '
            "root, so it cannot set a power limit or lock clocks</div>") in line
    assert ('<div class="cap-failure" role="alert"><strong>not supported</strong> on GPU 7: the card or its '
            "driver has no such control</div>") in line
    assert "cap-failure" not in row(page, "gpu02")


def test_the_facility_socket_sends_the_capping_card(join_node):
    from agents.consumers import FacilityConsumer

    join_node("gpu01", rack="r1")
    capping_on()
    hot("rack:r1", steps=2)
    consumer = FacilityConsumer()
    consumer.scope = {"user": None}
    consumer.filter = ""
    html = consumer.html()
    assert '<section class="card" id="capping" hx-swap-oob="true">' in html
    assert "capped to 560 W" in row(html, "gpu01")


@pytest.mark.django_db(transaction=True)
def test_an_open_facility_page_hears_of_a_would_cap_though_no_node_is_sent_anything(make_user):
    from asgiref.sync import async_to_sync, sync_to_async

    from agents.consumers import FacilityConsumer
    from placement.capping import capping_blocks

    heartbeat("gpu03", rack="r12-07")
    capping_on(mode="observe")
    condition_override_set(domain="rack:r12-07", condition="warm", reason="CRAC 2 down", seconds=7200)
    user, _ = make_user("viewer1", "viewer")

    async def run():
        socket = communicate("/ws/facility/", user, FacilityConsumer)
        assert (await socket.connect())[0]
        await sync_to_async(capping_run)()
        html = await socket.receive_from(timeout=5)
        await socket.disconnect()
        return html

    html = async_to_sync(run)()
    assert capping_blocks() == {}
    assert "would cap to 630 W" in row(html, "gpu03")


# -- a node's page -------------------------------------------------------------------------------------------


def gpu_row(page: str, index: int) -> str:
    start = page.index(f'<tr id="gpu-{index}"')
    return page[start:page.index("</tr>", start)]


def test_node_page_shows_each_gpus_limit_in_force_against_its_default(viewer, join_node):
    join_node("gpu01", rack="r1", gpus=2)
    readings = gpus(2, enforced_power_limit_watts=490.0, default_power_limit_watts=700.0)
    readings["gpus"][1]["enforced_power_limit_watts"] = 700.0
    heartbeat("gpu01", rack="r1", gpus=2, sensors=readings)
    page = viewer.get("/nodes/gpu01/").content.decode()
    assert "<th title=\"what capping left on the card, as its agent reports it\">LIMIT IN FORCE</th>" in page
    assert '<span class="cap-limit lowered">490 W of 700 W</span>' in gpu_row(page, 0)
    assert '<span class="cap-limit">700 W of 700 W</span>' in gpu_row(page, 1)
    assert "clocks locked" not in page and "cap-failure" not in page


def test_node_page_shows_the_locked_clock_range_and_a_refusal(viewer, join_node):
    join_node("gpu01", rack="r1", gpus=2)
    readings = gpus(2, enforced_power_limit_watts=700.0, default_power_limit_watts=700.0, max_sm_clock_mhz=1410)
    readings["gpus"][0]["locked_clocks_mhz"] = [210, 1128]
    readings["gpus"][1]["capping"] = "not permitted"
    heartbeat("gpu01", rack="r1", gpus=2, sensors=readings)
    page = viewer.get("/nodes/gpu01/").content.decode()
    assert '<div class="cap-clocks">clocks locked 210–1128 MHz of 1410</div>' in gpu_row(page, 0)
    assert '<div class="cap-failure">capping not permitted</div>' in gpu_row(page, 1)
    assert ('<p class="cap-failure" role="alert">Capping not permitted: the agent is not root, so it cannot set a '
            "power limit or lock clocks. The limits and clocks above are what the cards hold.</p>") in page
    assert "clocks locked" not in gpu_row(page, 1)


def test_node_page_of_an_older_agent_shows_no_capping_column(viewer, join_node):
    join_node("gpu01", rack="r1", gpus=2)
    heartbeat("gpu01", rack="r1", gpus=2, sensors=gpus(2))
    response = viewer.get("/nodes/gpu01/")
    page = response.content.decode()
    assert response.status_code == 200
    assert "LIMIT IN FORCE" not in page and "cap-limit" not in page
    assert "300 W / 700 W" in gpu_row(page, 0)


@pytest.mark.django_db(transaction=True)
def test_the_node_socket_sends_the_limits_with_the_heartbeat(make_user):
    from asgiref.sync import async_to_sync, sync_to_async

    from agents.consumers import NodeConsumer

    heartbeat("gpu01", rack="r1", gpus=1)
    user, _ = make_user("viewer1", "viewer")

    async def run():
        socket = communicate("/ws/nodes/gpu01/", user, NodeConsumer)
        assert (await socket.connect())[0]
        await sync_to_async(heartbeat)("gpu01", rack="r1", gpus=1, sensors=gpus(
            1, enforced_power_limit_watts=490.0, default_power_limit_watts=700.0, capping="not supported"))
        html = await socket.receive_from(timeout=5)
        await socket.disconnect()
        return html

    html = async_to_sync(run)()
    assert "490 W of 700 W" in html
    assert "capping not supported</div>" in html
    assert "Capping not supported: the card or its driver has no such control." in html


@pytest.mark.parametrize("count", [2, 40])
def test_the_capping_card_costs_the_same_queries_however_many_nodes_it_lists(
    viewer, join_node, django_assert_max_num_queries, count
):
    for i in range(count):
        join_node(f"gpu{i:02d}", rack="r1")
    capping_on(lever="locked_clocks")
    hot("rack:r1", steps=1)
    # The page's own (test_console's count) and capping's: its settings, its rows, the cards' top clocks and
    # the listed nodes' sensors, each one query whatever the count.
    with django_assert_max_num_queries(30):
        page = viewer.get("/facility/").content.decode()
    # The card lists the first 20 and counts the rest (`llmgw ctl facility capping` lists them all).
    assert card(page).count("capped to 1782 MHz") == min(count, 20)
    assert f"{count} nodes" in card(page)
