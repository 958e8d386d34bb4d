"""The recorded `sites` series (tests/fixtures/netbox/<version>/sites/): a real NetBox 4.6.8 with two sites
that reuse names, then changed step by step the way a site changes.

s1-two-sites: sto1 and got1, each with location hall-1, racks R-A01/R-A02/R-B01, panels PP-A/PP-B, an A and a
B feed and PDU per rack; sto1 230 V 16 A single-phase (R-A02 13 A), got1 415 V 32 A three-phase, all at 80 %;
got1 also a −48 V DC feed DC-1 and three uncabled feeds (A02-F failed, P-1 planned, DC-3P three-phase DC).
s2-feed-deleted: sto1's A02-B deleted. s3-rack-renamed: sto1's R-B01 → R-B01-NEW. s4-panel-renamed: got1's
PP-B → PP-B2. s5-utilization-edited: got1's A01-A 80 → 60 %, sto1's A01-A 16 → 20 A.

These tests check the fixtures say what the README says and that the stand-in serves them as NetBox did;
they run today's importer over each step only to show it reads them, asserting nothing of its caps.
"""

from __future__ import annotations

import csv
import io
import json

import pynetbox
import pytest

from facility import netbox, netbox_csv
from tests.fakes.netbox import FIXTURES, FakeNetbox, newest_version, recorded, series_steps

SERIES = FIXTURES / newest_version() / "sites"
META = json.loads((SERIES / "meta.json").read_text())
STEPS = series_steps("sites")
ENDPOINTS = ["sites", "locations", "racks", "power-panels", "power-feeds", "power-ports", "power-outlets",
             "devices", "cables"]


def by_name(objs: list[dict], name: str, site: str | None = None) -> list[dict]:
    """The objects called ``name`` (of site ``site``'s slug, where given)."""
    return [o for o in objs if o["name"] == name and (site is None or site_of(o) == site)]


def site_of(obj: dict) -> str:
    return (obj.get("site") or (obj.get("power_panel") or {}).get("site") or {}).get("slug") or ""


def feed(data: dict, site: str, panel: str, name: str) -> dict:
    panels = {p["id"]: p for p in data["power-panels"]}
    found = [f for f in data["power-feeds"] if f["name"] == name and panels[f["power_panel"]["id"]]["name"] == panel
             and panels[f["power_panel"]["id"]]["site"]["slug"] == site]
    assert len(found) == 1, (site, panel, name, found)
    return found[0]


def csv_rows(step: str) -> list[dict]:
    text = (FIXTURES / newest_version() / step / "power-feeds.all-data.csv").read_text(encoding="utf-8-sig")
    return list(csv.DictReader(io.StringIO(text)))


def test_the_series_has_its_five_steps_in_order():
    assert STEPS == ["sites/s1-two-sites", "sites/s2-feed-deleted", "sites/s3-rack-renamed",
                     "sites/s4-panel-renamed", "sites/s5-utilization-edited"]
    assert META["netbox_version"] == "4.6.8"
    for step in STEPS:
        data = recorded(step)
        assert set(ENDPOINTS) <= set(data), step
        for endpoint in ENDPOINTS:
            ids = [o["id"] for o in data[endpoint]]
            assert ids == sorted(ids), (step, endpoint)


def test_an_unknown_snapshot_is_refused_rather_than_served_empty():
    with pytest.raises(FileNotFoundError, match="no recorded NetBox snapshot"):
        recorded("sites/s9-none")


def test_two_sites_reuse_location_rack_panel_feed_and_device_names():
    data = recorded("sites/s1-two-sites")
    sites = {s["slug"]: s["id"] for s in data["sites"]}
    assert set(sites) == {"sto1", "got1"}
    for endpoint, name in [("racks", "R-A01"), ("racks", "R-B01"), ("power-panels", "PP-B"),
                           ("devices", "R-A01-PDU-A"), ("devices", "gpu01")]:
        found = by_name(data[endpoint], name)
        assert sorted(o["site"]["id"] for o in found) == sorted(sites.values()), (endpoint, name)
    assert sorted(loc["site"]["id"] for loc in data["locations"] if loc["slug"] == "hall-1") == sorted(sites.values())
    assert feed(data, "sto1", "PP-A", "A01-A")["id"] != feed(data, "got1", "PP-A", "A01-A")["id"]
    # Each site's gpu01 tells itself apart by its PSUs' maximum draw: 5 kW in sto1, 6 kW in got1.
    draws = {site_of(d): {p["maximum_draw"] for p in data["power-ports"] if p["device"]["id"] == d["id"]}
             for d in by_name(data["devices"], "gpu01")}
    assert draws == {"sto1": {5000}, "got1": {6000}}


