"""The Facility page at a real site's size, over HTTP: its costly figures (N−1, shedding's next moves) worked
out when their inputs change and read from the cache otherwise, saying how old they are; the shedding card
bounded and paged; racks and PDUs counted apart; a row's power rolled up; a condition judged long ago shown
stale (page, API, /metrics); compressed answers; and the Nodes and Models pages' smaller fixes."""

from __future__ import annotations

import gzip
import re
from datetime import UTC, datetime, timedelta

import pytest

from facility import console_figures
from tests.integration.test_console import gpu_readings, heartbeat

pytestmark = pytest.mark.django_db

FEEDS = (
    "facility:\n  feeds:\n"
    "    - {name: A1, voltage: 230, amperage: 63, phase: single, pdus: [r1-a]}\n"
    "    - {name: B1, voltage: 230, amperage: 63, phase: single, pdus: [r2-a]}\n"
)


@pytest.fixture
def login(client, make_user):
    def as_role(role: str = "viewer"):
        user, _ = make_user(f"{role}1", role)
        client.force_login(user)
        return client

    return as_role


@pytest.fixture
def site():
    """r1 (over its limit) and r2 in row 1 of hall-a, each on a PDU of its own (r1's near its limit), each PDU
    on a feed."""
    from facility.services import budget_set, facility_apply

    labels = {"llmgw.io/room": "hall-a", "llmgw.io/row": "1"}
    # Two readings: one alone never sets the measured peak (the window's second-highest does).
    heartbeat("gpu01", rack="r1", pdu="r1-a", labels=labels, sensors=gpu_readings([60] * 8, power=601))
    heartbeat("gpu01", rack="r1", pdu="r1-a", labels=labels, sensors=gpu_readings([60] * 8, power=600))
    heartbeat("gpu02", rack="r2", pdu="r2-a", labels=labels)
    facility_apply(text=FEEDS)
    budget_set(domain="rack:r1", cap_watts=5900)  # 5,360 W of a 5,310 W limit: over
    budget_set(domain="rack:r2", cap_watts=16000)
    budget_set(domain="pdu:r1-a", cap_watts=6000)  # 5,360 W of a 5,400 W limit: near
    budget_set(domain="pdu:r2-a", cap_watts=16000)


def n1_worked_out(monkeypatch) -> list[float]:
    """The times the N−1 report is worked out, as the page reads it."""
    from facility import feed_selectors

    calls: list[float] = []
    report = feed_selectors.feed_loss_report

    def counted(**kwargs):
        calls.append(console_figures.clock())
        return report(**kwargs)

    monkeypatch.setattr(feed_selectors, "feed_loss_report", counted)
    return calls


def test_the_n1_report_is_worked_out_once_until_a_budget_changes_or_it_grows_old(site, login, monkeypatch):
    from facility.services import budget_set

    now = [1_800_000_000.0]
    monkeypatch.setattr(console_figures, "clock", lambda: now[0])
    calls = n1_worked_out(monkeypatch)
    client = login()
    first = client.get("/facility/").content.decode()
    client.get("/facility/")
    client.get("/facility/?q=r1", HTTP_HX_REQUEST="true")
    assert len(calls) == 1
    assert f' · worked out <time class="since" data-since="{int(now[0])}"></time> ago</span></h2></summary>' in first

    now[0] += 5
    budget_set(domain="rack:r2", cap_watts=15000)  # an input changed: worked out again at once
    client.get("/facility/")
    assert len(calls) == 2
    now[0] += console_figures.figures_seconds() - 1
    client.get("/facility/")
    assert len(calls) == 2
    now[0] += 2  # older than LLMGW_FACILITY_FIGURES_SECONDS: readings may have moved
    page = client.get("/facility/").content.decode()
    assert len(calls) == 3
    assert f'data-since="{int(now[0])}"' in page


