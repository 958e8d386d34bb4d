"""Shedding: a hot domain loses one replica per interval, lowest class first, replaced before it stops;
the dry run lists the moves then made; with shedding off nothing moves."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from facility.models import ConditionEvent
from facility.services import condition_override_set, facility_apply
from llmgw.ctl import main as ctl
from llmgw.errors import InvalidInput
from placement.models import Replica, Shard
from placement.reconcile import reconcile_all
from placement.services import models_apply
from placement.shedding import shed_plan, shed_run
from tests.integration.drive import Cluster, ready_counts

pytestmark = pytest.mark.django_db

ENFORCE = "facility:\n  conditions: {mode: enforce}\n  sources: {agents: false}\n"
SHEDDING = ENFORCE + "  shedding: {enabled: true, shed_after: 10m, interval: 5m}\n"


def model(name: str, service_class: str, min_ready: int = 1) -> str:
    return (
        f"kind: Model\nname: {name}\nreplicas: 1\nclass: {service_class}\nmin_ready: {min_ready}\n"
        "profile: {gpus: 2, min_ready_seconds: 0, command: 'serve {model} --port {port}'}\n"
    )


def hot_rack_with_three_classes() -> Cluster:
    """Three models of one replica each on rack r1's node; an empty node in r2; r1 set hot."""
    cluster = Cluster({"r1": 1})
    cluster.tick()
    models_apply(text="---\n".join(model(n, c) for n, c in (("crit", "critical"), ("std", "standard"),
                                                               ("bat", "batch"))))
    reconcile_all()
    for _ in range(10):
        cluster.tick()
    assert ready_counts() == {"crit": 1, "std": 1, "bat": 1}
    cluster.add("n-r2-1", "r2")
    cluster.tick()
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC down", seconds=7200)
    return cluster


def rack_of(replica: Replica) -> str:
    return Shard.objects.filter(replica=replica).first().node.labels["llmgw.io/rack"]


def test_with_shedding_off_nothing_moves(capsys):
    hot_rack_with_three_classes()
    facility_apply(text=ENFORCE)
    later = timezone.now() + timedelta(hours=2)
    assert shed_plan(now=later) == []
    assert shed_run(now=later) == []
    assert not Replica.objects.exclude(shed_reason="").exists()
    assert not Replica.objects.filter(replaces__isnull=False).exists()
    assert not ConditionEvent.objects.filter(reason__startswith="shed:").exists()
    assert ctl(["facility", "shed", "--dry-run"]) == 0
    assert "shedding is off" in capsys.readouterr().out