def test_every_server_psu_is_cabled_to_its_racks_pdus_on_two_legs_where_three_phase():
    data = recorded("sites/s1-two-sites")
    outlets = {o["id"]: o for o in data["power-outlets"]}
    devices = {d["id"]: d for d in data["devices"]}
    servers = [d for d in data["devices"] if d["role"]["slug"] == "gpu-server"]
    assert sorted((site_of(d), d["name"]) for d in servers) == sorted(
        [("sto1", f"gpu0{i}") for i in range(1, 7)] + [("got1", "gpu01"), ("got1", "gpu11"), ("got1", "gpu12")])
    for server in servers:
        psus = {p["name"]: p for p in data["power-ports"] if p["device"]["id"] == server["id"]}
        peers = {name: outlets[p["link_peers"][0]["id"]] for name, p in psus.items()}
        rack = server["rack"]["name"]
        assert {n: devices[o["device"]["id"]]["name"] for n, o in peers.items()} == {
            "PSU1": f"{rack}-PDU-A", "PSU2": f"{rack}-PDU-B"}, server["name"]
        assert all(p["allocated_draw"] < p["maximum_draw"] for p in psus.values())
        legs = {(o["feed_leg"] or {}).get("value") for o in peers.values()}
        if site_of(server) == "sto1":
            assert legs == {None}, server["name"]
        else:
            assert len(legs) == 2 and legs <= {"A", "B", "C"}, (server["name"], legs)


def test_ids_stay_across_steps_and_the_renamed_rack_and_panel_keep_theirs():
    first = recorded(STEPS[0])
    steps = {s["step"]: s for s in META["steps"]}
    rack_id, panel_id = steps["s3-rack-renamed"]["rack_id"], steps["s4-panel-renamed"]["panel_id"]
    deleted = steps["s2-feed-deleted"]["feed_id"]
    for step in STEPS[1:]:
        data = recorded(step)
        for endpoint in ENDPOINTS:
            gone = {deleted} if endpoint == "power-feeds" else set()
            assert {o["id"] for o in data[endpoint]} == {o["id"] for o in first[endpoint]} - gone, (step, endpoint)
    names = {step: {r["id"]: r["name"] for r in recorded(step)["racks"]}[rack_id] for step in STEPS}
    assert names == dict(zip(STEPS, ["R-B01", "R-B01", "R-B01-NEW", "R-B01-NEW", "R-B01-NEW"], strict=True))
    panels = {step: {p["id"]: p["name"] for p in recorded(step)["power-panels"]}[panel_id] for step in STEPS}
    assert panels == dict(zip(STEPS, ["PP-B", "PP-B", "PP-B", "PP-B2", "PP-B2"], strict=True))
    renamed = recorded("sites/s4-panel-renamed")
    assert {f["power_panel"]["name"] for f in renamed["power-feeds"] if f["power_panel"]["id"] == panel_id} == {"PP-B2"}
    assert {f["rack"]["name"] for f in renamed["power-feeds"] if (f["rack"] or {}).get("id") == rack_id} == {"R-B01-NEW"}


