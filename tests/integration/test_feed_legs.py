"""Phases, feed status and one load formula: a three-phase PDU's legs are budgeted and enforced, a
written cap never passes its feeds', and N−1 adds a rack's load as `ctl facility` does."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from agents.models import Node
from facility import services
from facility.feed_selectors import feed_loss_report, feeds_overview
from facility.metrics import DomainPowerCollector
from facility.models import Budget
from llmgw.ctl import main as ctl
from placement import selectors
from placement import services as placement_services
from placement.models import NodeBooking

pytestmark = pytest.mark.django_db(transaction=True)

# 400 V/16 A three-phase at 80 %: 8.9 kW a feed, 2.96 kW a leg (230.9 V × 16 A × 0.8).
LEGS = """\
facility:
  margin: 0
  node_watts: 0
  gpu_watts: 700
  feeds:
    - {name: A1, voltage: 400, amperage: 16, phase: three, pdus: [p-a]}
    - {name: B1, voltage: 400, amperage: 16, phase: three, pdus: [p-b]}
"""


def legs_of(node: str) -> dict[str, str]:
    return {"llmgw.io/leg": {"n1": "p-a.A,p-b.A", "n2": "p-a.B,p-b.B", "n3": "p-a.A,p-b.B"}[node]}


def test_a_leg_is_budgeted_at_a_third_and_a_shard_past_it_is_refused_naming_the_leg(join_node):
    for node in ("n1", "n2"):
        join_node(node, rack="r1", pdu="p-a,p-b", gpus=8, labels=legs_of(node))
    services.facility_apply(text=LEGS)
    leg = Budget.objects.get(domain="leg:p-a.A")
    assert leg.cap_watts == pytest.approx(400 / 3**0.5 * 16 * 0.8)
    assert leg.derived_from == "feed A1 400 V 16 A 3φ 80 %, leg A (a third)"
    # Four cards (2.8 kW) fit leg A of each PDU; a fifth card on n1 would pass them, so the next
    # 4-card replica goes to n2, on leg B, and the third waits with the leg named.
    placement_services.model_apply(data={"kind": "Model", "name": "m", "replicas": 3, "profile": {"gpus": 4}})
    rows = selectors.replica_rows(model="m")
    assert sorted(r["nodes"][0] for r in rows if r["nodes"]) == ["n1", "n2"]
    (waiting,) = [r["reason"] for r in rows if not r["nodes"]]
    assert "leg p-a.A: 2.8 kW of a 3.0 kW limit (3.0 kW cap less 0%) in use, 5.6 kW with the shard (~2.8 kW)" in waiting


def test_ctl_facility_feeds_shows_each_leg_and_the_pdus_imbalance(capsys, join_node):
    for node in ("n1", "n2", "n3"):
        join_node(node, rack="r1", pdu="p-a,p-b", gpus=8, labels=legs_of(node))
    services.facility_apply(text=LEGS)
    for node, watts in (("n1", 2000), ("n2", 500), ("n3", 500)):
        NodeBooking.objects.update_or_create(node=Node.objects.get(name=node), defaults={"placed_watts": watts})
    a1 = next(f for f in feeds_overview()["feeds"] if f["name"] == "A1")
    (pdu,) = a1["legs"]
    # Leg C carries nothing: it is there at 0 W, as on the PDU.
    assert [(leg["leg"], leg["use_watts"]) for leg in pdu["legs"]] == [("A", 2500.0), ("B", 500.0), ("C", 0.0)]
    assert pdu["imbalance"] == 1.5  # |2500 − 1000| / 1000
    assert ctl(["facility", "feeds"]) == 0
    out = capsys.readouterr().out
    assert "PDU  LEG  LOAD    LIMIT   IMBALANCE" in out
    assert "p-a  A    2.5 kW  3.0 kW  150 %" in out
    family = {f.name: f for f in DomainPowerCollector().collect()}["llmgw_pdu_leg_imbalance_ratio"]
    assert {(s.labels["pdu"], s.labels["feed"]): round(s.value, 3) for s in family.samples} == {
        ("p-a", "A1"): 1.5, ("p-b", "B1"): 1.0}


def test_a_written_budget_above_its_feed_is_warned_about_and_the_feed_holds(capsys, join_node):
    join_node("n1", rack="r1", pdu="p-a,p-b")
    text = LEGS.replace("B1, voltage: 400, amperage: 16, phase: three", "B2, voltage: 230, amperage: 16, phase: single")
    text += "  budgets:\n    - {domain: 'rack:r1', cap_watts: 8000}\n"
    result = services.facility_apply(text=text)
    assert result["warnings"] == ["rack:r1: budget 8.0 kW is above feed B2's 2.9 kW"]
    rack = Budget.objects.get(domain="rack:r1")
    assert rack.effective_cap_watts == pytest.approx(230 * 16 * 0.8)
    assert ctl(["facility"]) == 0
    out = capsys.readouterr().out
    assert "rack:r1: budget 8.0 kW is above feed B2's 2.9 kW; the feed's cap holds" in out
    assert ctl(["facility", "-o", "json"]) == 0
    row = next(d for d in json.loads(capsys.readouterr().out)["domains"] if d["domain"] == "rack:r1")
    assert row["cap_watts"] == pytest.approx(2944) and row["cap_warning"].startswith("budget 8.0 kW")
    # A written cap below the feed's is simply the cap.
    services.budget_set(domain="rack:r1", cap_watts=2000)
    assert Budget.objects.get(domain="rack:r1").effective_cap_watts == 2000
    assert services.facility_apply(text=LEGS)["warnings"] == []


def test_feed_loss_adds_a_racks_load_as_ctl_facility_does(capsys, join_node):
    # One node mostly placed, one mostly measured: max(Σ reserved, Σ measured) would show 3.05 kW;
    # the rack's use, node by node, is 3.75 kW — and that is what both reports say.
    join_node("n1", rack="r1", pdu="p-a,p-b")
    join_node("n2", rack="r1", pdu="p-a,p-b")
    services.facility_apply(text="""\
