"""The console over HTTP (Django's test client) and its live socket (Channels' communicator).

The browser tests (tests/browser) drive the same pages in Chromium; these pin the rules: who may
read and change, what each page shows, filters, sort, paging, the forms' errors, and the queries a
list costs.
"""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group

from tests.conftest import node_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def login(client, make_user):
    """A test client logged in with a role (operator unless told)."""

    def as_role(role: str = "operator", username: str | None = None):
        user, _ = make_user(username or f"{role}1", role)
        client.force_login(user)
        return client

    return as_role


def heartbeat(name: str, *, rack: str | None = None, pdu: str | None = None, sensors: dict | None = None, **kw):
    """Record a heartbeat through the service, as the agent's POST does, with sensor readings."""
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for

    body = heartbeat_for(node_spec(name, rack=rack, pdu=pdu, **kw))
    body["sensors"] = sensors or {}
    return heartbeat_record(node_name=name, heartbeat=body)


def gpu_readings(temps: list[float], *, power: float = 400, throttle: dict[int, list[str]] | None = None) -> dict:
    return {
        "gpus": [
            {
                "index": i,
                "temperature_celsius": t,
                "memory_temperature_celsius": t + 8,
                "power_watts": power,
                "power_limit_watts": 700,
                "throttle_reasons": (throttle or {}).get(i, []),
            }
            for i, t in enumerate(temps)
        ],
        "cpu_temperature_celsius": 55,
        "cpu_power_watts": 210,
        "inlet_temperature_celsius": 24,
    }


def row_names(html: str) -> list[str]:
    return re.findall(r'<tr id="node-([^"]+)"', html)


