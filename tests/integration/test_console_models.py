"""The console's Models page at scale: models by pages, a model's replicas by pages on its own page, the
pending replicas of a model grouped by their reason (said once, the facility's causes first), a page whose
size and queries do not grow with replicas, and a live socket that renders the page the browser shows."""

from __future__ import annotations

import re

import pytest

from placement.models import Model, Replica, ReplicaState
from tests.integration.test_console import login  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db

PLACED = {
    "why": "leaves 0 GPUs free",
    "summary": "passed over (20 nodes): 20 × gpu: 8 requested, 0 free",
    "passed_over": 20,
    "rejections": [{"node": f"gpu{k:03d}", "reason": "gpu: 8 requested, 0 free"} for k in range(20)],
    "shards": [],
}
WAITING = "no node fits (40 nodes): 25 × rack r1 is held: PDU swap; 15 × gpu: 8 requested, 0 free"
PENDING = {
    "summary": WAITING,
    "causes": ["rack r1 held (25 nodes)", "15 nodes with fewer than 8 GPUs free"],
    "nodes_checked": 40,
    "rejections": [{"node": f"gpu{k:03d}", "reason": "rack r1 is held: PDU swap"} for k in range(20)],
}


def models(count: int, replicas: int, *, pending: int = 0) -> None:
    """`count` models of `replicas` placed replicas (no shards: what the page costs is the rows) and
    `pending` waiting ones each."""
    made = [Model.objects.create(name=f"m{i:02d}", replicas=replicas + pending, gpus=8) for i in range(count)]
    Replica.objects.bulk_create(
        [
            Replica(model=m, ordinal=j + 1, state=ReplicaState.PLACED, explain=PLACED)
            for m in made
            for j in range(replicas)
        ]
        + [
            Replica(model=m, ordinal=replicas + j + 1, state=ReplicaState.PENDING, reason=WAITING, explain=PENDING)
            for m in made
            for j in range(pending)
        ],
        batch_size=2000,
    )


def shown_models(html: str) -> list[str]:
    return re.findall(r'<section class="card model" id="model-([^"]+)"', html)


def shown_replicas(html: str) -> list[str]:
    return re.findall(r'<tr id="replica-([^"]+)"', html)


def test_models_come_by_pages_of_ten_and_htmx_gets_the_list_alone(login):  # noqa: F811
    models(12, 2)
    client = login("viewer")
    first = client.get("/models/").content.decode()
    assert shown_models(first) == [f"m{i:02d}" for i in range(10)]
    assert "page 1 of 2 (1–10 of 12)" in first
    second = client.get("/models/", {"page": 2}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in second and second.lstrip().startswith("<div id=\"models\"")
    assert shown_models(second) == ["m10", "m11"]
    assert 'name="filter" value="page=2"' in second  # what the page tells its socket
    assert shown_models(client.get("/models/", {"q": "M1"}).content.decode()) == ["m10", "m11"]
    assert "No model matches “zz”." in client.get("/models/", {"q": "zz"}).content.decode()


@pytest.mark.parametrize("replicas", [20, 400])
def test_the_page_shows_the_first_replicas_and_its_size_and_queries_do_not_grow_with_them(
    login, django_assert_max_num_queries, replicas  # noqa: F811
):
    models(12, replicas, pending=replicas)
    client = login("viewer")
    with django_assert_max_num_queries(24):
        page = client.get("/models/").content.decode()
    assert len(shown_replicas(page)) == 10 * 10
    assert f"all {replicas * 1} replicas of m00 ›" in page
    # Every model's pending replicas said once, with their count.
    assert page.count(f"<strong>{replicas} replicas</strong> (#{replicas + 1} … #{2 * replicas}) wait:") == 10
    assert page.count("<li>rack r1 held (25 nodes)</li>") == 10
    assert page.count(WAITING) == 10
    assert len(page.encode()) < 120_000  # 12 models of 40 replicas or of 800: the same page


def test_a_models_own_page_lists_its_replicas_by_pages_of_fifty(login):  # noqa: F811
    models(2, 120, pending=3)
    client = login("viewer")
    first = client.get("/models/m01/").content.decode()
    assert shown_models(first) == ["m01"]
    assert shown_replicas(first) == [f"m01-{j}" for j in range(1, 51)]
    assert "page 1 of 3 (1–50 of 120)" in first
    assert first.count("20 rejections kept") == 51  # each placed replica's, and the pending group's
    third = client.get("/models/m01/", {"page": 3}, HTTP_HX_REQUEST="true").content.decode()
    assert shown_replicas(third) == [f"m01-{j}" for j in range(101, 121)]
    assert 'name="filter" value="model=m01&amp;page=3"' in third
    assert client.get("/models/nope/").status_code == 404


def test_pending_replicas_say_why_once_the_facility_first_and_the_api_says_it_too(login, join_node, api):  # noqa: F811
    from facility.services import hold_create
    from placement.reconcile import reconcile_all

    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1")
    join_node("gpu03", rack="r2")
    hold_create(domain="rack:r1", reason="PDU swap")
    Model.objects.create(name="big", replicas=5, gpus=8)
    reconcile_all()
    page = login("viewer").get("/models/").content.decode()
    section = page[page.index('id="model-big"') :]
    assert "<strong>4 replicas</strong> (#2 … #5) wait:" in section
    causes = re.findall(r"<li>([^<]+)</li>", section[: section.index("</ul>")])
    assert causes == ["rack r1 held (2 nodes)", "1 node with fewer than 8 GPUs free"]
    # The planner's own words stay, once.
    assert section.count("no node fits (3 nodes): 2 × rack r1 is held: PDU swap; 1 × gpu: 8 requested, 0 free") == 1
    explain = api.get("/api/v1/models/big/explain").json()
    pending = [r for r in explain["replicas"] if r["state"] == "pending"]
    assert pending[0]["causes"] == ["rack r1 held (2 nodes)", "1 node with fewer than 8 GPUs free"]


def test_the_live_socket_renders_the_page_the_browser_shows():
    from agents.consumers import ModelsConsumer

    models(12, 1)
    consumer = ModelsConsumer()
    consumer.filter = "page=2"
    html = consumer.html()
    assert 'hx-swap-oob="true"' in html
    assert shown_models(html) == ["m10", "m11"]
    consumer.filter = "model=m03"
    assert shown_models(consumer.html()) == ["m03"]
    Model.objects.filter(name="m03").delete()
    assert "Model m03 is gone: it was deleted." in consumer.html()