def test_the_deleted_feed_is_gone_and_its_pdu_stays_unfed():
    before, after = recorded("sites/s1-two-sites"), recorded("sites/s2-feed-deleted")
    step = next(s for s in META["steps"] if s["step"] == "s2-feed-deleted")
    assert step["feed_id"] == feed(before, "sto1", "PP-B", "A02-B")["id"]
    assert step["feed_id"] not in {f["id"] for f in after["power-feeds"]}
    assert len(after["power-feeds"]) == len(before["power-feeds"]) - 1
    pdu = by_name(after["devices"], "R-A02-PDU-B", "sto1")
    assert [d["id"] for d in pdu] == [step["pdu_device_id"]]
    inlet = next(p for p in after["power-ports"] if p["id"] == step["pdu_input_port_id"])
    assert inlet["device"]["id"] == step["pdu_device_id"] and inlet["name"] == "input"
    # NetBox keeps the cable, now with no A end: the port still says cable #8, but has no peer.
    assert inlet["cable"]["id"] == step["cable_id"] and inlet["_occupied"] is True
    assert inlet["link_peers"] == [] and inlet["link_peers_type"] is None and inlet["connected_endpoints"] is None
    cable = next(c for c in after["cables"] if c["id"] == step["cable_id"])
    assert cable["a_terminations"] == [] and [t["object_id"] for t in cable["b_terminations"]] == [inlet["id"]]
    # Its outlets still feed gpu03/gpu04's PSU2s.
    outlets = [o for o in after["power-outlets"] if o["device"]["id"] == step["pdu_device_id"] and o["cable"]]
    assert len(outlets) == 2


def test_available_power_as_netbox_figures_it():
    power = {step: {key: v["available_power"] for key, v in feeds.items()}
             for step, feeds in META["available_power"].items()}
    assert power["s1-two-sites"]["sto1/PP-A/A01-A"] == 2944  # 230 V × 16 A × 80 %
    assert power["s1-two-sites"]["sto1/PP-A/A02-A"] == 2392  # 230 V × 13 A × 80 %
    assert power["s1-two-sites"]["got1/PP-A/A01-A"] == 18401  # 415 V × 32 A × 80 % × 1.732
    assert power["s1-two-sites"]["got1/PP-A/DC-1"] == 1920  # |−48 V| × 50 A × 80 %
    assert power["s1-two-sites"]["got1/PP-B/DC-3P"] == 6651  # NetBox applies √3 to a DC feed called three-phase
    assert power["s5-utilization-edited"]["sto1/PP-A/A01-A"] == 3680  # 20 A: the cap rises
    assert power["s5-utilization-edited"]["got1/PP-A/A01-A"] == 13801  # 60 %: the cap falls
    assert "sto1/PP-B/A02-B" in power["s1-two-sites"] and "sto1/PP-B/A02-B" not in power["s2-feed-deleted"]
    assert "got1/PP-B2/A01-B" in power["s4-panel-renamed"] and "got1/PP-B/A01-B" not in power["s4-panel-renamed"]
    for step in STEPS:
        rows = {int(r["ID"]): r for r in csv_rows(step)}
        assert set(rows) == {f["id"] for f in recorded(step)["power-feeds"]}, step
        for key, v in META["available_power"][step.split("/")[1]].items():
            assert int(rows[v["id"]]["Available Power (VA)"]) == v["available_power"], (step, key)


def test_the_csv_site_column_is_the_racks_site_name_and_empty_without_a_rack():
    rows = {(r["Power Panel"], r["Name"], r["Site"]): r["Rack"] for r in csv_rows("sites/s1-two-sites")}
    # Both sites' PP-A/A01-A, told apart only by the site's name (not its slug)...
    assert rows[("PP-A", "A01-A", "STO1")] == rows[("PP-A", "A01-A", "GOT1")] == "R-A01"
    # ...and a feed with no rack names no site at all, though its panel is got1's.
    assert rows[("PP-A", "P-1", "")] == rows[("PP-B", "DC-3P", "")] == ""


@pytest.mark.parametrize("step", STEPS)
def test_the_stand_in_filters_by_site_as_netbox_did(step):
    expected = META["site_filter_ids"][step.split("/")[1]]
    with FakeNetbox(recorded(step)) as nb:
        api = pynetbox.api(nb.url, token="t0ken")
        for slug, endpoints in expected.items():
            for endpoint, ids in endpoints.items():
                got = sorted(r.id for r in getattr(api.dcim, endpoint.replace("-", "_")).filter(site=slug))
                assert got == ids, (slug, endpoint)


@pytest.mark.parametrize("step", STEPS)
def test_todays_importer_reads_each_step(step):
    data = recorded(step)
    for site in (None, "sto1", "got1"):
        plan = netbox.plan_from_objects(data, nodes={"gpu01", "gpu05"}, site=site)
        assert isinstance(plan, netbox.NetboxPlan)
    text = (FIXTURES / newest_version() / step / "power-feeds.all-data.csv").read_text()
    assert isinstance(netbox_csv.plan_from_csv(text), netbox.NetboxPlan)
