"""The NetBox import on what a real NetBox 4.6.8 answered (tests/fixtures/netbox/, replayed by a stand-in).

The recorded site: racks R-A01, R-A02 (row-1), R-B01, R-B02, R-C01 (row-2) in hall-1, and a planned,
empty R-A01 in hall-2; A/B feeds cabled to a PDU per side; gpu01..gpu09 with PSU1 on PDU-A and PSU2 on
PDU-B. R-A02's B feed is 230 V/16 A single-phase (2.9 kW); R-B01 also has a planned 2.9 kW feed; R-C01
a −48 V DC feed; panel MDB-C an offline feed A1 with no rack (and so no PDU or rack it supplies).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from agents.models import Node, StoreLabel
from agents.services import labels_set
from facility import netbox, netbox_csv
from facility.feed_selectors import feed_loss_report
from facility.models import Budget, Feed
from facility.netbox_import import netbox_import
from facility.services import settings_set
from llmgw.ctl import main as ctl
from placement import selectors
from placement import services as placement_services
from placement.models import NodeBooking
from tests.fakes.netbox import FIXTURES, FakeNetbox, newest_version, recorded

pytestmark = pytest.mark.django_db(transaction=True)

NODES = [f"gpu0{i}" for i in range(1, 9)]  # gpu09 is in NetBox, not yet joined
CSV_DIR = FIXTURES / newest_version() / "base"


@pytest.fixture
def joined(join_node):
    for name in NODES:
        join_node(name, gpus=8)  # the agents say nothing of where they are: NetBox does


def import_api(tmp_path: Path, capsys, data: dict, *extra: str) -> dict:
    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    with FakeNetbox(data) as nb:
        code = ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "-o", "json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def rack_caps() -> dict[str, float]:
    return {b.domain: round(b.effective_cap_watts, 1) for b in Budget.objects.filter(domain__startswith="rack:")}


def forget_import() -> None:
    Feed.objects.all().delete()
    Budget.objects.all().delete()
    for name, key in StoreLabel.objects.filter(set_by="netbox").values_list("node_name", "key"):
        labels_set(node_name=name, changes={key: None})


def test_the_api_and_the_csv_export_of_one_netbox_cap_its_racks_alike(tmp_path, capsys, joined):
    result = import_api(tmp_path, capsys, recorded("base"))
    assert result["applied"]
    # R-A02: PDU-fed on both sides, dual-fed; its B feed carries 2.9 kW, so the rack's cap is 2.9 kW.
    by_api = rack_caps()
    assert by_api["rack:R-A02"] == 2944.0
    gpu03 = Node.objects.get(name="gpu03").labels
    assert gpu03["llmgw.io/pdu"] == "R-A02-PDU-A,R-A02-PDU-B"
    assert gpu03["llmgw.io/leg"] == "R-A02-PDU-A.A"  # PDU-B is single-phase: no leg
    assert (gpu03["llmgw.io/room"], gpu03["llmgw.io/row"], gpu03["llmgw.io/rack"]) == ("hall-1", "row-1", "R-A02")
    assert round(Budget.objects.get(domain="pdu:R-A02-PDU-B").cap_watts) == 2944
    assert round(Budget.objects.get(domain="leg:R-A02-PDU-A.A").cap_watts) == round(18401.1 / 3)
    labels_by_api = dict(Node.objects.values_list("name", "labels"))

    forget_import()
    path = tmp_path / "feeds.csv"
    path.write_text((CSV_DIR / "power-feeds.all-data.csv").read_text())
    assert ctl(["facility", "import", "netbox", "--csv", str(path)]) == 0
    capsys.readouterr()
    # The export has no rack location: hall-2's planned R-A01 is not told apart from hall-1's (its one
    # feed is planned, so it caps nothing either way); every other rack is capped alike.
    assert rack_caps() == {d: c for d, c in by_api.items() if d != "rack:hall-2.R-A01"}
    # The CSV has no cables: its nodes keep their labels as they were, NetBox's only through the API.
    assert dict(Node.objects.values_list("name", "labels")) != labels_by_api


def test_every_capacity_is_the_one_netbox_computes(tmp_path):
    # NetBox's "All data" export carries its own Available Power (VA): the same figure, feed by feed.
    import csv

    rows = list(csv.DictReader((CSV_DIR / "power-feeds.all-data.csv").read_text().splitlines()))
    plan = netbox_csv.plan_from_csv((CSV_DIR / "power-feeds.all-data.csv").read_text())
    ours = {f.name.rsplit(".", 1)[-1] + "@" + (f.name.split(".")[0] if "." in f.name else ""): f for f in plan.feeds}
    for row in rows:
        key = row["Name"] + "@" + ("MDB-A" if row["Name"] == "A1" and row["Power Panel"] == "MDB-A" else "")
        if key not in ours:
            continue  # MDB-C's A1 supplies nothing: skipped
        assert round(ours[key].capacity_watts) == int(row["Available Power (VA)"]), row["Name"]


def test_a_replica_past_the_b_feed_is_refused_with_the_figures(tmp_path, capsys, joined):
    settings_set(margin=0.1, gpu_watts=700, cpu_core_watts=10, node_watts=0)
    import_api(tmp_path, capsys, recorded("base"))
    placement_services.model_apply(data={"kind": "Model", "name": "m", "replicas": 8, "profile": {"gpus": 4}})
    rows = selectors.replica_rows(model="m")
    on = {n for r in rows for n in r["nodes"]}
    assert on.isdisjoint({"gpu03", "gpu04"})
    waiting = " ".join(r["reason"] for r in rows if not r["nodes"])
    assert "rack R-A02: 0.0 kW of a 2.6 kW limit (2.9 kW cap less 10%) in use, 2.8 kW with the shard (~2.8 kW)" in waiting


def test_feed_loss_reports_the_rack_over_its_surviving_feed_with_ctl_facilitys_load(tmp_path, capsys, joined):
    import_api(tmp_path, capsys, recorded("base"))
    for name in ("gpu03", "gpu04"):  # arrived by another path: 2 × (350 + 1500) W
        NodeBooking.objects.update_or_create(node=Node.objects.get(name=name), defaults={"placed_watts": 1500})
    (lost,) = feed_loss_report(feed="A2")["feeds"]
    (rack,) = [v for v in lost["violations"] if v["domain"] == "rack:R-A02"]
    assert rack["text"].startswith("rack R-A02 on feed B2: 3.7 kW of 2.9 kW without feed A2 (0.8 kW over")
    assert ctl(["facility", "-o", "json"]) == 0
    row = next(d for d in json.loads(capsys.readouterr().out)["domains"] if d["domain"] == "rack:R-A02")
    assert row["use_watts"] == rack["load_watts"] == 3700.0


def test_planned_feeds_same_named_racks_a_dc_feed_and_a_failed_one(tmp_path, capsys, joined):
    result = import_api(tmp_path, capsys, recorded("base"))
    caps = rack_caps()
    assert caps["rack:R-B01"] == pytest.approx(18401, abs=1)  # P3 (planned, 2.9 kW) is listed, never counted
    assert caps["rack:R-A01"] == pytest.approx(18401, abs=1)  # hall-2's planned R-A01 caps nothing here
    assert caps["rack:hall-2.R-A01"] == 0.0
    assert Budget.objects.get(domain="rack:hall-2.R-A01").derived_from == "no live feed (H2-A1 planned)"
    assert caps["rack:R-C01"] == 3840.0  # −48 V × 100 A × 80 %
    assert "feed P3 is planned: listed, carries nothing" in result["notes"]
    assert result["skipped"] == ["power feed MDB-C/A1: supplies no PDU and no rack"]
    assert sorted(Feed.objects.values_list("name", flat=True))[:2] == ["A2", "A3"]  # MDB-A's A1 is MDB-A.A1
    data = recorded("base")
    failed = copy.deepcopy(data)
    for feed in failed["power-feeds"]:
        if feed["name"] == "B3":
            feed["status"] = {"value": "failed", "label": "Failed"}
    result = import_api(tmp_path, capsys, failed)
    assert "feed B3 has failed: what it fed runs on its other feeds now (N−1)" in result["notes"]
    report = feed_loss_report(feed="B3")
    assert report["feeds"][0]["failed"] and report["text"].endswith("feed B3 failed: running on N−1 now")


def test_a_rack_deleted_in_netbox_is_named_in_the_diff(tmp_path, capsys, joined):
    import_api(tmp_path, capsys, recorded("base"))
    assert rack_caps()["rack:R-B02"] == 5888.0
    token = tmp_path / "nb.token"
    with FakeNetbox(recorded("rack-deleted")) as nb:
        assert ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "- feed A4" in lines and "- feed B4" in lines
    assert "~ node gpu07: llmgw.io/pdu- llmgw.io/rack- llmgw.io/row-" in lines
    assert "~ rack R-B02: no cap any more (was 5.9 kW)" in lines
    assert "~ pdu R-B02-PDU-B: no cap any more (was 6.6 kW)" in lines
    assert "! waits for a yes: rack R-B02: no cap any more (was 5.9 kW)" in lines  # said first
    # Without a yes, the rack's cap and its nodes stay: a cap only vanishes when a person says so.
    with FakeNetbox(recorded("rack-deleted")) as nb:
        assert ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token)]) == 0
    out = capsys.readouterr().out
    held = next(line for line in out.splitlines() if "held back, waiting for --yes:" in line)
    assert "rack R-B02: no cap any more (was 5.9 kW)" in held and "feed A4 removed" in held
    assert Node.objects.get(name="gpu07").labels["llmgw.io/rack"] == "R-B02"
    assert rack_caps()["rack:R-B02"] == 5888.0
    assert Feed.objects.filter(name="A4").exists()
    with FakeNetbox(recorded("rack-deleted")) as nb:
        assert ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "--yes"]) == 0
    capsys.readouterr()
    assert "llmgw.io/rack" not in Node.objects.get(name="gpu07").labels
    assert "rack:R-B02" not in rack_caps()


def test_re_importing_unchanged_data_changes_nothing(tmp_path, capsys, joined):
    import_api(tmp_path, capsys, recorded("base"))
    again = import_api(tmp_path, capsys, recorded("base"), "--dry-run")
    assert not any(again[k] for k in ("feeds_added", "feeds_changed", "feeds_removed", "labels", "caps"))
    token = tmp_path / "nb.token"
    with FakeNetbox(recorded("base")) as nb:
        assert ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "0 changes (dry run: nothing written)"


def test_a_device_not_yet_joined_has_its_labels_waiting(tmp_path, capsys, joined, join_node):
    result = import_api(tmp_path, capsys, recorded("base"))
    assert result["labels"]["gpu09"]["llmgw.io/rack"] == "R-B01"  # same role as the joined nodes
    join_node("gpu09", gpus=8)
    labels = Node.objects.get(name="gpu09").labels
    assert (labels["llmgw.io/rack"], labels["llmgw.io/leg"]) == ("R-B01", "R-B01-PDU-A.C,R-B01-PDU-B.C")
    assert "rack:R-B01" in set(Node.objects.get(name="gpu09").domains.values_list("domain", flat=True))


def test_an_operators_label_wins_and_is_listed(tmp_path, capsys, joined):
    labels_set(node_name="gpu01", changes={"llmgw.io/rack": "R-X01"}, set_by="alice")
    result = import_api(tmp_path, capsys, recorded("base"))
    assert result["labels_kept"] == ["node gpu01: llmgw.io/rack=R-X01 kept (set by alice); NetBox says R-A01"]
    assert "llmgw.io/rack" not in result["labels"]["gpu01"]
    assert Node.objects.get(name="gpu01").labels["llmgw.io/rack"] == "R-X01"


def plan_from_csv_refusal(text: str, percent: float) -> str:
    from facility.netbox_csv import plan_from_csv
    from llmgw.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        plan_from_csv(text, default_utilization=percent)
    return refused.value.message


def test_the_current_view_csv_needs_max_utilization_said_out_loud(tmp_path, capsys, joined):
    path = tmp_path / "feeds.csv"
    path.write_text((CSV_DIR / "power-feeds.current-view.csv").read_text())
    assert ctl(["facility", "import", "netbox", "--csv", str(path)]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: csv line 1: column max_utilization is missing (NetBox's current-view export leaves it out): "
        "export All data, or give --default-utilization PERCENT"
    )
    assert not Feed.objects.exists()
    # A fraction where a percent belongs (server.yaml writes max_utilization: 0.8) would cap every rack
    # to almost nothing: refused, saying what to write; so is a percent past 100.
    for given, said in (("0.8", "not 0.8: write 80 for 80 %"), ("180", "not 180")):
        assert ctl(["facility", "import", "netbox", "--csv", str(path), "--default-utilization", given, "--dry-run"]) == 1
        assert capsys.readouterr().err == (
            f"error: --default-utilization: a percent, 1 to 100 (NetBox's max utilization), {said}\n"
        )
    answer = plan_from_csv_refusal(path.read_text(), 0.8)
    assert answer == "default_utilization: a percent, 1 to 100 (NetBox's max utilization), not 0.8: write 80 for 80 %"
    assert ctl(["facility", "import", "netbox", "--csv", str(path), "--default-utilization", "80"]) == 0
    capsys.readouterr()
    assert rack_caps()["rack:R-B02"] == 5888.0  # B4 is 90 % in NetBox: the export could not say so


def test_a_malformed_csv_is_a_400_naming_the_line(admin_client):
    text = (CSV_DIR / "power-feeds.all-data.csv").read_text().splitlines()
    text[3] += ",one too many"
    answer = admin_client.post("/api/v1/facility/import/netbox", {"csv": "\n".join(text)}, content_type="application/json")
    assert answer.status_code == 400
    assert "csv line 4: 27 fields where the header has 26" in json.dumps(answer.json())
    # A column given twice: the last would be read alone, the first unseen.
    text = (CSV_DIR / "power-feeds.all-data.csv").read_text().splitlines()
    text = [line + ",x" for line in text]
    text[0] = text[0][:-2] + ",Voltage"
    answer = admin_client.post("/api/v1/facility/import/netbox", {"csv": "\n".join(text)}, content_type="application/json")
    assert answer.status_code == 400 and answer.json()["detail"] == "csv line 1: column voltage is given twice"


def test_a_url_ending_in_api_is_told_in_one_line(tmp_path, capsys, joined):
    token = tmp_path / "nb.token"
    token.write_text("t0ken")
    with FakeNetbox(recorded("base")) as nb:
        code = ctl(["facility", "import", "netbox", "--url", nb.url + "/api", "--token-file", str(token)])
        err = capsys.readouterr().err
    assert code == 1
    assert err == (
        f"error: --url: {nb.url}/api answered an HTML page (404), not NetBox's API; "
        f"give NetBox's address without /api (--url {nb.url})\n"
    )


def _with_bad_b2() -> dict:
    data = copy.deepcopy(recorded("base"))
    for feed in data["power-feeds"]:
        if feed["name"] == "B2":
            feed["voltage"] = 99999
    return data


def test_one_bad_object_is_skipped_by_name_and_what_it_fed_carries_nothing(tmp_path, capsys, joined):
    result = import_api(tmp_path, capsys, _with_bad_b2())
    assert (
        "power feed MDB-B/B2: voltage: must be more than 0 and at most 1000 volts (got 99999); not counted: "
        "PDU R-A02-PDU-B carries nothing until NetBox's figures are fixed"
    ) in result["skipped"]
    assert Feed.objects.filter(name="A2").exists() and not Feed.objects.filter(name="B2").exists()
    # The PDU it fed is counted as fed by nothing: its nodes are single-fed, and losing A2 powers them off.
    assert Budget.objects.get(domain="pdu:R-A02-PDU-B").cap_watts == 0
    report = feed_loss_report(feed="A2")
    assert any(v["dark_nodes"] == ["gpu03", "gpu04"] for v in report["feeds"][0]["violations"])


def test_a_feed_that_turns_unreadable_keeps_its_last_figures(tmp_path, capsys, joined):
    import_api(tmp_path, capsys, recorded("base"))
    assert rack_caps()["rack:R-A02"] == 2944.0
    result = import_api(tmp_path, capsys, _with_bad_b2())
    assert (
        "power feed MDB-B/B2: voltage: must be more than 0 and at most 1000 volts (got 99999); feed B2 stays as "
        "imported before"
    ) in result["skipped"]
    assert result["feeds_removed"] == [] and not result["caps"]
    assert rack_caps()["rack:R-A02"] == 2944.0 and Feed.objects.get(name="B2").voltage == 230


def test_the_plan_is_the_same_read_through_pynetbox_as_from_the_files(tmp_path):
    from facility.netbox_import import netbox_api, objects_from_api

    with FakeNetbox(recorded("base")) as nb:
        objects = objects_from_api(netbox_api(url=nb.url, token="t0ken"))
    files = recorded("base")
    for name in netbox.ENDPOINTS:
        assert [o["id"] for o in objects[name]] == [o["id"] for o in files[name]], name
    assert netbox_import  # the applied path is the ctl's, above


def test_the_api_refuses_a_fraction_for_the_default_utilization_in_ctls_words(admin_client):
    text = (CSV_DIR / "power-feeds.current-view.csv").read_text()
    answer = admin_client.post("/api/v1/facility/import/netbox", {"csv": text, "default_utilization": 0.8},
                               content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["field"] == "default_utilization"
    assert answer.json()["detail"] == (
        "default_utilization: a percent, 1 to 100 (NetBox's max utilization), not 0.8: write 80 for 80 %"
    )