def test_a_hot_rack_loses_one_replica_per_interval_lowest_class_first_and_the_dry_run_said_so(capsys, admin_client):
    cluster = hot_rack_with_three_classes()
    facility_apply(text=SHEDDING)
    t0 = timezone.now()
    page = admin_client.get("/facility/").content.decode()
    assert "Shedding: the next moves" in page and "move bat#1 (batch, at its minimum" in page
    assert shed_run(now=t0) == []  # hot since now: not yet for shed_after
    dry = shed_plan(now=t0 + timedelta(minutes=10), intervals=3)
    assert [(m["action"], m["replica"], m["to"]) for m in dry] == [
        ("move", "bat#1", ["n-r2-1"]),
        ("move", "std#1", ["n-r2-1"]),
        ("stays", None, []),  # crit is never shed
    ]
    assert dry[0]["reason"].startswith("move bat#1 (batch, at its minimum: 1 ready, min 1) to n-r2-1: rack r1 is hot")

    made = shed_run(now=t0 + timedelta(minutes=10))
    assert shed_run(now=t0 + timedelta(minutes=12)) == []  # one per interval
    made += shed_run(now=t0 + timedelta(minutes=15))
    assert [(m["action"], m["replica"], m["to"]) for m in made] == [
        (m["action"], m["replica"], m["to"]) for m in dry[:2]
    ]
    # Each old replica still serves while its replacement starts: replacement first.
    assert Replica.objects.filter(model__name="bat").count() == 2
    shed = ConditionEvent.objects.filter(domain="rack:r1", reason__startswith="shed: move").count()
    assert shed == 2
    for _ in range(15):
        cluster.tick()
    by_model = {r.model.name: r for r in Replica.objects.select_related("model")}
    assert Replica.objects.count() == 3
    assert {name: rack_of(r) for name, r in by_model.items()} == {"crit": "r1", "std": "r2", "bat": "r2"}
    assert ready_counts() == {"crit": 1, "std": 1, "bat": 1}
    assert ctl(["facility", "shed", "--dry-run", "-o", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["enabled"] is True and [r["action"] for r in answer["moves"]] == ["stays"]


def test_a_wrong_shedding_block_names_file_line_and_path_and_applies_nothing():
    with pytest.raises(InvalidInput) as caught:
        facility_apply(text="facility:\n  shedding:\n    domains:\n      rack:r1: {interval: soon}\n")
    assert str(caught.value).startswith("server.yaml line 4: facility.shedding.domains.rack:r1.interval: ")
    with pytest.raises(InvalidInput) as caught:
        facility_apply(text="facility:\n  capping:\n    lever: clocks\n")
    assert str(caught.value) == (
        "server.yaml line 3: facility.capping.lever: one of power_limit, locked_clocks, not 'clocks'"
    )



def test_every_shed_is_counted_on_metrics():
    from facility.metrics import shed_moves

    hot_rack_with_three_classes()
    facility_apply(text=SHEDDING)
    t0 = timezone.now()
    shed_run(now=t0)
    shed_run(now=t0 + timedelta(minutes=10))
    samples = {(s.labels["domain"], s.labels["outcome"]): s.value for s in shed_moves().samples
               if s.name == "llmgw_shed_moves_total"}
    assert samples == {("rack:r1", "move"): 1.0}


def test_with_no_room_elsewhere_a_replica_stays_and_says_why_unless_drop_batch_stops_a_batch_one():
    cluster = Cluster({"r1": 1})
    cluster.tick()
    models_apply(text=model("bat", "batch").replace("replicas: 1", "replicas: 2"))
    reconcile_all()
    for _ in range(10):
        cluster.tick()
    assert ready_counts() == {"bat": 2}
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC down", seconds=7200)
    facility_apply(text=SHEDDING)
    t0 = timezone.now()
    shed_run(now=t0)
    [stays] = shed_run(now=t0 + timedelta(minutes=10))
    assert stays["action"] == "stays"
    assert stays["reason"].startswith("bat#2 stays (batch, above its minimum: 2 ready, min 1): no replacement fits: ")
    assert Replica.objects.count() == 2
    facility_apply(text=SHEDDING.replace("interval: 5m", "interval: 5m, drop_batch: true"))
    [drop] = shed_run(now=t0 + timedelta(minutes=15))
    assert (drop["action"], drop["replica"]) == ("drop", "bat#2")
    assert list(Replica.objects.values_list("ordinal", flat=True)) == [1]
    # At its minimum now: the last one is never dropped.
    [last] = shed_run(now=t0 + timedelta(minutes=20))
    assert last["action"] == "stays" and "at its minimum: 1 ready, min 1" in last["reason"]


def test_a_rack_past_its_power_limit_is_shed_too_after_shed_after():
    from facility.services import budget_set

    cluster = Cluster({"r1": 1})
    cluster.tick()
    models_apply(text=model("std", "standard"))
    reconcile_all()
    for _ in range(10):
        cluster.tick()
    cluster.add("n-r2-1", "r2")
    cluster.tick()
    budget_set(domain="rack:r1", cap_watts=1000)  # far under what its node draws
    facility_apply(text="facility:\n  sources: {agents: false}\n  shedding: {enabled: true, shed_after: 10m}\n")
    t0 = timezone.now()
    assert shed_run(now=t0) == []
    [move] = shed_run(now=t0 + timedelta(minutes=10))
    assert (move["action"], move["replica"], move["to"]) == ("move", "std#1", ["n-r2-1"])
    assert "rack r1 is past its power limit (use " in move["reason"]
