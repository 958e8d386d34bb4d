"""Use after placement: a shard changes its node's term, it is not added on top of a measured idle draw.

The planner, the guarded commit's SQL and `ctl facility` report the same use for every domain.
"""

from __future__ import annotations

import json
import random

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents.services import heartbeat_record
from agents.simulator.cluster import heartbeat_for
from facility.services import budget_set, settings_set
from llmgw.ctl import main as ctl
from placement import commit, selectors, services, snapshot
from placement.planner import domain_uses
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db(transaction=True)


def join_measuring(name: str, rack: str, watts: float, gpus: int = 8) -> None:
    """A node whose first two heartbeats read ``watts`` over its cards (its measured peak: two readings)."""
    beat = heartbeat_for(node_spec(name, rack=rack, gpus=gpus))
    beat["sensors"] = {"gpus": [{"index": i, "power_watts": watts / gpus} for i in range(gpus)]}
    for _ in range(2):
        heartbeat_record(node_name=name, heartbeat=beat)


def apply(name: str, replicas: int, **profile) -> None:
    services.model_apply(data={"kind": "Model", "name": name, "replicas": replicas, "profile": profile})


def test_eight_racks_of_idle_nodes_take_one_replica_each_and_refuse_two_with_both_figures(capsys):
    settings_set(margin=0.1, gpu_watts=700, cpu_core_watts=10, node_watts=350)
    for rack in range(1, 9):
        for node in ("a", "b"):
            join_measuring(f"hr{rack}{node}", f"hr{rack}", 700)
        budget_set(domain=f"rack:hr{rack}", cap_watts=8000)
    apply("m", 10, gpus=8)
    rows = selectors.replica_rows(model="m")
    placed = [r for r in rows if r["nodes"]]
    # 0.35 + 5.6 + 0.35 + 0.7 = 7.0 kW of a 7.2 kW limit: one replica per rack fits.
    assert sorted({r["nodes"][0][:3] for r in placed}) == [f"hr{i}" for i in range(1, 9)]
    assert len(placed) == 8
    waiting = [r["reason"] for r in rows if not r["nodes"]]
    assert len(waiting) == 2
    both = "7.0 kW of a 7.2 kW limit (8.0 kW cap less 10%) in use, 11.9 kW with the shard (~5.6 kW)"
    for reason in waiting:
        assert f"rack hr1: {both}" in reason
    ctl(["facility", "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    uses = {d["domain"]: d["use_watts"] for d in data["domains"] if d["level"] == "rack"}
    assert uses == {f"rack:hr{i}": 7000.0 for i in range(1, 9)}


def sql_uses(domains: list[str], names: list[str]) -> dict[str, float]:
    """Each domain's use as the guarded commit's locked read sums it."""
    facility = snapshot.facility_view()
    with transaction.atomic(), connection.cursor() as cursor:
        _, _, _, use, _ = commit._locked_state(cursor, names, domains, facility, timezone.now())
    return use


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_planner_commit_sql_and_ctl_agree_on_every_domains_use_after_placements(capsys, seed):
    rng = random.Random(seed)
    settings_set(margin=0.1, gpu_watts=700, cpu_core_watts=10, node_watts=rng.choice([0, 150, 350]))
    names = []
    for rack in range(3):
        for i in range(3):
            name = f"n{rack}{i}"
            names.append(name)
            join_measuring(name, f"r{rack}", rng.choice([0, 300, 700, 2500, 6000]))
        budget_set(domain=f"rack:r{rack}", cap_watts=rng.choice([9000, 16000, 30000]))
    for step in range(4):
        apply(f"m{step}", rng.randint(1, 4), gpus=rng.choice([1, 2, 4, 8]))
        planner = {str(d): u for d, u in domain_uses(snapshot.node_views(), snapshot.facility_view()).items()}
        from_sql = sql_uses(sorted(planner), names)
        ctl(["facility", "-o", "json"])
        reported = {
            d["domain"]: d["use_watts"]
            for d in json.loads(capsys.readouterr().out)["domains"]
            if d["cap_watts"] is not None
        }
        assert sorted(planner) == sorted(from_sql) == sorted(reported) == [f"rack:r{i}" for i in range(3)]
        for domain, use in planner.items():
            assert from_sql[domain] == pytest.approx(use), domain
            assert reported[domain] == pytest.approx(use, abs=0.1), domain
    rows = [r for step in range(4) for r in selectors.replica_rows(model=f"m{step}")]
    assert any(r["nodes"] for r in rows)
