"""Placement end to end: spreading across racks, holds, power refusals, lost races, explain and headroom."""

from __future__ import annotations

import json

import pytest

from agents.services import heartbeat_record
from agents.simulator.cluster import heartbeat_for
from facility.services import budget_set, hold_create
from llmgw.ctl import main as ctl
from placement import commit, reconcile, selectors, services, snapshot
from placement.index import PlacementIndex
from placement.models import Model, Replica
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db(transaction=True)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def apply(name: str, replicas: int, **profile) -> None:
    services.model_apply(data={"kind": "Model", "name": name, "replicas": replicas, "profile": profile})


def nodes_of(model: str) -> list[list[str]]:
    return [r["nodes"] for r in selectors.replica_rows(model=model)]


def test_replicas_spread_across_racks_before_bin_packing(capsys, join_node):
    join_node("gpu01", rack="r1", pdu="r1-a")
    join_node("gpu02", rack="r1", pdu="r1-a")
    join_node("gpu03", rack="r2", pdu="r2-a")
    apply("m", 2, gpus=4)
    # Bin packing alone would put the second replica beside the first on gpu01.
    assert nodes_of("m") == [["gpu01"], ["gpu03"]]
    code, out, _ = run(capsys, "explain-placement", "m")
    assert out.splitlines() == [
        "m: 2 wanted, 2 placed, 0 pending (4 GPUs × 1 node)",
        "#1 placed on gpu01[0-3]",
        "  why: leaves 4 GPUs free",
        "#2 placed on gpu03[0-3]",
        "  why: shares no rack or pdu with the model's 1 replica; leaves 4 GPUs free",
    ]
    # Every node now shares a rack and a PDU with the replicas: bin packing decides, then the name.
    apply("m", 4, gpus=4)
    assert nodes_of("m") == [["gpu01"], ["gpu03"], ["gpu01"], ["gpu03"]]


