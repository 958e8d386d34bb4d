"""`llmgw ctl facility import netbox` against a stand-in NetBox (pagination and all); the import is not mocked."""

from __future__ import annotations

import json

import pytest

from agents.models import Node, StoreLabel
from agents.services import labels_set
from facility.models import Budget, Feed
from facility.services import facility_apply
from llmgw.ctl import main as ctl
from tests.fakes.netbox import FakeNetbox

pytestmark = pytest.mark.django_db(transaction=True)

SITES = {"sto1": "hall-a", "sto2": "hall-b"}


def _rack(site: str, i: int) -> str:
    return f"{site}-r{i}"


def netbox_data() -> dict[str, list[dict]]:
    """2 sites, 8 racks, 16 feeds: site sto1's feeds are cabled to PDUs, sto2's feed their racks."""
    data: dict[str, list[dict]] = {
        k: [] for k in ("sites", "locations", "racks", "power-panels", "power-feeds", "power-ports", "power-outlets", "devices")
    }
    ids = iter(range(1, 10_000))
    for s, (site, room) in enumerate(SITES.items()):
        site_ref = {"id": next(ids), "name": site.upper(), "slug": site}
        loc_ref = {"id": next(ids), "name": room.title(), "slug": room}
        data["sites"].append(site_ref)
        data["locations"].append({**loc_ref, "site": site_ref})
        panel = {"id": next(ids), "name": f"{site} panel 1", "site": site_ref}
        data["power-panels"].append(panel)
        for i in range(4):
            rack = {"id": next(ids), "name": _rack(site, i), "site": site_ref, "location": loc_ref}
            data["racks"].append(rack)
            for side, amps in (("A", 32), ("B", 16 if i == 3 else 32)):
                feed = {
                    "id": next(ids),
                    "name": f"{side}{s}{i}",
                    "power_panel": {"id": panel["id"], "name": panel["name"], "site": site_ref},
                    "rack": {"id": rack["id"], "name": rack["name"]},
                    "voltage": 415 if s == 0 else 230,
                    "amperage": amps,
                    "phase": {"value": "three-phase" if s == 0 else "single-phase", "label": "x"},
                    "max_utilization": 80 if side == "A" else 90,
                    "status": {"value": "active"},
                }
                data["power-feeds"].append(feed)
                if s == 0:  # cabled to the input of a PDU in the rack
                    pdu = {"id": next(ids), "name": f"{rack['name']}-{side.lower()}", "site": site_ref,
                           "rack": {"id": rack["id"], "name": rack["name"]}}
                    data["devices"].append(pdu)
                    port = {"id": next(ids), "device": {"id": pdu["id"], "name": pdu["name"]}, "name": "input",
                            "link_peers_type": "dcim.powerfeed", "link_peers": [{"id": feed["id"], "name": feed["name"]}]}
                    data["power-ports"].append(port)
                    data["power-outlets"].append({"id": next(ids), "device": port["device"], "name": "1",
                                                  "power_port": {"id": port["id"]}, "feed_leg": None,
                                                  "link_peers": [], "link_peers_type": None})
            for n in range(2):
                data["devices"].append({
                    "id": next(ids), "name": f"{rack['name']}-n{n}", "site": site_ref, "location": loc_ref,
                    "rack": {"id": rack["id"], "name": rack["name"]},
                })
    data["devices"].append({"id": next(ids), "name": "not-a-node", "site": data["sites"][0], "rack": None})
    return data


def hand_written() -> str:
    lines = ["facility:", "  feeds:"]
    for s, site in enumerate(SITES):
        for i in range(4):
            rack = _rack(site, i)
            for side, amps in (("A", 32), ("B", 16 if i == 3 else 32)):
                util = 0.8 if side == "A" else 0.9
                where = f"pdus: [{rack}-{side.lower()}]" if s == 0 else f"racks: [{rack}]"
                lines.append(
                    f"    - {{name: {side}{s}{i}, voltage: {415 if s == 0 else 230}, amperage: {amps}, "
                    f"phase: {'three' if s == 0 else 'single'}, max_utilization: {util}, {where}}}"
                )
    return "\n".join(lines) + "\n"


def join_all(join_node) -> None:
    for s, site in enumerate(SITES):
        for i in range(4):
            rack = _rack(site, i)
            for n in range(2):
                # The agents know their PDUs (site sto1); NetBox tells where they stand.
                join_node(f"{rack}-n{n}", pdu=f"{rack}-a,{rack}-b" if s == 0 else None)


def state() -> tuple[dict, dict]:
    caps = {b.domain: (round(b.cap_watts, 3), b.source, b.derived_from) for b in Budget.objects.all()}
    labels = dict(Node.objects.values_list("name", "labels"))
    return caps, labels


