"""What-if: a dry run of a hold with drain, or a feed's loss, that writes nothing and agrees with the drain."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Node, NodeDomain
from facility.models import Budget, Hold
from facility.services import hold_create
from llmgw.ctl import main as ctl
from llmgw.management.commands.demo import load_demo
from placement.models import Model, Replica, ReplicaState, Shard
from placement.reconcile import reconcile_all
from placement.whatif import what_if

pytestmark = pytest.mark.django_db(transaction=True)


def demo_loaded() -> None:
    """The demo's facility, nodes and models, its nodes due again in an hour rather than in 30 s: as its
    simulated agents keep them heard from, however long a drain's rounds take on a loaded machine."""
    load_demo()
    Node.objects.update(heartbeat_interval_seconds=3600)


def _busiest_rack() -> str:
    racks = Counter(Shard.objects.values_list("node__labels__llmgw.io/rack", flat=True))
    return racks.most_common(1)[0][0]


def _counts() -> tuple[int, ...]:
    return (Replica.objects.count(), Shard.objects.count(), Hold.objects.count(), Budget.objects.count())


def _all_ready() -> None:
    Model.objects.update(min_ready_seconds=0)
    Replica.objects.exclude(state=ReplicaState.PENDING).update(
        state=ReplicaState.READY, ready_since=timezone.now() - timedelta(hours=1)
    )