def test_on_workers_a_load_shows_the_figures_kept_and_the_worker_works_out_the_next(site, login, monkeypatch):
    """A page load never plans on workers: it shows the figures kept, with their age, and asks the worker,
    which keeps new ones and tells the open pages. Only figures no worker has kept for long are its own."""
    from facility.services import budget_set

    now = [1_800_000_000.0]
    monkeypatch.setattr(console_figures, "clock", lambda: now[0])
    calls = n1_worked_out(monkeypatch)
    client = login()
    client.get("/facility/")  # nothing kept yet: worked out by the page
    assert len(calls) == 1

    monkeypatch.setattr(console_figures, "_on_workers", lambda: True)
    asked = []
    monkeypatch.setattr(console_figures.refresh_task, "apply_async", lambda **kw: asked.append(kw))
    told = []
    monkeypatch.setattr("agents.events.placement_changed", lambda: told.append(1))
    now[0] += 5
    budget_set(domain="rack:r2", cap_watts=15000)  # a new version
    page = client.get("/facility/").content.decode()
    # The kept report, and the worker asked (on Redis one task pending at a time: llmgw.coalesce).
    assert len(calls) == 1 and asked
    assert f'data-since="{int(now[0]) - 5}"' in page

    console_figures.refresh_task()  # the worker's round: the same report, the open pages not told
    assert len(calls) == 2 and told == []
    assert f'data-since="{int(now[0])}"' in client.get("/facility/").content.decode()
    assert len(calls) == 2
    # A report that differs from the one kept: the open pages are told.
    console_figures.keep("feed-loss", {"text": "0 violations", "feeds": []}, at=now[0], version="older")
    console_figures.refresh_task()
    assert len(calls) == 3 and told == [1]

    now[0] += console_figures.stale_seconds() + 1  # no worker answered for that long: the page's own
    client.get("/facility/")
    assert len(calls) == 4


def test_the_shedding_card_shows_twenty_moves_a_page_on_the_utc_clock(site, login):
    at = datetime(2026, 12, 7, 17, 5, tzinfo=UTC)
    moves = [
        {"at": (at + timedelta(minutes=5 * i)).isoformat(), "domain": "rack:r1", "action": "move",
         "replica": f"m#{i}", "replica_id": i, "model": "m", "class": "batch", "to": ["gpu02"], "reason": f"r{i}"}
        for i in range(45)
    ]
    # What shedding would do, kept as the page keeps it (45 moves, worked out at 17:05 UTC).
    console_figures.keep("shed", moves, at=console_figures.clock(), version=console_figures.facility_version())
    client = login()
    page = client.get("/facility/").content.decode()
    card = page[page.index('id="shed-moves"'):]
    card = card[: card.index("</section>")]
    assert "45 moves · worked out" in card
    assert card.count("<tr><td") == 20
    assert "page 1 of 3" in card and "later ›" in card
    assert re.search(r'<td class="nowrap">(Dec 07 )?17:05:00 UTC</td><td>rack:r1</td>', card)
    second = client.get("/facility/shed?page=2").content.decode()
    assert second.count("<tr><td") == 20 and "page 2 of 3" in second and "‹ sooner" in second
    assert ">m#20<" in second and ">m#19<" not in second
    assert client.get("/facility/shed?page=x").status_code == 200


def test_the_summary_counts_racks_and_pdus_apart(site, login):
    page = login().get("/facility/").content.decode()
    assert re.search(r'id="summary-over"[^>]*><strong>1</strong> rack over<', page)
    assert re.search(r'id="summary-pdu-over"[^>]*><strong>0</strong> PDUs over<', page)
    assert re.search(r'id="summary-near"[^>]*><strong>0</strong> racks near<', page)
    assert re.search(r'id="summary-pdu-near"[^>]*><strong>1</strong> PDU near<', page)
    assert 'id="summary-other-over"' not in page


def test_a_row_and_a_room_roll_up_their_racks_power(site, login):
    page = login().get("/facility/").content.decode()
    head = page[page.index('id="row-head-hall-a-1"'):]
    head = head[: head.index("</span></span>") + 14]
    assert re.search(r'<span class="row-power p-over" title="from rack r1: 1 over[^"]*">over</span>', head)
    room = page[page.index('id="room-head-hall-a"'):]
    assert '<span class="badge room-power p-over" title="from rack r1">over</span>' in room[: room.index("</h3>")]