def test_a_netbox_import_sets_what_a_hand_written_server_yaml_would(tmp_path, capsys, join_node):
    join_all(join_node)
    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    with FakeNetbox(netbox_data()) as nb:
        assert ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "--dry-run",
                    "-o", "json"]) == 0
        preview = json.loads(capsys.readouterr().out)
        assert not preview["applied"] and len(preview["feeds_added"]) == 16 and len(preview["labels"]) == 16
        assert not Feed.objects.exists() and not StoreLabel.objects.exists()  # the dry run wrote nothing
        assert ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token)]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[-1] == "48 changes applied"  # 16 feeds, 16 nodes labelled, 16 caps
        assert any("offset=" in r for r in nb.requests)  # it followed the pages
    imported = state()
    assert len([d for d in imported[0] if d.startswith("rack:")]) == 8
    assert imported[0]["rack:sto1-r3"][0] == pytest.approx(415 * 16 * 0.9 * 3**0.5, abs=0.01)  # the smaller feed
    assert imported[0]["rack:sto2-r0"][0] == pytest.approx(230 * 32 * 0.8, abs=0.01)
    assert imported[1]["sto2-r1-n0"]["llmgw.io/room"] == "hall-b"

    # The same facility by hand: server.yaml's feeds and labels typed one node at a time.
    Feed.objects.all().delete()
    Budget.objects.all().delete()
    StoreLabel.objects.all().delete()
    for name in Node.objects.values_list("name", flat=True):
        labels_set(node_name=name, changes={"llmgw.io/site": None, "llmgw.io/room": None, "llmgw.io/rack": None})
    for site, room in SITES.items():
        for i in range(4):
            for n in range(2):
                labels_set(node_name=f"{_rack(site, i)}-n{n}", changes={
                    "llmgw.io/site": site, "llmgw.io/room": room, "llmgw.io/rack": _rack(site, i)})
    facility_apply(text=hand_written())
    by_hand = state()
    assert {d: c[0::2] for d, c in by_hand[0].items()} == {d: c[0::2] for d, c in imported[0].items()}
    assert by_hand[1] == imported[1]


def test_site_filter_and_a_second_import_changes_nothing(tmp_path, capsys, join_node):
    join_all(join_node)
    token = tmp_path / "nb.token"
    token.write_text("t0ken")
    with FakeNetbox(netbox_data()) as nb:
        args = ["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "--site", "sto2"]
        assert ctl(args) == 0
        capsys.readouterr()
        assert sorted(Feed.objects.values_list("name", flat=True)) == sorted(
            f"{side}1{i}" for side in "AB" for i in range(4))
        assert ctl([*args, "--dry-run"]) == 0
        assert capsys.readouterr().out == "0 changes (dry run: nothing written)\n"


def test_a_wrong_token_writes_nothing(tmp_path, capsys, join_node):
    join_all(join_node)
    token = tmp_path / "nb.token"
    token.write_text("wrong")
    with FakeNetbox(netbox_data()) as nb:
        code = ctl(["facility", "import", "netbox", "--url", nb.url, "--token-file", str(token)])
    assert code != 0
    assert not Feed.objects.exists() and not StoreLabel.objects.exists()


def test_csv_export_of_power_feeds(tmp_path, capsys, join_node):
    join_node("n1", rack="r1")
    path = tmp_path / "feeds.csv"
    path.write_text(
        "Name,Power Panel,Rack,Status,Type,Voltage,Amperage,Phase,Max Utilization\n"
        "A1,panel 1,r1,Active,Primary,415,32,Three-phase,80%\n"
        "B1,panel 1,r1,Active,Redundant,415,32,Three-phase,80%\n"
    )
    assert ctl(["facility", "import", "netbox", "--csv", str(path)]) == 0
    rack = Budget.objects.get(domain="rack:r1")
    assert round(rack.cap_watts) == 18401 and rack.derived_from.startswith("feed A1 415 V 32 A 3φ 80 %")


def test_two_feeds_one_name_here_keeps_the_first_and_names_the_other_skipped(admin_client, join_node):
    join_node("n1", rack="r1")
    join_node("n2", rack="r2")
    csv = (
        "Name,Power Panel,Rack,Voltage,Amperage,Phase,Max Utilization\n"
        "A1,P1,r1,415,32,Three-phase,80\n"
        "A1,P1,r2,415,16,Three-phase,80\n"  # the same panel and name again
        "B 1,P1,r1,415,32,Three-phase,80\n"
        "B/1,P1,r2,415,16,Three-phase,80\n"  # B-1 here, as B 1 is
    )
    dry = admin_client.post(
        "/api/v1/facility/import/netbox", {"csv": csv, "dry_run": True}, content_type="application/json"
    ).json()
    applied = admin_client.post("/api/v1/facility/import/netbox", {"csv": csv}, content_type="application/json").json()
    assert applied == {**dry, "applied": True, "dry_run": False}  # the diff said what was written
    assert [f["name"] for f in applied["feeds_added"]] == ["P1.A1", "P1.B-1"]
    assert applied["skipped"] == [
        "power feed P1/A1: another feed of this import is named P1.A1 already",
        "power feed P1/B-1: another feed of this import is named P1.B-1 already",
    ]
    assert {f.name: f.racks for f in Feed.objects.all()} == {"P1.A1": ["r1"], "P1.B-1": ["r1"]}
    assert [c["domain"] for c in applied["caps"]] == ["rack:r1"]
    assert not Budget.objects.filter(domain="rack:r2").exists()