# -- who may read and change ---------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/nodes/", "/nodes/gpu01/", "/facility/", "/models/"])
def test_pages_need_a_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_login_form_carries_a_csrf_token_and_logout_is_a_post(client, make_user):
    user, _ = make_user("alice", "viewer")
    user.set_password("correct-horse-9")
    user.save()
    page = client.get("/login/").content.decode()
    assert 'name="csrfmiddlewaretoken"' in page
    response = client.post("/login/", {"username": "alice", "password": "correct-horse-9"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/nodes/").status_code == 200
    assert client.get("/logout/").status_code == 405
    assert client.post("/logout/").status_code == 302
    assert client.get("/nodes/").status_code == 302


def test_a_viewer_reads_but_gets_no_menu_and_cannot_post(login):
    heartbeat("gpu01", rack="r1")
    client = login("viewer")
    page = client.get("/nodes/gpu01/").content.decode()
    assert "gpu01" in page
    assert "Location…" not in page and "Hold rack" not in page and "Cordon" not in page
    for url, data in [
        ("/nodes/gpu01/location", {"rack": "r9"}),
        ("/nodes/gpu01/hold", {"domain": "rack:r1", "reason": "x"}),
        ("/nodes/gpu01/cordon", {"action": "cordon"}),
        ("/facility/holds", {"domain": "rack:r1", "reason": "x"}),
        # The preview is a what-if over every replica (the API's needs an operator too).
        ("/facility/holds/preview", {"domain": "rack:r1", "reason": "x", "drain": "1"}),
        ("/facility/what-if", {"domain": "rack:r1", "reason": "x"}),
    ]:
        assert client.post(url, data).status_code == 403, url
    from agents.models import StoreLabel
    from facility.models import Hold

    assert not StoreLabel.objects.exists() and not Hold.objects.exists()


def test_a_user_without_a_role_reads_nothing(login):
    client = login("viewer", "nobody")
    from django.contrib.auth import get_user_model

    get_user_model().objects.get(username="nobody").groups.remove(*Group.objects.all())
    assert client.get("/nodes/").status_code == 403
    assert client.get("/facility/").status_code == 403


# -- the Nodes list ------------------------------------------------------------------------------------------


def test_nodes_list_shows_where_power_heat_and_throttling(login):
    heartbeat(
        "gpu01",
        rack="r12-07",
        pdu="r12-07-a,r12-07-b",
        labels={"llmgw.io/site": "sto1", "llmgw.io/room": "hall-b"},
        gpus=2,
        sensors=gpu_readings([61, 83], power=450, throttle={1: ["sw_thermal"]}),
    )
    page = login("viewer").get("/nodes/").content.decode()
    row = page[page.index('<tr id="node-gpu01"') :]
    row = row[: row.index("</tr>")]
    assert "rack r12-07 · pdu r12-07-a,r12-07-b" in row
    assert "site sto1 · room hall-b" in row
    assert "900 W" in row and "/ 1,400 W" in row
    assert "83 °C" in row
    assert "throttled" in row and "thermal (software)" in row and "(1 GPU)" in row
    assert "ready" in row
    assert '2/2' in row


def test_nodes_list_filters_by_domain_state_and_name_and_htmx_gets_the_table_alone(login):
    from facility.services import hold_create

    heartbeat("gpu01", rack="r1", pdu="r1-a")
    heartbeat("gpu02", rack="r1", pdu="r1-b")
    heartbeat("gpu03", rack="r2", pdu="r2-a")
    heartbeat("cpu01", rack="r2", gpus=0)
    hold_create(domain="pdu:r1-b", reason="PDU swap")
    client = login("viewer")

    assert row_names(client.get("/nodes/", {"domain": "rack:r1"}).content.decode()) == ["gpu01", "gpu02"]
    assert row_names(client.get("/nodes/", {"domain": "pdu:r2-a"}).content.decode()) == ["gpu03"]
    assert row_names(client.get("/nodes/", {"state": "held"}).content.decode()) == ["gpu02"]
    assert row_names(client.get("/nodes/", {"q": "CPU"}).content.decode()) == ["cpu01"]

    partial = client.get("/nodes/", {"domain": "rack:r2"}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial
    assert row_names(partial) == ["cpu01", "gpu03"]
    assert 'id="node-table"' in partial

    bad = client.get("/nodes/", {"domain": "rack"}, HTTP_HX_REQUEST="true").content.decode()
    assert "domain: &#x27;rack&#x27; is not a domain: write level:name" in bad
    assert row_names(bad) == []


def test_nodes_list_sorts_by_column(login):
    heartbeat("gpu01", rack="r3", sensors=gpu_readings([50]))
    heartbeat("gpu02", rack="r1", sensors=gpu_readings([90]))
    heartbeat("gpu03", rack="r2", sensors=gpu_readings([70]))
    client = login("viewer")
    assert row_names(client.get("/nodes/", {"sort": "-name"}).content.decode()) == ["gpu03", "gpu02", "gpu01"]
    assert row_names(client.get("/nodes/", {"sort": "where"}).content.decode()) == ["gpu02", "gpu03", "gpu01"]
    assert row_names(client.get("/nodes/", {"sort": "-temp"}).content.decode()) == ["gpu02", "gpu03", "gpu01"]
    # An unknown column falls back to the name.
    assert row_names(client.get("/nodes/", {"sort": "nonsense"}).content.decode()) == ["gpu01", "gpu02", "gpu03"]


def make_nodes(count: int, *, racks: int = 10) -> None:
    """Many nodes at once (the list's paging and query count), labelled through the service's own refresh."""
    from agents.models import GPU, Node
    from agents.services import node_refresh_labels

    nodes = Node.objects.bulk_create(
        [
            Node(
                name=f"n{i:04d}",
                agent_labels={"llmgw.io/rack": f"r{i % racks:02d}", "llmgw.io/pdu": f"r{i % racks:02d}-a"},
                sensors=gpu_readings([40 + i % 30] * 2),
            )
            for i in range(count)
        ]
    )
    GPU.objects.bulk_create([GPU(node=n, index=j, power_limit_watts=700) for n in nodes for j in range(2)])
    for node in nodes:
        node_refresh_labels(node)


def test_nodes_list_pages_by_a_hundred(login):
    make_nodes(150)
    client = login("viewer")
    first = client.get("/nodes/").content.decode()
    assert len(row_names(first)) == 100 and row_names(first)[0] == "n0000"
    assert "page 1 of 2" in first
    second = client.get("/nodes/", {"page": 2}).content.decode()
    assert row_names(second)[0] == "n0100" and len(row_names(second)) == 50


@pytest.mark.parametrize("count", [20, 150])
def test_nodes_list_queries_do_not_grow_with_nodes(login, django_assert_max_num_queries, count):
    from facility.services import hold_create

    make_nodes(count)
    hold_create(domain="rack:r01", reason="PDU swap")
    client = login("viewer")
    # 14, three for thermal conditions (their settings, states and overrides), one for booked GPUs,
    # whatever the nodes.
    with django_assert_max_num_queries(18):
        assert client.get("/nodes/", {"sort": "-power"}).status_code == 200
    with django_assert_max_num_queries(18):
        assert client.get("/nodes/", {"state": "held"}).status_code == 200


@pytest.mark.parametrize("count", [10, 120])
def test_facility_page_queries_do_not_grow_with_nodes(login, django_assert_max_num_queries, count):
    from facility.services import budget_set

    make_nodes(count)
    for r in range(10):
        budget_set(domain=f"rack:r{r:02d}", cap_watts=20000)
    client = login("viewer")
    # 13, drained nodes, placed watts, two for the history lines, four for thermal conditions, feeds, the
    # condition timeline, shedding's settings (its next moves: none while it is off), the measured window,
    # capping's settings (its card: off), the NetBox import jobs running or failed of late.
    with django_assert_max_num_queries(27):
        assert client.get("/facility/").status_code == 200


# -- a node's page -------------------------------------------------------------------------------------------


def test_node_page_shows_location_sources_gpus_and_readings(login):
    from agents.services import labels_set

    heartbeat("gpu01", rack="r1", pdu="r1-a", gpus=2, sensors=gpu_readings([64, 71], throttle={0: ["sw_power_cap"]}))
    labels_set(node_name="gpu01", changes={"llmgw.io/rack": "r12-07"})
    page = login("viewer").get("/nodes/gpu01/").content.decode()
    labels = page[page.index('id="node-location"') :]
    assert re.search(r"llmgw.io/rack</code></td><td>r12-07</td>\s*<td><span class=\"badge src-store\">store</span>", labels)
    assert "over the agent's r1" in labels
    assert re.search(r"llmgw.io/pdu</code></td><td>r1-a</td>\s*<td><span class=\"badge src-agent\">agent</span>", labels)
    live = page[page.index('id="node-live"') :]
    assert "71 °C" in live and "79 °C" in live  # GPU and its memory
    assert "400 W / 700 W" in live
    assert "power cap" in live
    assert 'id="cpu-temp">55 °C' in live and 'id="cpu-power">210 W' in live and 'id="inlet-temp">24 °C' in live
    assert "No replicas run here." in live


def test_unknown_node_page_is_404(login):
    assert login("viewer").get("/nodes/nope/").status_code == 404


def test_location_form_sets_and_removes_store_labels(login):
    from agents.models import Node, StoreLabel

    heartbeat("gpu01", rack="r1")
    client = login()
    response = client.post("/nodes/gpu01/location", {"rack": "r12-07", "row": "12", "more": "team=infer", "confirm": "1"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    body = response.content.decode()
    assert '<span class="lvl">rack</span> r12-07' in body and "<html" not in body
    assert Node.objects.get(name="gpu01").labels["llmgw.io/rack"] == "r12-07"
    assert dict(StoreLabel.objects.values_list("key", "value")) == {
        "llmgw.io/rack": "r12-07",
        "llmgw.io/row": "12",
        "team": "infer",
    }
    assert set(StoreLabel.objects.values_list("set_by", flat=True)) == {"operator1"}

    # Emptying the field removes the store's value: back to the agent's.
    response = client.post("/nodes/gpu01/location", {"rack": "", "row": "12"})
    assert response.status_code == 302 and response["Location"] == "/nodes/gpu01/"
    assert Node.objects.get(name="gpu01").labels["llmgw.io/rack"] == "r1"


def test_location_form_shows_a_misspelt_key_inline_and_saves_nothing(login):
    from agents.models import Node, StoreLabel

    heartbeat("gpu01", rack="r1")
    client = login()
    response = client.post(
        "/nodes/gpu01/location", {"rack": "r2", "more": "llmgw.io/racks=r3"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 422
    body = response.content.decode()
    assert "labels: unknown label key &#x27;llmgw.io/racks&#x27;: the llmgw.io/ keys are" in body
    assert 'value="llmgw.io/racks=r3"' in body  # what was typed stays
    assert "<details class=\"action\" open>" in body
    assert not StoreLabel.objects.exists()
    assert Node.objects.get(name="gpu01").labels["llmgw.io/rack"] == "r1"

    bad = client.post("/nodes/gpu01/location", {"rack": "r 2"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 422
    assert "labels: llmgw.io/rack=&#x27;r 2&#x27;: a value takes letters, digits" in bad.content.decode()
    assert not StoreLabel.objects.exists()


def test_hold_and_release_the_rack_from_the_node_page(login):
    from facility.models import Hold

    heartbeat("gpu01", rack="r1")
    heartbeat("gpu02", rack="r1")
    heartbeat("gpu03", rack="r2")
    client = login()
    page = client.get("/nodes/gpu01/").content.decode()
    assert "Hold rack r1" in page

    refused = client.post("/nodes/gpu01/hold", {"domain": "rack:r1", "reason": " "}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 422
    assert "reason: say why the domain is held" in refused.content.decode()
    assert not Hold.objects.exists()

    # Preview first, in the menu: what the hold and drain would do, with the reason as typed; nothing written.
    preview = client.post("/nodes/gpu01/hold", {"domain": "rack:r1", "reason": "PDU swap", "drain": "1"},
                          HTTP_HX_REQUEST="true").content.decode()
    assert 'id="hold-preview"' in preview and "Hold rack:r1 and drain it" in preview and "PDU swap" in preview
    assert "2 nodes take nothing new: gpu01, gpu02" in preview
    assert not Hold.objects.exists()
    done = client.post("/nodes/gpu01/hold", {"domain": "rack:r1", "reason": "PDU swap", "drain": "1", "confirm": "1",
                                             "previewed": "rack:r1|1"}, HTTP_HX_REQUEST="true")
    assert done.status_code == 200
    assert "Release rack r1" in done.content.decode()
    hold = Hold.objects.get()
    assert (hold.domain, hold.reason, hold.drain, hold.created_by) == ("rack:r1", "PDU swap", True, "operator1")
    assert row_names(client.get("/nodes/", {"state": "held"}).content.decode()) == ["gpu01", "gpu02"]

    client.post("/nodes/gpu01/release", {"domain": "rack:r1"})
    assert not Hold.objects.exists()


def test_cordon_and_uncordon(login):
    from agents.models import Node

    heartbeat("gpu01", rack="r1")
    client = login()
    client.post("/nodes/gpu01/cordon", {"action": "cordon", "reason": "bad fan"})
    node = Node.objects.get(name="gpu01")
    assert node.cordoned and node.cordon_reason == "bad fan"
    assert "Uncordon" in client.get("/nodes/gpu01/").content.decode()
    assert row_names(client.get("/nodes/", {"state": "cordoned"}).content.decode()) == ["gpu01"]
    client.post("/nodes/gpu01/cordon", {"action": "uncordon"})
    assert not Node.objects.get(name="gpu01").cordoned


# -- the facility page ---------------------------------------------------------------------------------------


def test_facility_page_shows_domains_bars_and_a_rack_map(login):
    from facility.services import budget_set, hold_create

    for _ in range(2):  # two readings: the measured peak
        heartbeat("gpu01", rack="r1", pdu="r1-a", labels={"llmgw.io/room": "hall-a", "llmgw.io/row": "1"},
                  sensors=gpu_readings([60] * 8, power=600))
    heartbeat("gpu02", rack="r2", pdu="r2-a", labels={"llmgw.io/room": "hall-a", "llmgw.io/row": "1"})
    budget_set(domain="rack:r1", cap_watts=6000)  # 8×600 + 210 CPU + 350 of a 5400 W limit: 40 W left
    budget_set(domain="rack:r2", cap_watts=16000)
    hold_create(domain="rack:r2", reason="PDU swap")
    client = login("viewer")
    page = client.get("/facility/").content.decode()
    assert re.search(r'class="tile p-near c-unknown n-unknown" id="rack-r1"', page)
    assert re.search(r'class="tile p-ok c-unknown n-unknown held" id="rack-r2"', page)
    assert "room hall-a" in page and "row 1" in page
    assert re.search(r'id="summary-near".*><strong>1</strong> rack near', page)
    assert re.search(r'id="summary-pdu-near".*><strong>0</strong> PDUs near', page)
    assert re.search(r'id="summary-held".*><strong>1</strong> held', page)
    # Worst first: the near rack leads; a domain with neither a budget nor a condition is left out.
    rows = re.findall(r'<tr class="s-(\w+)" id="wf-([\w-]+)"', page)
    assert rows[0] == ("near", "rack-r1") and ("ok", "rack-r2") in rows
    assert "pdu-r1-a" not in [slug for _, slug in rows]
    assert "5.4 kW of 5.4 kW" in page and '<strong class="left-near">40 W left</strong>' in page
    assert "PDU swap" in page
    detail = client.get("/facility/domains/pdu:r2-a/").content.decode()
    assert "0.3 kW in use, no budget" in detail  # pdu r2-a: the node's own 350 W


def test_facility_hold_form_refuses_a_bad_domain(login):
    from facility.models import Hold

    client = login()
    response = client.post("/facility/holds", {"domain": "rak:r1", "reason": "x"})
    assert response.status_code == 422
    assert "domain: &#x27;rak:r1&#x27;: unknown level &#x27;rak&#x27;" in response.content.decode()
    # No node is in pdu:r1-a: it asks first, and holds once confirmed.
    assert "no node is in pdu r1-a yet" in client.post("/facility/holds", {"domain": "pdu:r1-a", "reason": "swap"}).content.decode()
    assert client.post("/facility/holds", {"domain": "pdu:r1-a", "reason": "swap", "confirm": "1"}).status_code == 302
    assert Hold.objects.get().domain == "pdu:r1-a"
    assert client.post("/facility/holds/release", {"domain": "pdu:r1-a"}).status_code == 302
    assert not Hold.objects.exists()


# -- the live socket -----------------------------------------------------------------------------------------


def communicate(path: str, user, consumer):
    from channels.testing import WebsocketCommunicator

    communicator = WebsocketCommunicator(consumer.as_asgi(), path)
    communicator.scope["user"] = user
    communicator.scope["url_route"] = {"kwargs": {"name": path.strip("/").split("/")[-1]}}
    return communicator


@pytest.mark.django_db(transaction=True)
def test_the_nodes_socket_sends_the_changed_row_it_shows(make_user):
    from agents.consumers import NodesConsumer

    heartbeat("gpu01", rack="r1", gpus=1)
    heartbeat("gpu02", rack="r1", gpus=1)
    user, _ = make_user("viewer1", "viewer")

    async def run():
        socket = communicate("/ws/nodes/", user, NodesConsumer)
        connected, _ = await socket.connect()
        assert connected
        await socket.send_json_to({"shown": "gpu01", "HEADERS": {}})
        await socket.receive_nothing(0.2)
        from asgiref.sync import sync_to_async

        await sync_to_async(heartbeat)("gpu02", rack="r1", gpus=1, sensors=gpu_readings([66]))
        assert await socket.receive_nothing(0.3)  # not shown on this page
        await sync_to_async(heartbeat)("gpu01", rack="r1", gpus=1, sensors=gpu_readings([77]))
        html = await socket.receive_from(timeout=5)
        await socket.disconnect()
        return html

    html = async_to_sync(run)()
    assert html.startswith('<tr id="node-gpu01" hx-swap-oob="true"')
    assert "77 °C" in html


@pytest.mark.django_db(transaction=True)
def test_the_nodes_socket_sends_only_the_reading_cells_that_changed_and_a_row_whole_when_more_did(make_user):
    from agents.consumers import NodesConsumer
    from facility.services import hold_create

    heartbeat("gpu01", rack="r1", gpus=2, sensors=gpu_readings([70, 70]))
    user, _ = make_user("viewer1", "viewer")

    async def run():
        from asgiref.sync import sync_to_async

        socket = communicate("/ws/nodes/", user, NodesConsumer)
        assert (await socket.connect())[0]
        await socket.send_json_to({"shown": "gpu01"})
        await socket.receive_nothing(0.2)
        sent = []
        # The first update after the page said what it shows: the row whole (the socket never sent it).
        await sync_to_async(heartbeat)("gpu01", rack="r1", gpus=2, sensors=gpu_readings([70, 70], power=410))
        sent.append(await socket.receive_from(timeout=5))
        # Power moved, the temperature did not: the power cell alone.
        await sync_to_async(heartbeat)("gpu01", rack="r1", gpus=2, sensors=gpu_readings([70, 70], power=420))
        sent.append(await socket.receive_from(timeout=5))
        # Hotter and throttled: those cells too, still not the row.
        await sync_to_async(heartbeat)("gpu01", rack="r1", gpus=2,
                                       sensors=gpu_readings([88, 70], power=430, throttle={0: ["sw_thermal"]}))
        sent.append(await socket.receive_from(timeout=5))
        # A hold changes the row's state: the row whole again.
        await sync_to_async(hold_create)(domain="rack:r1", reason="PDU swap")
        sent.append(await socket.receive_from(timeout=5))
        await socket.disconnect()
        return sent

    whole, power, hot, held = async_to_sync(run)()
    assert whole.startswith('<tr id="node-gpu01" hx-swap-oob="true"') and "820 W" in whole
    assert power.startswith('<td id="node-gpu01-power" hx-swap-oob="true" class="num power">840 W')
    assert "<tr" not in power and "node-gpu01-temp" not in power and "node-gpu01-throttle" not in power
    assert "<tr" not in hot
    assert [cell in hot for cell in ('id="node-gpu01-power"', 'id="node-gpu01-temp"', 'id="node-gpu01-throttle"')] == [
        True, True, True]
    assert "88 °C" in hot and "throttled" in hot
    assert held.startswith('<tr id="node-gpu01" hx-swap-oob="true"') and "rack:r1: PDU swap" in held


@pytest.mark.django_db(transaction=True)
def test_the_node_socket_sends_its_panels_and_refuses_a_stranger(make_user):
    from django.contrib.auth.models import AnonymousUser

    from agents.consumers import NodeConsumer
    from facility.services import hold_create

    heartbeat("gpu01", rack="r1", gpus=1)
    user, _ = make_user("viewer1", "viewer")

    async def run():
        from asgiref.sync import sync_to_async

        stranger = communicate("/ws/nodes/gpu01/", AnonymousUser(), NodeConsumer)
        connected, code = await stranger.connect()
        assert (connected, code) == (False, 4403)

        socket = communicate("/ws/nodes/gpu01/", user, NodeConsumer)
        assert (await socket.connect())[0]
        await sync_to_async(heartbeat)("gpu01", rack="r1", gpus=1, sensors=gpu_readings([81]))
        first = await socket.receive_from(timeout=5)
        await sync_to_async(hold_create)(domain="rack:r1", reason="PDU swap")
        second = await socket.receive_from(timeout=5)
        await socket.disconnect()
        return first, second

    first, second = async_to_sync(run)()
    assert '<section id="node-live" class="card live-panel" hx-swap-oob="true">' in first
    assert '<section id="node-location" class="card" hx-swap-oob="true">' in first
    assert "81 °C" in first
    assert "rack:r1 held: PDU swap" in second


# -- the models page -----------------------------------------------------------------------------------------


def test_models_page_shows_replicas_where_and_why_and_the_pending_reason(login):
    from placement.reconcile import reconcile_all
    from placement.services import model_apply

    heartbeat("gpu01", rack="r1", gpus=8)
    model_apply(data={"kind": "Model", "name": "llama-70b", "replicas": 2, "profile": {"gpus": 8}})
    reconcile_all()  # what the commit's on_commit task does; the test's transaction never commits
    client = login("viewer")
    page = client.get("/models/").content.decode()
    section = page[page.index('id="model-llama-70b"') :]
    assert "8 GPUs × 1 node" in section
    assert '<a href="/nodes/gpu01/">gpu01</a>' in section
    assert "0-7" in section
    assert 'class="pending"' in section  # the second replica: no node left with 8 free cards
    headroom = client.get("/models/llama-70b/headroom").content.decode()
    assert "<strong>0</strong> more replicas fit" in headroom
    assert client.get("/models/nope/headroom").status_code == 404


def test_the_facility_and_models_pages_show_no_template_comment(login):
    """Django's {# #} ends on its line: a comment written over several lines reached the page as text."""
    from pathlib import Path

    from placement.reconcile import reconcile_all
    from placement.services import model_apply

    heartbeat("gpu01", rack="r1", gpus=8)
    model_apply(data={"kind": "Model", "name": "llama-70b", "replicas": 1, "profile": {"gpus": 8}})
    reconcile_all()
    client = login("viewer")
    for url in ("/facility/", "/models/", "/models/llama-70b/"):
        page = client.get(url).content.decode()
        assert "{#" not in page and "#}" not in page and "comment %}" not in page, url
    assert "Tells the live socket" not in client.get("/facility/").content.decode()
    templates = Path(__file__).resolve().parents[2] / "templates"
    unclosed = [f"{path.relative_to(templates)}:{n}" for path in sorted(templates.rglob("*.html"))
                for n, line in enumerate(path.read_text().splitlines(), 1) if line.count("{#") > line.count("#}")]
    assert unclosed == []


@pytest.mark.parametrize(
    "path",
    ["/nodes/gpu01%00/", "/nodes/gpu01%00/history", "/models/%00/", "/models/a%00/headroom",
     "/facility/domains/rack:r1%00/history"],
)
def test_a_nul_in_a_console_path_is_a_404_not_a_500(login, join_node, path):
    join_node("gpu01", rack="r1")
    answer = login("viewer").get(path)
    assert answer.status_code == 404 and b"No such page" in answer.content


@pytest.mark.parametrize(("query", "named"), [("q=%00", "q"), ("model=a%00b", "model"), ("%00=1", "query")])
def test_a_nul_in_a_console_query_is_a_400_naming_the_parameter(login, join_node, query, named):
    join_node("gpu01", rack="r1")
    answer = login("viewer").get(f"/models/?{query}")
    assert answer.status_code == 400
    assert f"<h1>{named}: must not contain NUL characters</h1>".encode() in answer.content


@pytest.mark.django_db(transaction=True)
def test_a_socket_message_holding_text_the_database_cannot_take_is_ignored_and_the_socket_lives(make_user):
    from agents.consumers import ModelsConsumer, NodesConsumer
    from agents.events import nodes_changed, placement_changed
    from placement.models import Model

    heartbeat("gpu01", rack="r1", gpus=1)
    Model.objects.create(name="m01", replicas=0, gpus=1)
    user, _ = make_user("viewer1", "viewer")

    async def run():
        from asgiref.sync import sync_to_async

        nodes = communicate("/ws/nodes/", user, NodesConsumer)
        models = communicate("/ws/models/", user, ModelsConsumer)
        assert (await nodes.connect())[0] and (await models.connect())[0]
        await nodes.send_json_to({"shown": "gpu01"})
        for bad in ({"shown": "gpu01 a\x00b"}, {"shown": "gpu01 \ud800"}, {"filter": "q=a%00b"},
                    {"filter": "state=ready", "shown": "\x00"}):
            await nodes.send_json_to(bad)
        for bad in ({"filter": "q=a%00b"}, {"filter": "model=%00"}, {"filter": "q=\ud800"}, {"filter": "%00=1"}):
            await models.send_json_to(bad)
        await nodes.receive_nothing(0.2)
        await sync_to_async(nodes_changed)()
        await sync_to_async(placement_changed)()
        row, page = await nodes.receive_from(timeout=5), await models.receive_from(timeout=5)
        await nodes.disconnect()
        await models.disconnect()
        return row, page

    row, page = async_to_sync(run)()
    assert row.startswith('<tr id="node-gpu01" hx-swap-oob="true"')  # the rows it said before
    assert 'id="model-m01"' in page  # the page it showed before: no filter