def test_a_condition_judged_longer_ago_than_its_bound_is_stale_on_the_page_the_api_and_metrics(site, login, api):
    from django.utils import timezone

    from facility.evaluation import condition_stale_after
    from facility.models import DomainCondition

    now = timezone.now()
    DomainCondition.objects.create(domain="rack:r1", condition="ok", evaluated_at=now - timedelta(seconds=10))
    DomainCondition.objects.create(
        domain="rack:r2", condition="warm", evaluated_at=now - timedelta(seconds=condition_stale_after() + 60)
    )
    page = login().get("/facility/").content.decode()
    banner = page[page.index('id="conditions-stale"'):]
    banner = banner[: banner.index("</p>")]
    assert "Conditions not judged for" in banner and "rack:r2. The evaluation that judges them has stopped" in banner
    assert "rack:r1" not in banner
    assert re.search(r'id="rack-r2"[^>]*>.*?<span class="tile-stale"', page)
    assert not re.search(r'id="rack-r1"[^>]*><span class="tile-top">[^<]*<span class="tile-name">r1</span><span class="tile-stale"', page)

    domains = {d["domain"]: d for d in api.get("/api/v1/facility").json()["domains"]}
    assert domains["rack:r2"]["condition"]["stale"] is True
    assert domains["rack:r1"]["condition"]["stale"] is False
    assert domains["rack:r2"]["condition"]["judged_at"] == pytest.approx((now - timedelta(seconds=condition_stale_after() + 60)).timestamp())

    from facility.metrics import condition_families

    [judged] = [f for f in condition_families() if f.name == "llmgw_domain_condition_age_seconds"]
    ages = {s.labels["domain"]: s.value for s in judged.samples}
    assert ages["rack:r2"] == pytest.approx(condition_stale_after() + 60, abs=5)
    assert ages["rack:r1"] == pytest.approx(10, abs=5)


def test_pages_are_compressed_for_a_browser_that_takes_gzip(site, login):
    client = login()
    response = client.get("/facility/", HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert response["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in response["Vary"]
    assert "Worst first" in gzip.decompress(response.content).decode()
    assert "Content-Encoding" not in client.get("/facility/")


def test_rack_equals_a_name_in_the_nodes_filter_is_that_rack(site, login):
    page = login().get("/nodes/?domain=rack%3Dr1").content.decode()
    assert "No node has a rack label" not in page
    assert 'id="node-gpu01"' in page and 'id="node-gpu02"' not in page


def test_a_long_filter_is_not_echoed_whole(site, login):
    long = "r" * 2000
    page = login().get(f"/nodes/?domain={long}").content.decode()
    assert long not in page  # neither the input, the sort links nor the socket's form repeat it whole
    assert f'name="domain" value="{long[:300]}"' in page
    error = page[page.index('id="filter-error"'):]
    assert long not in error[: error.index("</p>")]
    assert len(error[: error.index("</p>")]) < 600


def test_the_models_page_has_one_line_a_model(login):
    from placement.reconcile import reconcile_all
    from placement.services import models_apply

    models_apply(text="kind: Model\nname: llama\nreplicas: 2\nclass: batch\nprofile:\n  gpus: 8\n  command: serve\n")
    reconcile_all()  # no node: both wait
    page = login().get("/models/").content.decode()
    line = page[page.index('id="line-llama"'):]
    line = line[: line.index("</tr>")]
    assert '<a href="#model-llama">llama</a>' in line
    assert re.search(r"<td>batch</td><td class=\"num\">0</td><td class=\"num\">0</td><td class=\"num\">2</td>"
                     r"<td><span class=\"state-held\">2 pending</span></td>", line)


def test_static_files_are_addressed_by_their_content_and_cached_for_good(login, client):
    page = login().get("/facility/").content.decode()
    found = re.search(r'href="(/static/css/facility\.([0-9a-f]{12})\.css)"', page)
    assert found, page[:1500]
    import hashlib
    from pathlib import Path

    source = Path(__file__).resolve().parents[2] / "static" / "css" / "facility.css"
    assert found[2] == hashlib.md5(source.read_bytes()).hexdigest()[:12]
    hashed = client.get(found[1])
    assert hashed.status_code == 200
    assert hashed["Cache-Control"] == "max-age=315360000, public, immutable"
    assert hashed["Content-Length"] == str(len(source.read_bytes()))
    plain = client.get("/static/css/facility.css")
    assert plain.status_code == 200 and "immutable" not in plain["Cache-Control"]
    # An address whose hash is not the file's is no file.
    assert client.get("/static/css/facility.000000000000.css").status_code == 404


def test_with_the_cache_down_the_page_works_its_figures_out_and_stops_asking(site, login, settings, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here: a Redis that is down
    settings.CACHES = {"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": f"redis://127.0.0.1:{port}/0",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }}
    monkeypatch.setattr(console_figures, "_cache_down_until", 0.0)
    calls = n1_worked_out(monkeypatch)
    client = login()
    page = client.get("/facility/")
    assert page.status_code == 200 and "N−1:" in page.content.decode()
    assert len(calls) == 1 and console_figures._cache_down_until > 0
    asked = []
    from django.core.cache import caches

    monkeypatch.setattr(caches["default"], "get", lambda *a, **k: asked.append(a))
    assert client.get("/facility/").status_code == 200
    assert len(calls) == 2 and asked == []  # worked out again, the cache not asked while it is down
