"""The NetBox import on what a real NetBox 4.6.8 answered as two sites grew and changed (the recorded `sites`
series: tests/fixtures/netbox/4.6.8/sites/, its README and meta.json), through the API path and the CSV
export, with every cap compared to NetBox's own available power (its CSV's Available Power (VA)).

s1: sto1 and got1 reuse location, rack, panel, feed, PDU and device names (sto1 230 V 16 A single-phase,
R-A02 13 A; got1 415 V 32 A three-phase). s2: sto1's feed A02-B deleted (its PDU left with a dangling
cable). s3: sto1's rack R-B01 renamed R-B01-NEW. s4: got1's panel PP-B renamed PP-B2. s5: got1's A01-A held
to 60 %, sto1's A01-A raised to 20 A.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.models import Node
from facility.feed_selectors import feed_loss_report
from facility.models import Budget, Feed, Hold
from facility.services import budget_set, hold_create
from llmgw.ctl import main as ctl
from tests.fakes.netbox import FIXTURES, FakeNetbox, newest_version, recorded

pytestmark = pytest.mark.django_db(transaction=True)

SERIES = FIXTURES / newest_version() / "sites"
POWER = json.loads((SERIES / "meta.json").read_text())["available_power"]
NODES = ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06", "gpu11", "gpu12")


@pytest.fixture
def joined(join_node):
    for name in NODES:
        join_node(name)


def api(tmp_path: Path, capsys, step: str, *extra: str) -> dict:
    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    with FakeNetbox(recorded(f"sites/{step}")) as nb:
        code = ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "-o", "json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def by_csv(tmp_path: Path, capsys, step: str, *extra: str) -> dict:
    path = tmp_path / f"{step}.csv"
    path.write_text((SERIES / step / "power-feeds.all-data.csv").read_text(encoding="utf-8-sig"))
    code = ctl(["facility", "import", "netbox", "--csv", str(path), "-o", "json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def caps(level: str = "rack") -> dict[str, int]:
    return {b.domain: round(b.effective_cap_watts) for b in Budget.objects.filter(domain__startswith=f"{level}:")}


def netbox_rack_caps(step: str, site: str, qualify: bool) -> dict[str, int]:
    """Each rack's cap as NetBox's figures give it: the smallest available power of its live, cabled feeds."""
    racks = {r["id"]: r["name"] for r in recorded(f"sites/{step}")["racks"] if r["site"]["slug"] == site}
    live = {f["id"]: f for f in recorded(f"sites/{step}")["power-feeds"]
            if f["status"]["value"] == "active" and f.get("rack") and f["rack"]["id"] in racks}
    out: dict[str, int] = {}
    for key, figure in POWER[step].items():
        if key.split("/")[0] == site and figure["id"] in live:
            rack = racks[live[figure["id"]]["rack"]["id"]]
            name = f"rack:{site}.{rack}" if qualify else f"rack:{rack}"
            out[name] = min(out.get(name, 10**9), figure["available_power"])
    return out


def test_two_sites_imported_one_after_the_other_keep_each_others_caps_as_netbox_figures_them(tmp_path, capsys, joined):
    api(tmp_path, capsys, "s1-two-sites", "--site", "sto1")
    sto1 = netbox_rack_caps("s1-two-sites", "sto1", qualify=False)
    assert caps() == sto1 == {"rack:R-A01": 2944, "rack:R-A02": 2392, "rack:R-B01": 2944}
    # A node's PSUs' maximum draw in NetBox is its readings' ceiling.
    assert Node.objects.get(name="gpu03").max_draw_watts == 5000 + 5000
    result = api(tmp_path, capsys, "s1-two-sites", "--site", "got1")
    assert result["feeds_removed"] == [] and result["needs_yes"] == []
    got1 = netbox_rack_caps("s1-two-sites", "got1", qualify=True)
    # got1's R-B01 also has DC-1 (−48 V 50 A, 1.9 kW) on its third PDU: its smallest live feed.
    assert caps() == {**sto1, **got1} and got1["rack:got1.R-B01"] == 1920
    assert not any("another feed of this import" in s for s in result["skipped"])
    # gpu01 is a device of both sites: it stays where sto1 put it until the operator says which it is.
    assert result["ambiguous"][0].startswith("device gpu01 of site got1: a device of site sto1 has that name too")
    assert Node.objects.get(name="gpu01").labels["llmgw.io/site"] == "sto1"
    assert Node.objects.get(name="gpu11").labels["llmgw.io/rack"] == "got1.R-A01"


def test_the_api_and_the_csv_export_of_two_sites_give_the_same_caps(tmp_path, capsys, joined):
    api(tmp_path, capsys, "s1-two-sites")  # every site at once: every shared name qualified by its site
    by_api = caps()
    assert by_api == {**netbox_rack_caps("s1-two-sites", "sto1", qualify=True),
                      **netbox_rack_caps("s1-two-sites", "got1", qualify=True)}
    Feed.objects.all().delete()
    Budget.objects.all().delete()
    by_csv(tmp_path, capsys, "s1-two-sites")
    assert caps() == by_api  # the export's Site column tells the two R-A01 apart, as the API's site does


def test_a_deleted_feed_waits_for_a_yes_and_then_leaves_its_pdu_unfed(tmp_path, capsys, joined):
    api(tmp_path, capsys, "s1-two-sites", "--site", "sto1")
    before = caps()
    result = api(tmp_path, capsys, "s2-feed-deleted", "--site", "sto1")
    assert result["held_back"] == ["feed A02-B removed"]
    assert caps() == before and Feed.objects.filter(name="A02-B").exists()
    api(tmp_path, capsys, "s2-feed-deleted", "--site", "sto1", "--yes")
    # The rack keeps its smallest live feed (NetBox's 2392 W); the PDU NetBox left unfed carries nothing.
    assert caps() == before == netbox_rack_caps("s2-feed-deleted", "sto1", qualify=False) | {"rack:R-A02": 2392}
    assert Budget.objects.get(domain="pdu:R-A02-PDU-B").cap_watts == 0
    dark = [v for v in feed_loss_report(feed="A02-A")["feeds"][0]["violations"] if v["dark_nodes"]]
    assert dark[0]["dark_nodes"] == ["gpu03", "gpu04"]


def test_a_renamed_rack_keeps_the_operators_budget_and_hold(tmp_path, capsys, joined):
    api(tmp_path, capsys, "s1-two-sites", "--site", "sto1")
    budget_set(domain="rack:R-B01", cap_watts=2500)
    hold_create(domain="rack:R-B01", reason="PDU swap")
    result = api(tmp_path, capsys, "s3-rack-renamed", "--site", "sto1")
    assert result["renamed"] == [{"from": "rack:R-B01", "to": "rack:R-B01-NEW"}]
    assert result["held_back"] == ["feed A02-B removed"]  # s2's deletion still waits; the rename does not
    assert Budget.objects.get(domain="rack:R-B01-NEW").cap_watts == 2500
    assert Hold.objects.get(domain="rack:R-B01-NEW").reason == "PDU swap"
    assert Node.objects.get(name="gpu05").labels["llmgw.io/rack"] == "R-B01-NEW"
    assert caps()["rack:R-B01-NEW"] == 2500  # the operator's budget, below NetBox's 2944 W


def test_a_renamed_panel_changes_no_cap_and_no_name(tmp_path, capsys, joined):
    api(tmp_path, capsys, "s1-two-sites", "--site", "got1")
    before = (caps(), caps("pdu"), sorted(Feed.objects.values_list("name", flat=True)))
    result = api(tmp_path, capsys, "s4-panel-renamed", "--site", "got1", "--dry-run")
    assert not any(result[k] for k in ("feeds_added", "feeds_removed", "caps", "needs_yes"))
    api(tmp_path, capsys, "s4-panel-renamed", "--site", "got1")
    assert (caps(), caps("pdu"), sorted(Feed.objects.values_list("name", flat=True))) == before


@pytest.mark.parametrize("path", ["api", "csv"])
def test_a_cap_netbox_lowers_is_applied_and_one_it_raises_waits(tmp_path, capsys, joined, path):
    run = api if path == "api" else by_csv
    run(tmp_path, capsys, "s1-two-sites")
    result = run(tmp_path, capsys, "s5-utilization-edited")
    assert result["applied"], (result["needs_yes"], result["feeds_changed"])
    # got1's A01-A at 60 %: 13,801 W, applied by nobody; sto1's A01-A at 20 A: 3,680 W, waits for a yes.
    assert caps()["rack:got1.R-A01"] == POWER["s5-utilization-edited"]["got1/PP-A/A01-A"]["available_power"] == 13801
    assert caps()["rack:sto1.R-A01"] == 2944
    if path == "api":
        assert "pdu sto1.R-A01-PDU-A: cap 2.9 kW -> 3.7 kW, from feed sto1.A01-A 230 V 20 A 1φ 80 %" in result["held_back"]
    else:
        # The export names racks, not their ids: R-B01's rename (s3) reads as a rack gone and one added, and
        # the cap that would vanish waits, while the lowered one is applied.
        assert "rack sto1.R-B01: no cap any more (was 2.9 kW)" in result["held_back"]
    run(tmp_path, capsys, "s5-utilization-edited", "--yes")
    # Both feeds of sto1's R-A01 count: the B feed still carries 2,944 W, so the rack's cap stays.
    assert caps()["rack:sto1.R-A01"] == 2944
    if path == "api":
        assert round(Budget.objects.get(domain="pdu:sto1.R-A01-PDU-A").cap_watts) == 3680
