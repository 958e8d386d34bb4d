"""Four OS processes reconcile at once on PostgreSQL: no GPU booked twice, no domain past its limit.

Each process is a fresh Python with its own connection to the test database, building its own index
and racing the others through the guarded commit; the pool holds fewer replicas than are asked for.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from django.db import connection

from agents.models import Node
from facility import power
from facility.selectors import budgets, facility_settings
from facility.services import budget_set
from placement.models import GpuBooking, Model, NodeBooking, Replica, Shard
from placement.selectors import placed_watts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 4
MODELS = 10
REPLICAS_PER_MODEL = 20

SCRIPT = """
import sys, django
django.setup()
from placement.reconcile import reconcile_all
names = sys.argv[1].split(",")
run = reconcile_all(model_names=names)
print(run.placed, run.pending, run.created)
"""


def database_url() -> str:
    db = connection.settings_dict
    auth = db["USER"] or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def test_four_processes_place_200_replicas_into_a_smaller_pool(join_node):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL=postgres://…)")
    for rack in range(4):
        for n in range(3):
            join_node(f"gpu{rack}{n}", rack=f"r{rack}", pdu=f"r{rack}-a")
    # Heartbeats are not sent during the test: keep the nodes ready however long the processes take.
    Node.objects.update(heartbeat_interval_seconds=3600)
    # A rack's limit is 12.6 kW: three idle nodes (1.05 kW) and 16 of its 24 cards at 700 W.
    for rack in range(4):
        budget_set(domain=f"rack:r{rack}", cap_watts=14000)
    for m in range(MODELS):
        Model.objects.create(
            name=f"m{m}", replicas=REPLICAS_PER_MODEL, gpus=1 + m % 2, cpu_cores=4, memory_gib=32
        )
    names = [f"m{m}" for m in range(MODELS)]
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "llmgw.settings"}
    env.pop("REDIS_URL", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, ",".join(names[i * 3 :] + names[: i * 3])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (_out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err

    replicas = list(Replica.objects.all())
    assert len(replicas) == MODELS * REPLICAS_PER_MODEL
    states = Counter(r.state for r in replicas)
    assert set(states) == {"placed", "pending"} and states["pending"] > 0
    assert all(r.reason for r in replicas if r.state == "pending")
    assert all(not r.reason and r.shards.count() == 1 for r in replicas if r.state == "placed")

    # No GPU booked twice: each shard's cards are exactly the GPU rows pointing at it, and no card twice.
    cards = Counter()
    booked = defaultdict(list)
    for gpu in GpuBooking.objects.all():
        booked[gpu.shard_id].append(gpu.index)
    for shard in Shard.objects.all():
        assert sorted(booked.pop(shard.pk, [])) == sorted(shard.gpu_indices)
        for index in shard.gpu_indices:
            cards[(shard.node_id, index)] += 1
    assert not booked
    assert max(cards.values()) == 1

    # Counters match the shards, and no domain is past its limit.
    settings = facility_settings()
    placed = placed_watts()
    for node in Node.objects.all():
        shards = list(Shard.objects.filter(node=node))
        booking = NodeBooking.objects.filter(node=node).first() or NodeBooking(node=node)
        assert booking.cpu_cores == sum(s.cpu_cores for s in shards) <= node.cpu_cores
        assert booking.placed_watts == pytest.approx(sum(s.draw_watts or 0 for s in shards))
    for domain, budget in budgets().items():
        members = Node.objects.filter(domains__domain=str(domain))
        use = power.domain_use_watts(
            [power.NodePower(placed.get(n.pk, 0.0)) for n in members],
            other_watts=budget.other_watts,
            settings=settings,
        )
        assert use <= budget.limit_watts(settings.margin) + power.EPSILON_WATTS, domain
    # The pool is full by power: 16 cards a rack.
    assert sum(len(s.gpu_indices) for s in Shard.objects.all()) == 64