def test_a_held_rack_is_skipped_and_explain_says_so(capsys, join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r2")
    hold_create(domain="rack:r1", reason="PDU swap")
    apply("m", 2, gpus=8)
    code, out, _ = run(capsys, "explain-placement", "m")
    assert out.splitlines() == [
        "m: 2 wanted, 1 placed, 1 pending (8 GPUs × 1 node)",
        "#1 placed on gpu02[0-7]",
        "  why: leaves 0 GPUs free",
        "  passed over (1 node): 1 × rack r1 is held: PDU swap",
        "    gpu01: rack r1 is held: PDU swap",
        "#2 pending: no node fits (2 nodes): 1 × gpu: 8 requested, 0 free; 1 × rack r1 is held: PDU swap",
        "    gpu01: rack r1 is held: PDU swap",
        "    gpu02: gpu: 8 requested, 0 free",
    ]
    code, out, _ = run(capsys, "replicas", "--model", "m")
    assert out.splitlines()[2].split(None, 4)[4] == (
        "no node fits (2 nodes): 1 × gpu: 8 requested, 0 free; 1 × rack r1 is held: PDU swap"
    )
    data = json.loads(run(capsys, "explain-placement", "m", "-o", "json")[1])
    assert data["replicas"][0]["rejections"] == [{"node": "gpu01", "reason": "rack r1 is held: PDU swap"}]


def test_a_shard_that_would_pass_the_rack_limit_waits_with_the_figures(capsys, join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1")
    budget_set(domain="rack:r1", cap_watts=8000)
    apply("m", 2, gpus=8)
    refusal = "rack r1: 6.3 kW of a 7.2 kW limit (8.0 kW cap less 10%) in use, 11.9 kW with the shard (~5.6 kW)"
    [first, second] = selectors.replica_rows(model="m")
    assert first["nodes"] == ["gpu01"]
    assert second["reason"] == f"no node fits (2 nodes): 1 × gpu: 8 requested, 0 free; 1 × {refusal}"
    assert selectors.model_headroom("m") == {
        "model": "m",
        "existing": 1,
        "fits": 0,
        "limit": 1000,
        "why_not": f"no node fits (2 nodes): 1 × gpu: 8 requested, 0 free; 1 × {refusal}",
    }
    # A bigger cap is a change: the reconcile it triggers places the waiting replica.
    budget_set(domain="rack:r1", cap_watts=16000)
    assert nodes_of("m") == [["gpu01"], ["gpu02"]]


def test_headroom_is_a_dry_run(capsys, join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r2")
    apply("m", 1, gpus=2)
    code, out, _ = run(capsys, "headroom", "m")
    assert out.splitlines() == [
        "m: 7 more replicas fit (beside its 1 placed)",
        "the next one does not: no node fits (2 nodes): 2 × gpu: 2 requested, 0 free",
    ]
    assert Replica.objects.count() == 1
    assert len(json.loads(run(capsys, "replicas", "-o", "json")[1])) == 1


def test_a_lost_race_for_gpus_replans_on_another_node(join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r2")
    x = Model.objects.create(name="x", replicas=1, gpus=8)
    y = Model.objects.create(name="y", replicas=1, gpus=8)
    Replica.objects.create(model=x, ordinal=1)
    replica = Replica.objects.create(model=y, ordinal=1)
    stale = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
    reconcile.reconcile_all(model_names=["x"])  # another process, as far as `stale` knows
    assert nodes_of("x") == [["gpu01"]]
    outcome = commit.replica_place(replica=replica, request=snapshot.replica_request(y), index=stale)
    assert outcome.plan is not None and outcome.plan.nodes == {"gpu02"}
    row = selectors.model_explain("y")["replicas"][0]
    assert (row["nodes"], row["attempts"], row["conflicts"]) == (
        ["gpu02"],
        2,
        ["gpu01: GPUs 0-7 were booked meanwhile"],
    )


def test_two_shards_in_one_rack_do_not_both_take_its_last_kilowatts(join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1", labels={"pool": "y"})
    budget_set(domain="rack:r1", cap_watts=8000)
    x = Model.objects.create(name="x", replicas=1, gpus=8)
    # Two nodes, two locks: only the rack's budget row stands between y on gpu02 and x on gpu01.
    y = Model.objects.create(name="y", replicas=1, gpus=8, node_selector="pool=y")
    Replica.objects.create(model=x, ordinal=1)
    replica = Replica.objects.create(model=y, ordinal=1)
    stale = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
    reconcile.reconcile_all(model_names=["x"])
    outcome = commit.replica_place(replica=replica, request=snapshot.replica_request(y), index=stale)
    assert outcome.plan is None
    replica.refresh_from_db()
    assert replica.state == "pending"
    assert replica.explain["conflicts"] == [
        "gpu02: rack r1: 6.3 kW of a 7.2 kW limit (8.0 kW cap less 10%) in use, 11.9 kW with the shard (~5.6 kW)"
    ]
    assert replica.reason == "no node fits (2 nodes): 1 × excluded (lost a race); 1 × needs pool = y"


def test_replica_state_follows_the_shards_the_agents_report(join_node, node_client):
    join_node("gpu01")
    apply("m", 1, gpus=8, command="vllm serve {model} --port {port}")
    replica = Replica.objects.get()
    client = node_client("gpu01")
    beat = heartbeat_for(node_spec("gpu01"))
    beat["replicas"] = [{"id": replica.pk, "state": "starting"}]
    answer = client.post("/api/v1/agents/heartbeat", beat, format="json").json()
    assert answer["replicas"] == [
        {
            "id": replica.pk,
            "model": "m",
            "command": "vllm serve {model} --port {port}",
            "health_path": "/health",
            "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
            "cpu_cores": 0,
            "memory_gib": 0.0,
        }
    ]
    replica.refresh_from_db()
    assert (replica.state, replica.ready_since) == ("starting", None)
    beat["replicas"] = [{"id": replica.pk, "state": "ready", "port": 8001}]
    heartbeat_record(node_name="gpu01", heartbeat=beat)
    replica.refresh_from_db()
    assert replica.state == "ready" and replica.ready_since is not None
    beat["replicas"] = [{"id": replica.pk, "state": "failed", "message": "CUDA OOM"}]
    heartbeat_record(node_name="gpu01", heartbeat=beat)
    replica.refresh_from_db()
    assert (replica.state, replica.ready_since) == ("failed", None)