facility:
  margin: 0
  node_watts: 0
  feeds:
    - {name: A, voltage: 230, amperage: 16, phase: single, pdus: [p-a]}
    - {name: B, voltage: 230, amperage: 10, phase: single, pdus: [p-b]}
""")
    now = timezone.now()
    for name, placed, measured in (("n1", 2000, 1050), ("n2", 1000, 1750)):
        node = Node.objects.get(name=name)
        NodeBooking.objects.update_or_create(node=node, defaults={"placed_watts": placed})
        Node.objects.filter(pk=node.pk).update(measured_peak_watts=measured, sensors_at=now)
    report = feed_loss_report(feed="A")
    (rack,) = [v for v in report["feeds"][0]["violations"] if v["domain"] == "rack:r1"]
    assert rack["load_watts"] == 3750.0
    assert ctl(["facility", "-o", "json"]) == 0
    row = next(d for d in json.loads(capsys.readouterr().out)["domains"] if d["domain"] == "rack:r1")
    assert row["use_watts"] == rack["load_watts"]
    assert rack["text"] == (
        "rack r1 on feed B: 3.8 kW of 1.8 kW without feed A (1.9 kW over; reserved 3.0 kW, measured peak 2.8 kW)"
    )


def test_a_failed_feed_is_n_minus_1_now_and_a_planned_one_counts_for_nothing(capsys, join_node):
    join_node("n1", rack="r1", pdu="p-a,p-b")
    services.facility_apply(text=LEGS.replace("pdus: [p-b]", "pdus: [p-b], status: failed") +
                            "    - {name: P1, voltage: 230, amperage: 10, phase: single, racks: [r1], status: planned}\n")
    rack = Budget.objects.get(domain="rack:r1")
    assert rack.cap_watts == pytest.approx(400 * 3**0.5 * 16 * 0.8)  # A1 alone: neither B1 nor P1 counts
    assert "B1 failed, P1 planned: not counted" in rack.derived_from
    assert Budget.objects.get(domain="pdu:p-b").cap_watts == 0
    report = feed_loss_report()
    assert [(f["feed"], f["failed"]) for f in report["feeds"]] == [("A1", False), ("B1", True)]
    assert report["text"].endswith("feed B1 failed: running on N−1 now")
    assert ctl(["facility", "feed-loss"]) == 3  # n1 goes dark without A1: a violation
    out = capsys.readouterr().out
    assert "feed B1 FAILED, now: 0 violations" in out
    assert "rack r1: 1 node(s) lose power with feed A1 (n1)" in out  # nothing is left behind A1
    family = {f.name: f for f in DomainPowerCollector().collect()}["llmgw_feed_failed"]
    assert {s.labels["feed"]: s.value for s in family.samples} == {"A1": 0.0, "B1": 1.0, "P1": 0.0}
