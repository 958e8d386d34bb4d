"""A NetBox that moves: two sites reusing names, a feed deleted, a rack renamed, a cap lowered.

The site is built here in NetBox's own shapes (tests/fakes/netbox.py serves it as NetBox does), the way a
real one grows; every import goes through ``llmgw ctl facility import netbox`` as an operator types it.
sto1 runs 230 V 16 A single-phase feeds (2.9 kW each; R-A02's are 12.5 A, 2.3 kW), got1 415 V 32 A
three-phase ones (18.4 kW). Both sites have a location hall-1, racks R-A01, R-A02 and R-B01, panels PP-A and
PP-B with feeds A01-A, A01-B …, PDUs R-A01-PDU-A …, and a device gpu01.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest

from agents.models import Node
from facility.feed_selectors import feed_loss_report, feeds_overview
from facility.models import Budget, DcimObject, DomainSample, Feed, Hold
from facility.services import budget_set, hold_create
from llmgw.ctl import main as ctl
from tests.fakes.netbox import FakeNetbox

pytestmark = pytest.mark.django_db(transaction=True)

RACKS = ("R-A01", "R-A02", "R-B01")
NODES = {"sto1": {"R-A01": ["gpu01", "gpu02"], "R-A02": ["gpu03", "gpu04"], "R-B01": ["gpu05", "gpu06"]},
         "got1": {"R-A01": ["gpu01", "gpu11"], "R-B01": ["gpu12"]}}


def two_sites() -> dict[str, list[dict]]:
    data: dict[str, list[dict]] = {k: [] for k in (
        "sites", "locations", "racks", "power-panels", "power-feeds", "power-ports", "power-outlets", "devices")}
    ids = itertools.count(1)
    for slug in ("sto1", "got1"):
        site = {"id": next(ids), "name": slug.upper(), "slug": slug}
        data["sites"].append(site)
        location = {"id": next(ids), "name": "Hall 1", "slug": "hall-1", "site": site, "parent": None}
        data["locations"].append(location)
        panels = {}
        for side in "AB":
            panels[side] = {"id": next(ids), "name": f"PP-{side}", "site": site}
            data["power-panels"].append(panels[side])
        for rack_name in RACKS:
            rack = {"id": next(ids), "name": rack_name, "site": site, "location": location,
                    "status": {"value": "active"}}
            data["racks"].append(rack)
            outlets = {}
            for side in "AB":
                three = slug == "got1"
                feed = {
                    "id": next(ids), "name": f"{rack_name[2:]}-{side}", "power_panel": panels[side],
                    "rack": {"id": rack["id"], "name": rack_name}, "status": {"value": "active"},
                    "voltage": 415 if three else 230, "amperage": 32 if three else (12.5 if rack_name == "R-A02" else 16),
                    "phase": {"value": "three-phase" if three else "single-phase"}, "supply": {"value": "ac"},
                    "max_utilization": 80,
                }
                pdu = {"id": next(ids), "name": f"{rack_name}-PDU-{side}", "site": site, "rack": {"id": rack["id"]},
                       "role": {"slug": "pdu"}}
                port = {"id": next(ids), "device": {"id": pdu["id"]}, "name": "input",
                        "link_peers_type": "dcim.powerfeed", "link_peers": [{"id": feed["id"]}]}
                feed["link_peers_type"], feed["link_peers"] = "dcim.powerport", [{"id": port["id"]}]
                data["power-feeds"].append(feed)
                data["devices"].append(pdu)
                data["power-ports"].append(port)
                outlets[side] = []
                for n in range(4):
                    outlet = {"id": next(ids), "device": {"id": pdu["id"]}, "name": str(n + 1),
                              "feed_leg": {"value": "ABC"[n % 3]} if three else None}
                    data["power-outlets"].append(outlet)
                    outlets[side].append(outlet)
            for n, name in enumerate(NODES[slug].get(rack_name, [])):
                device = {"id": next(ids), "name": name, "site": site, "location": location,
                          "rack": {"id": rack["id"]}, "role": {"slug": "gpu-server"}}
                data["devices"].append(device)
                for side, psu in (("A", "PSU1"), ("B", "PSU2")):
                    outlet = outlets[side][n]
                    data["power-ports"].append({
                        "id": next(ids), "device": {"id": device["id"]}, "name": psu, "maximum_draw": 5000,
                        "link_peers_type": "dcim.poweroutlet", "link_peers": [{"id": outlet["id"]}]})
    return data


def feed(data: dict, site: str, name: str) -> dict:
    sid = next(s["id"] for s in data["sites"] if s["slug"] == site)
    return next(f for f in data["power-feeds"] if f["name"] == name and f["power_panel"]["site"]["id"] == sid)


def rack(data: dict, site: str, name: str) -> dict:
    return next(r for r in data["racks"] if r["name"] == name and r["site"]["slug"] == site)


@pytest.fixture
def joined(join_node):
    for name in ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06", "gpu11", "gpu12"):
        join_node(name)


def run(tmp_path: Path, capsys, data: dict, *extra: str, code: int = 0) -> dict:
    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    with FakeNetbox(data) as nb:
        got = ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "-o", "json", *extra])
    out, err = capsys.readouterr()
    assert got == code, err
    return json.loads(out)


def lines(tmp_path: Path, capsys, data: dict, *extra: str) -> list[str]:
    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    with FakeNetbox(data) as nb:
        assert ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), *extra]) == 0
    return capsys.readouterr().out.splitlines()


def caps(prefix: str = "rack:") -> dict[str, float]:
    return {b.domain: round(b.effective_cap_watts) for b in Budget.objects.filter(domain__startswith=prefix)}


def test_a_second_sites_import_leaves_the_first_sites_feeds_and_caps(tmp_path, capsys, joined):
    data = two_sites()
    run(tmp_path, capsys, data, "--site", "sto1")
    sto1 = caps()
    assert sto1 == {"rack:R-A01": 2944, "rack:R-A02": 2300, "rack:R-B01": 2944}
    result = run(tmp_path, capsys, data, "--site", "got1")
    assert result["feeds_removed"] == [] and not result["needs_yes"]
    after = caps()
    assert {d: c for d, c in after.items() if d in sto1} == sto1  # untouched
    # got1's racks and feeds share sto1's names: they are qualified by their site, none is skipped.
    assert {d: c for d, c in after.items() if d not in sto1} == {
        "rack:got1.R-A01": 18401, "rack:got1.R-A02": 18401, "rack:got1.R-B01": 18401}
    assert result["skipped"] == []
    assert Feed.objects.get(name="got1.A01-A").site == "got1" and Feed.objects.get(name="A01-A").site == "sto1"
    assert round(Budget.objects.get(domain="pdu:got1.R-A01-PDU-A").cap_watts) == 18401
    # A re-import of either site changes nothing.
    again = run(tmp_path, capsys, data, "--site", "sto1", "--dry-run")
    assert not any(again[k] for k in ("feeds_added", "feeds_changed", "feeds_removed", "labels", "caps"))


def test_one_import_of_every_site_qualifies_every_name_two_sites_share(tmp_path, capsys, joined):
    result = run(tmp_path, capsys, two_sites())
    feeds = {f.name for f in Feed.objects.all()}
    assert {"sto1.A01-A", "got1.A01-A", "sto1.B01-B", "got1.B01-B"} <= feeds and len(feeds) == 12
    assert result["skipped"] == []
    assert caps()["rack:sto1.R-A02"] == 2300 and caps()["rack:got1.R-A02"] == 18401


def test_a_device_name_two_sites_share_relabels_nothing_until_mapped(tmp_path, capsys, joined):
    data = two_sites()
    run(tmp_path, capsys, data, "--site", "sto1")
    assert Node.objects.get(name="gpu01").labels["llmgw.io/rack"] == "R-A01"
    result = run(tmp_path, capsys, data, "--site", "got1")
    assert result["ambiguous"] == [
        "device gpu01 of site got1: a device of site sto1 has that name too; neither labels node gpu01 until one is "
        "mapped (--map got1/gpu01=gpu01)"]
    assert "gpu01" not in result["labels"]
    labels = Node.objects.get(name="gpu01").labels
    assert (labels["llmgw.io/site"], labels["llmgw.io/rack"]) == ("sto1", "R-A01")  # the real one, unmoved
    # The operator says which node got1's device is: it labels that node, and the mapping is kept.
    run(tmp_path, capsys, data, "--site", "got1", "--map", "got1/gpu01=gpu21")
    assert DcimObject.objects.get(kind="device", site="got1", name="gpu21")
    again = run(tmp_path, capsys, data, "--site", "got1", "--dry-run")
    assert again["ambiguous"] == [] and "gpu01" not in again["labels"]


def test_a_deleted_feed_leaves_its_pdu_unfed_and_never_raises_a_cap(tmp_path, capsys, joined):
    data = two_sites()
    run(tmp_path, capsys, data, "--site", "sto1")
    before = caps()
    gone = feed(data, "sto1", "A02-B")
    data["power-feeds"].remove(gone)
    for port in data["power-ports"]:
        if port.get("link_peers") == [{"id": gone["id"]}]:
            port["link_peers"], port["link_peers_type"] = [], None  # NetBox removes the cable with the feed
    out = lines(tmp_path, capsys, data, "--site", "sto1", "--dry-run")
    assert "! waits for a yes: feed A02-B removed" in out
    assert "! unfed: PDU R-A02-PDU-B: no live feed reaches its input; it carries nothing" in out
    # Applied without a yes: the feed stays (its removal waits), so no cap rises and nothing is said twice.
    run(tmp_path, capsys, data, "--site", "sto1")
    assert caps() == before and Feed.objects.filter(name="A02-B").exists()
    result = run(tmp_path, capsys, data, "--site", "sto1", "--yes")
    assert result["feeds_removed"] == ["A02-B"]
    assert caps() == before  # R-A02 keeps the smallest live feed's 2.3 kW
    assert Budget.objects.get(domain="pdu:R-A02-PDU-B").cap_watts == 0
    # N−1 knows gpu03 and gpu04 are single-fed: losing A02-A powers them off.
    report = feed_loss_report(feed="A02-A")
    assert report["feeds"][0]["violations"][0]["dark_nodes"] == ["gpu03", "gpu04"]
    unfed = feeds_overview()["unfed_pdus"]
    assert [u["pdu"] for u in unfed] == ["R-A02-PDU-B"] and unfed[0]["nodes"] == ["gpu03", "gpu04"]
    assert ctl(["facility", "feeds"]) == 0
    assert "! PDU R-A02-PDU-B: no live feed reaches its input; 2 node(s) on it run on their other PDU alone" in (
        capsys.readouterr().out)
    from placement.whatif import what_if

    leaving = {m["node"] for m in what_if(feed="A02-A").get("moves", [])} | set(
        n for v in what_if(feed="A02-A")["feed_loss"] for n in v["dark_nodes"])
    assert {"gpu03", "gpu04"} <= leaving


def test_a_renamed_rack_keeps_its_budget_hold_and_history(tmp_path, capsys, joined):
    data = two_sites()
    run(tmp_path, capsys, data, "--site", "sto1")
    budget_set(domain="rack:R-B01", cap_watts=2000)
    hold_create(domain="rack:R-B01", reason="PDU swap")
    from django.utils import timezone

    DomainSample.objects.create(domain="rack:R-B01", resolution=1, at=timezone.now(), use_watts=1, reserved_watts=1)
    rack(data, "sto1", "R-B01")["name"] = "R-B01-NEW"
    out = lines(tmp_path, capsys, data, "--site", "sto1", "--dry-run")
    assert "! renamed: rack:R-B01 -> rack:R-B01-NEW (its budget, hold, conditions and history follow)" in out
    result = run(tmp_path, capsys, data, "--site", "sto1")
    assert result["held_back"] == [] and result["renamed"] == [{"from": "rack:R-B01", "to": "rack:R-B01-NEW"}]
    assert Budget.objects.get(domain="rack:R-B01-NEW").cap_watts == 2000
    assert Hold.objects.get(domain="rack:R-B01-NEW").reason == "PDU swap"
    assert DomainSample.objects.filter(domain="rack:R-B01-NEW").count() == 1
    assert not Budget.objects.filter(domain="rack:R-B01").exists() and not Hold.objects.filter(domain="rack:R-B01")
    assert Node.objects.get(name="gpu05").labels["llmgw.io/rack"] == "R-B01-NEW"


def test_a_cap_that_rises_waits_and_one_that_falls_below_the_use_is_said_first(tmp_path, capsys, joined):
    data = two_sites()
    run(tmp_path, capsys, data, "--site", "sto1")
    higher = copy.deepcopy(data)
    feed(higher, "sto1", "A01-A")["amperage"] = 20
    feed(higher, "sto1", "A01-B")["amperage"] = 20
    result = run(tmp_path, capsys, higher, "--site", "sto1")
    assert result["held_back"] == [
        "pdu R-A01-PDU-A: cap 2.9 kW -> 3.7 kW, from feed A01-A 230 V 20 A 1φ 80 %",
        "pdu R-A01-PDU-B: cap 2.9 kW -> 3.7 kW, from feed A01-B 230 V 20 A 1φ 80 %",
        "rack R-A01: cap 2.9 kW -> 3.7 kW, from feed A01-A 230 V 20 A 1φ 80 % (smallest of 2 feeds: each carries "
        "the rack alone)",
    ]
    assert caps()["rack:R-A01"] == 2944
    run(tmp_path, capsys, higher, "--site", "sto1", "--yes")
    assert caps()["rack:R-A01"] == 3680
    # A cap that falls is applied at once, and the dry run says first that it is below the use now.
    lower = copy.deepcopy(higher)
    feed(lower, "sto1", "A02-A")["amperage"] = 2
    out = lines(tmp_path, capsys, lower, "--site", "sto1", "--dry-run")
    assert out[0] == (
        "! pdu R-A02-PDU-A: the new cap 0.4 kW leaves a limit of 0.3 kW, 0.4 kW below its use now (0.7 kW)")
    result = run(tmp_path, capsys, lower, "--site", "sto1")
    assert result["applied"] and result["held_back"] == [] and caps()["rack:R-A02"] == 368


def test_while_netbox_answers_the_import_holds_no_database_connection(admin_client, settings, monkeypatch, joined):
    from django.db import connection

    from facility import netbox_import

    settings.LLMGW_NETBOX_URLS = ["http://netbox.test"]
    held: list[bool] = []

    def slow_netbox(api, *, site=None, progress=None):
        held.append(connection.connection is not None)  # what a NetBox trickling its answer would keep
        return two_sites()

    monkeypatch.setattr(netbox_import, "objects_from_api", slow_netbox)
    answer = admin_client.post("/api/v1/facility/import/netbox",
                               {"url": "http://netbox.test", "token": "t", "site": "sto1", "dry_run": True},
                               content_type="application/json")
    assert answer.status_code == 202, answer.content
    job = answer.json()
    assert held == [False] and job["state"] == "done" and job["result"]["feeds_added"]
    assert answer["Location"] == f"/api/v1/facility/import/jobs/{job['id']}"


def test_the_facility_page_says_what_waits_for_a_yes(tmp_path, capsys, joined, admin_client):
    data = two_sites()
    run(tmp_path, capsys, data, "--site", "sto1")
    feed(data, "sto1", "A01-A")["amperage"] = 20
    run(tmp_path, capsys, data, "--site", "sto1")
    page = admin_client.get("/facility/").content.decode()
    assert "NetBox (sto1): 1 change waits for a yes" in page
    assert "pdu R-A01-PDU-A: cap 2.9 kW -&gt; 3.7 kW, from feed A01-A 230 V 20 A 1φ 80 %" in page
