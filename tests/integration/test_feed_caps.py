"""Feeds in server.yaml: derived caps kept as Budget rows (source feed), the N−1 report, ctl and the API."""

from __future__ import annotations

import json
import math
import random

import pytest
from django.utils import timezone

from facility import services
from facility.feed_selectors import feed_loss_report, racks_over
from facility.models import Budget, Feed, Source
from llmgw.ctl import main as ctl
from llmgw.errors import InvalidInput

pytestmark = pytest.mark.django_db(transaction=True)

PAIR = """\
facility:
  margin: 0.1
  node_watts: 350
  feeds:
    - {name: A1, voltage: 415, amperage: 32, phase: three, max_utilization: 0.8, pdus: [r1-a]}
    - {name: B1, voltage: 415, amperage: 32, phase: three, max_utilization: 0.8, pdus: [r1-b]}
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_two_feed_rack_gets_18_4_kw_with_no_budget_written(capsys, join_node):
    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    result = services.facility_apply(text=PAIR)
    assert result["created"] == 0 and result["feeds"]["created"] == 2
    rack = Budget.objects.get(domain="rack:r1")
    assert rack.source == Source.FEED
    assert round(rack.cap_watts) == 18401  # 415 × 32 × 0.8 × √3: one feed's, never the pair's sum
    assert rack.derived_from.startswith("feed A1 415 V 32 A 3φ 80 %")
    assert round(Budget.objects.get(domain="pdu:r1-b").cap_watts) == 18401
    code, out, _ = run(capsys, "facility")
    lines = out.splitlines()
    assert lines[0].split()[-1] == "SOURCE"
    assert any(line.startswith("rack:r1 ") and "feed A1 415 V 32 A 3φ 80 %" in line for line in lines)
    code, out, _ = run(capsys, "facility", "-o", "json")
    rows = {d["domain"]: d for d in json.loads(out)["domains"]}
    assert rows["rack:r1"]["cap_source"].startswith("feed A1")
    assert rows["rack:r1"]["limit_watts"] == pytest.approx(18401.1 * 0.9, abs=1)


def test_a_written_budget_wins_and_the_derived_cap_comes_back_when_it_goes(join_node):
    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    services.facility_apply(text=PAIR)
    services.budget_set(domain="rack:r1", cap_watts=12000)
    services.facility_apply(text=PAIR)  # the feeds again: the written budget stays
    rack = Budget.objects.get(domain="rack:r1")
    assert (rack.cap_watts, rack.source, rack.source_text) == (12000, Source.API, "budget")
    services.budget_delete(domain="rack:r1")
    assert Budget.objects.get(domain="rack:r1").source == Source.FEED


def test_feeds_removed_from_the_file_take_their_caps_with_them(join_node):
    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    services.facility_apply(text=PAIR)
    result = services.facility_apply(text="facility:\n  feeds: []\n")
    assert result["feeds"]["removed"] == ["A1", "B1"]
    assert not Budget.objects.exists()


def test_a_label_change_moves_the_derived_cap(join_node, django_capture_on_commit_callbacks):
    from agents.services import labels_set

    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    services.facility_apply(text=PAIR)
    with django_capture_on_commit_callbacks(execute=True):
        labels_set(node_name="gpu01", changes={"llmgw.io/rack": "r2"})
    assert Budget.objects.filter(domain="rack:r2", source=Source.FEED).exists()
    assert not Budget.objects.filter(domain="rack:r1").exists()


def test_a_bad_feed_names_line_and_field_and_nothing_is_applied():
    text = PAIR.replace("amperage: 32, phase: three, max_utilization: 0.8, pdus: [r1-b]", "amperage: 32, phase: 3")
    text += "  budgets:\n    - {domain: rack:r9, cap_watts: 1000}\n"
    with pytest.raises(InvalidInput) as exc:
        services.facility_apply(text=text)
    assert str(exc.value.message) == "server.yaml line 6: facility.feeds[1].phase: must be single or three, not 3"
    assert not Feed.objects.exists() and not Budget.objects.exists()
    with pytest.raises(InvalidInput, match=r"line 5: facility.feeds\[0\].voltage: must be more than 0 and at most 1000"):
        services.facility_apply(text=PAIR.replace("voltage: 415", "voltage: 4150", 1))
    with pytest.raises(InvalidInput, match=r"facility.feeds\[1\].name: feed A1 is named twice"):
        services.facility_apply(text=PAIR.replace("name: B1", "name: A1"))


def test_rack_level_feeds_cap_the_rack_without_pdu_labels(join_node):
    join_node("gpu01", rack="r1")
    services.facility_apply(
        text="facility:\n  feeds:\n"
        "    - {name: A, voltage: 230, amperage: 32, phase: single, racks: [r1]}\n"
        "    - {name: B, voltage: 230, amperage: 16, phase: single, racks: [r1]}\n"
    )
    rack = Budget.objects.get(domain="rack:r1")
    assert rack.cap_watts == pytest.approx(230 * 16 * 0.8)
    assert rack.derived_from.startswith("feed B 230 V 16 A 1φ 80 %")


def _load(name: str, placed: float, measured: float | None) -> None:
    from agents.models import Node
    from placement.models import NodeBooking

    node = Node.objects.get(name=name)
    NodeBooking.objects.update_or_create(node=node, defaults={"placed_watts": placed})
    Node.objects.filter(pk=node.pk).update(
        measured_peak_watts=measured, sensors_at=timezone.now() if measured else None
    )


def test_feed_loss_lists_exactly_the_racks_an_independent_calculation_finds(capsys, join_node):
    rng = random.Random(7)
    feeds, expected = [], set()
    cap = 415 * 12 * 0.8 * math.sqrt(3)  # 6.9 kW a feed
    for r in range(8):
        rack = f"r{r}"
        feeds.append(f"    - {{name: A{r}, voltage: 415, amperage: 12, phase: three, pdus: [{rack}-a]}}")
        feeds.append(f"    - {{name: B{r}, voltage: 415, amperage: 12, phase: three, pdus: [{rack}-b]}}")
        total = 0.0
        for n in range(2):
            name = f"{rack}n{n}"
            join_node(name, rack=rack, pdu=f"{rack}-a,{rack}-b")
            placed = rng.choice([0, 1400, 2800, 4200, 5600])
            measured = rng.choice([None, 700, 3000, 6000])
            _load(name, placed, measured)
            total += 350 + max(placed, measured or 0)
        # The whole rack on one surviving feed: over when its use, added node by node as `ctl facility`
        # adds it, passes one feed's capacity.
        if total > cap:
            expected.add(rack)
    services.facility_apply(text="facility:\n  node_watts: 350\n  feeds:\n" + "\n".join(feeds) + "\n")
    report = feed_loss_report()
    assert {d.name for d in racks_over(report)} == expected
    assert expected and len(expected) < 8  # the draw makes both kinds
    # Each over rack appears once per lost feed of its pair, with the survivor as carrier.
    for item in report["feeds"]:
        rack = f"r{item['feed'][1:]}"
        racks = [v for v in item["violations"] if v["domain"] == f"rack:{rack}"]
        assert bool(racks) == (rack in expected)
        for v in racks:
            assert v["over_watts"] == pytest.approx(v["load_watts"] - cap, abs=0.2)
    code, out, _ = run(capsys, "facility", "feed-loss")
    assert out.splitlines()[-1] == report["text"] == f"{report['violations']} violations"
    assert code == 3  # a violation found: a check on a timer tells it from none (0) and from an error (1)
    code, out, _ = run(capsys, "facility", "feed-loss", "A0", "-o", "json")
    assert [f["feed"] for f in json.loads(out)["feeds"]] == ["A0"]
    assert code == (3 if json.loads(out)["violations"] else 0)


def test_feed_loss_zero_violations_and_unknown_feed(capsys, join_node):
    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    services.facility_apply(text=PAIR)
    code, out, _ = run(capsys, "facility", "feed-loss")
    # Each loss says what the feed left would carry: N−1's headroom where nothing is violated.
    assert out.splitlines() == [
        "without feed A1: 0 violations", "  B1 would carry 0.3 kW of 18.4 kW (2 %)",
        "without feed B1: 0 violations", "  A1 would carry 0.3 kW of 18.4 kW (2 %)",
        "0 violations",
    ]
    code, out, _ = run(capsys, "facility", "feed-loss", "A1", "-o", "json")
    assert json.loads(out)["feeds"][0]["carried"] == [{"feed": "B1", "load_watts": 350.0, "capacity_watts": 18401.3}]
    assert code == 0
    code, _, err = run(capsys, "facility", "feed-loss", "Z9")
    assert code == 1 and err == "error: feed 'Z9' is not known; the feeds: A1, B1\n"


def test_feeds_listing_ctl_and_api(capsys, join_node, admin_client):
    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    _load("gpu01", 2000, None)
    services.facility_apply(text=PAIR)
    code, out, _ = run(capsys, "facility", "feeds")
    assert out.splitlines()[0].split()[:5] == ["FEED", "RATING", "STATUS", "CAPACITY", "LOAD"]
    assert out.splitlines()[1].split()[:11] == ["A1", "415", "V", "32", "A", "3φ", "80", "%", "active", "18.4", "kW"]
    body = admin_client.get("/api/v1/facility/feeds").json()
    a1 = body["feeds"][0]
    assert (a1["name"], a1["racks"], a1["reserved_watts"]) == ("A1", ["r1"], 1175.0)  # (350 + 2000) / 2
    assert (a1["status"], a1["supply"], a1["load_watts"]) == ("active", "ac", 1175.0)
    loss = admin_client.get("/api/v1/facility/feed-loss?feed=B1").json()
    assert loss["violations"] == 0 and loss["feeds"][0]["feed"] == "B1"
    assert admin_client.get("/api/v1/facility/feed-loss?feed=nope").status_code == 404


def test_feed_loss_violations_are_a_series_per_feed(join_node):
    from facility.metrics import DomainPowerCollector

    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    join_node("gpu02", rack="r1", pdu="r1-a")  # single-fed: dark without A1
    services.facility_apply(text=PAIR)
    family = [f for f in DomainPowerCollector().collect() if f.name == "llmgw_feed_loss_violations"][0]
    assert {s.labels["feed"]: s.value for s in family.samples} == {"A1": 1.0, "B1": 0.0}


def test_an_apply_that_fails_halfway_leaves_nothing_of_it(monkeypatch):
    """One transaction: budgets written before the feeds are rolled back when writing the feeds fails."""
    from facility import feed_services

    services.facility_apply(text="facility:\n  budgets:\n    - {domain: rack:r1, cap_watts: 9000}\n")

    def broken(**kwargs):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(feed_services, "feeds_replace", broken)
    with pytest.raises(RuntimeError):
        services.facility_apply(
            text=PAIR.replace("margin: 0.1", "margin: 0.3") + "  budgets:\n    - {domain: rack:r1, cap_watts: 5000}\n"
        )
    assert list(Budget.objects.values_list("domain", "cap_watts")) == [("rack:r1", 9000)]
    assert services.FacilitySettings.load().margin != 0.3


def test_a_racks_other_watts_are_carried_by_its_feeds_and_by_the_survivor_when_one_is_lost(join_node, admin_client):
    small = PAIR.replace("amperage: 32", "amperage: 12")  # 6.9 kW a feed
    for n in (1, 2):
        join_node(f"gpu0{n}", rack="r1", pdu="r1-a,r1-b")
        _load(f"gpu0{n}", 2800, None)  # 350 + 2,800 each: 6.3 kW, within one feed alone
    join_node("gpu03", rack="r2", pdu="r2-a")
    services.facility_apply(text=small)
    assert feed_loss_report()["violations"] == 0
    # Its switches draw 800 W more, from both PDUs while both feeds are up, from the survivor after.
    services.budget_set(domain="rack:r1", cap_watts=6000, other_watts=800)
    services.budget_set(domain="rack:r2", cap_watts=6000, other_watts=500)  # no feed: carried by none
    feeds = {f["name"]: f for f in admin_client.get("/api/v1/facility/feeds").json()["feeds"]}
    assert feeds["A1"]["load_watts"] == feeds["B1"]["load_watts"] == 3150.0 + 400.0
    report = feed_loss_report()
    [rack] = [v for v in report["feeds"][0]["violations"] if v["domain"] == "rack:r1"]
    assert (rack["carrier"], rack["load_watts"]) == ("B1", 6300.0 + 800.0)
    assert rack["over_watts"] == pytest.approx(7100.0 - 415 * 12 * 0.8 * math.sqrt(3), abs=0.1)
    # The switches are no node: never among a lost feed's dark nodes.
    assert all(not v["dark_nodes"] for f in report["feeds"] for v in f["violations"])


def test_removing_a_cap_its_feeds_give_is_refused_and_a_written_one_says_the_feeds_cap_holds(capsys, join_node):
    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    services.facility_apply(text=PAIR)
    code, out, err = run(capsys, "facility", "budget", "delete", "pdu:r1-a")
    assert (code, out) == (1, "")
    assert err == (
        "error: pdu:r1-a has no written budget to remove: its cap of 18.4 kW comes from feed A1 415 V 32 A 3φ "
        "80 %; change its feeds in server.yaml's facility.feeds to change it\n"
    )
    assert Budget.objects.get(domain="pdu:r1-a").source == Source.FEED
    # A written budget below the feeds' is removed, and the feeds' cap comes back: said, not left to guess.
    run(capsys, "facility", "budget", "set", "rack:r1", "--cap-watts", "12000")
    code, out, err = run(capsys, "facility", "budget", "delete", "rack:r1")
    assert code == 0 and out.splitlines() == [
        "rack:r1: budget removed",
        "warning: rack:r1's feeds' cap holds: 18.4 kW from feed A1 415 V 32 A 3φ 80 % (smallest of 2 feeds: each "
        "carries the rack alone)",
    ]