def test_what_if_hold_on_the_demo_lists_the_moves_the_real_drain_then_makes():
    demo_loaded()
    reconcile_all()
    rack = _busiest_rack()
    before = _counts()
    with CaptureQueriesContext(connection) as queries:
        preview = what_if(hold=f"rack:{rack}", drain=True)
    writes = [q["sql"] for q in queries if q["sql"].lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE")]
    assert writes == [] and _counts() == before  # nothing written
    assert preview["moves"], preview
    assert not preview["blocked"]

    hold_create(domain=f"rack:{rack}", reason="PDU swap", drain=True)
    made: dict[str, list[str]] = {}
    for _ in range(40):
        # The replacements the drain has placed so far (the hold's own reconcile placed the first ones).
        for r in Replica.objects.filter(replaces__isnull=False).select_related("replaces", "model"):
            made[f"{r.model.name}#{r.replaces.ordinal}"] = sorted(r.shards.values_list("node__name", flat=True))
        if not Shard.objects.filter(node__domains__domain=f"rack:{rack}", replica__replaces__isnull=True).exists():
            break
        _all_ready()
        reconcile_all()
    assert {m["replica"]: m["to"] for m in preview["moves"]} == made


def test_hold_without_drain_moves_nothing_and_lists_what_stays(capsys):
    demo_loaded()
    reconcile_all()
    rack = _busiest_rack()
    preview = what_if(hold=f"rack:{rack}")
    assert preview["moves"] == [] and preview["stay"]
    assert all(d["use_watts_before"] == d["use_watts_after"] for d in preview["domains"])
    assert ctl(["facility", "what-if", "hold", f"rack:{rack}", "--drain", "-o", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["scenario"] == f"hold rack:{rack} --drain" and body["moves"]
    assert ctl(["facility", "what-if", "hold", f"rack:{rack}", "--drain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"what if: hold rack:{rack} --drain\n")
    assert f"{body['moves'][0]['replica']}: " in out


def test_what_if_hold_warns_as_the_hold_would_of_a_name_no_node_is_in(capsys, admin_client):
    demo_loaded()
    reconcile_all()
    assert ctl(["facility", "what-if", "hold", "rack:r1-1", "--drain"]) == 0
    assert capsys.readouterr().out == (
        "what if: hold rack:r1-1 --drain\n"
        "nodes leaving: none\n"
        "moves (0):\n"
        "domains (use before -> after, of limit):\n"
        "  (no domain's use changes)\n"
        "warning: no node is in rack r1-1 yet; known racks nearest that name: r1-01, r1-02\n"
    )
    body = admin_client.post("/api/v1/facility/what-if", {"target": "rack:r1-1"}, content_type="application/json").json()
    assert body["warnings"] == ["no node is in rack r1-1 yet; known racks nearest that name: r1-01, r1-02"]
    assert what_if(hold="rack:r1-01")["warnings"] == [] and what_if(feed="A101")["warnings"] == []


def test_what_if_feed_loss_moves_the_replicas_of_nodes_left_dark(join_node):
    from facility.services import facility_apply

    join_node("a1", rack="r1", pdu="r1-a")  # single-fed
    join_node("b1", rack="r2", pdu="r2-a,r2-b")
    facility_apply(
        text="facility:\n  feeds:\n"
        "    - {name: A, voltage: 415, amperage: 32, phase: three, pdus: [r1-a, r2-a]}\n"
        "    - {name: B, voltage: 415, amperage: 32, phase: three, pdus: [r2-b]}\n"
    )
    from placement.services import models_apply

    models_apply(text="kind: Model\nname: m\nreplicas: 1\nprofile:\n  gpus: 8\n  command: serve\n"
                 "  node_selector: \"llmgw.io/rack = r1\"\n")
    reconcile_all()
    assert Shard.objects.filter(node__name="a1").exists()
    preview = what_if(feed="A")
    assert preview["nodes"] == ["a1"]
    assert preview["blocked"][0]["replica"] == "m#1"  # its selector allows only the dark rack


def test_what_if_api(admin_client):
    demo_loaded()
    reconcile_all()
    rack = _busiest_rack()
    body = admin_client.post("/api/v1/facility/what-if", {"target": f"rack:{rack}", "drain": True},
                             content_type="application/json").json()
    assert body["scenario"] == f"hold rack:{rack} --drain" and body["moves"][0]["from"]
    refused = admin_client.post("/api/v1/facility/what-if", {}, content_type="application/json")
    assert refused.status_code == 400 and refused.json()["field"] == "target"
    missing = admin_client.post("/api/v1/facility/what-if", {"target": "Z"}, content_type="application/json")
    assert missing.status_code == 404


def test_console_preview_and_feeds_listing(admin_client):
    demo_loaded()
    reconcile_all()
    rack = _busiest_rack()
    page = admin_client.get("/facility/").content.decode()
    assert 'id="feeds"' in page and "Preview" in page
    shown = admin_client.post("/facility/what-if", {"domain": f"rack:{rack}", "drain": "1", "reason": "PDU swap"})
    text = shown.content.decode()
    preview = what_if(hold=f"rack:{rack}", drain=True, reason="PDU swap")
    assert shown.status_code == 200 and f"Hold rack:{rack} and drain it</strong> — “PDU swap”" in text
    assert all(m["replica"] in text for m in preview["moves"][:8])
    assert not Hold.objects.exists()
    # The reason is asked for before the preview, as the hold asks for it.
    refused = admin_client.post("/facility/what-if", {"domain": f"rack:{rack}", "drain": "1", "reason": ""})
    assert refused.status_code == 422 and "reason: say why the domain is held" in refused.content.decode()


def test_the_consoles_feeds_read_as_ctl_facility_feeds(admin_client, capsys):
    """Rating, status, capacity, load (what N−1 judges), reserved and measured peak, in ctl's kW."""
    demo_loaded()
    reconcile_all()
    assert ctl(["facility", "feeds"]) == 0
    a101 = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("A101 "))
    name, rating, status, *figures = [c for c in re.split(r"\s{2,}", a101)][:7]
    assert (rating, status, figures[0]) == ("415 V 50 A 3φ 80 %", "active", "28.8 kW")
    page = admin_client.get("/facility/").content.decode()
    row = re.search(r"<tr><td>A101</td>.*?</tr>", page, re.S).group(0)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[:6] == [name, rating, status, *figures[:3]]  # capacity, load, reserved: ctl's figures
    # No node measured: the racks' other equipment alone (counted as reserved and measured, as a PDU's
    # other watts are); under a kW, the console says watts.
    assert (figures[3], cells[6]) == ("0.4 kW", "400 W")
    assert page.count("<th class=\"num\">LOAD</th>") == 1


def test_a_dry_hold_with_no_reason_words_its_refusals_as_a_hold_without_one():
    demo_loaded()
    reconcile_all()
    site = NodeDomain.objects.filter(level="site").values_list("domain", flat=True).first()
    preview = what_if(hold=site, drain=True)
    reasons = " ".join(str(b) for b in preview["blocked"])
    assert f"{site.replace(':', ' ')} is held" in reasons
    assert "held: held" not in reasons


def test_the_table_and_json_show_the_same_domains_those_changed_or_past_their_limit(capsys, admin_client):
    demo_loaded()
    reconcile_all()
    assert ctl(["facility", "what-if", "hold", "rack:r1-1", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["domains"] == []  # it listed every budgeted domain, unchanged
    rack = _busiest_rack()
    assert ctl(["facility", "budget", "set", f"rack:{rack}", "--cap-watts", "1000"]) == 0
    capsys.readouterr()
    use = what_if(hold="rack:r1-1")["domains"][0]["use_watts_before"]
    # Past its limit and left as it is: shown in each, with the same figures.
    assert ctl(["facility", "what-if", "hold", "rack:r1-1"]) == 0
    assert capsys.readouterr().out.splitlines()[3:5] == [
        "domains (use before -> after, of limit):",
        f"  rack:{rack}: {use / 1000:.1f} kW -> {use / 1000:.1f} kW of 0.9 kW",
    ]
    body = admin_client.post("/api/v1/facility/what-if", {"target": "rack:r1-1"}, content_type="application/json").json()
    assert body["domains"] == [
        {"domain": f"rack:{rack}", "use_watts_before": use, "use_watts_after": use, "limit_watts": 900.0}
    ]
    # A drain: the table's rows are the JSON's, in its order.
    other = next(r for r in ("r1-01", "r2-01", "r3-01") if r != rack)
    assert ctl(["facility", "what-if", "hold", f"rack:{other}", "--drain", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["domains"]
    assert ctl(["facility", "what-if", "hold", f"rack:{other}", "--drain"]) == 0
    out = capsys.readouterr().out.splitlines()
    shown = out[out.index("domains (use before -> after, of limit):") + 1:]
    assert rows and [line.split(": ")[0] for line in shown if not line.startswith("warning")] == [
        f"  {d['domain']}" for d in rows
    ]
    assert all(d["use_watts_before"] != d["use_watts_after"] or d["use_watts_after"] > d["limit_watts"] for d in rows)


def test_a_drain_frees_every_replica_it_moves_the_last_of_each_model_too(join_node):
    from facility.services import budget_set

    for rack in ("r1", "r2"):
        for n in (1, 2):
            join_node(f"{rack}n{n}", rack=rack)
        budget_set(domain=f"rack:{rack}", cap_watts=60_000)
    Model.objects.create(name="m", replicas=2, gpus=8)
    reconcile_all()
    [on_r1] = Shard.objects.filter(node__labels__contains={"llmgw.io/rack": "r1"})
    preview = what_if(hold="rack:r1", drain=True)
    assert [(m["replica"], m["from"]) for m in preview["moves"]] == [(f"m#{on_r1.replica.ordinal}", [on_r1.node.name])]
    rows = {d["domain"]: d for d in preview["domains"]}
    # Its replacement is up and the original stops: the held rack gives back what the other takes.
    given = rows["rack:r1"]["use_watts_before"] - rows["rack:r1"]["use_watts_after"]
    taken = rows["rack:r2"]["use_watts_after"] - rows["rack:r2"]["use_watts_before"]
    assert given == pytest.approx(taken) and given == pytest.approx(on_r1.draw_watts)
