"""Bulk changes: 10,000 placed replicas → 1, and a 10,000-replica model applied afresh until all are placed.

For each backend (SQLite, the embedded default, in a temporary directory; PostgreSQL on the server of
DATABASE_URL, database ``llmgw_bench_bulk``) in its own process: migrate, bulk-load 1,250 ready nodes ×
8 GPUs and one model with ``--replicas`` placed replicas of one GPU each (shards, GPU bookings, node
bookings), then apply the same model with ``replicas: 1`` through ``placement.services.model_apply``
— the API's and ctl's path; without Redis the reconcile runs in-process after the commit, so the
figure is the whole request. Then deletes the model the same way, and applies it again with
``replicas: 10000`` on the emptied nodes: the time until every replica is placed (the request, then one
reconcile run over the rest).

Run: ``.venv/bin/python bench/bulk.py`` (``--backend sqlite`` or ``postgresql`` for one). Prints figures,
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_DB = "llmgw_bench_bulk"
GPUS_PER_NODE = 8


def load(replicas: int) -> None:
    """Ready nodes enough for ``replicas`` one-GPU replicas, and the replicas placed on them."""
    from django.utils import timezone

    from agents.models import GPU, Node
    from placement.models import GpuBooking, Model, NodeBooking, Replica, ReplicaState, Shard

    now = timezone.now()
    count = -(-replicas // GPUS_PER_NODE)
    nodes = Node.objects.bulk_create(
        Node(name=f"n{i:05}", cpu_cores=64, memory_gib=1024, last_heartbeat_at=now, heartbeat_interval_seconds=3600)
        for i in range(count)
    )
    GPU.objects.bulk_create(GPU(node=n, index=g, model="NVIDIA H200") for n in nodes for g in range(GPUS_PER_NODE))
    model = Model.objects.create(name="big", replicas=replicas, gpus=1, cpu_cores=1, memory_gib=8, power_watts=700)
    rows = Replica.objects.bulk_create(
        Replica(model=model, ordinal=i + 1, state=ReplicaState.READY, placed_at=now) for i in range(replicas)
    )
    shards = Shard.objects.bulk_create(
        Shard(replica=r, node=nodes[i // GPUS_PER_NODE], gpu_indices=[i % GPUS_PER_NODE], cpu_cores=1,
              memory_gib=8, draw_watts=700, state=ReplicaState.READY)
        for i, r in enumerate(rows)
    )
    GpuBooking.objects.bulk_create(
        GpuBooking(shard=s, node_id=s.node_id, index=s.gpu_indices[0]) for s in shards
    )
    per_node: dict[int, int] = {}
    for s in shards:
        per_node[s.node_id] = per_node.get(s.node_id, 0) + 1
    NodeBooking.objects.bulk_create(
        NodeBooking(node_id=n, cpu_cores=k, memory_gib=8 * k, placed_watts=700 * k) for n, k in per_node.items()
    )


def document(replicas: int) -> dict:
    return {"kind": "Model", "name": "big", "replicas": replicas, "profile": {"gpus": 1, "cpu_cores": 1,
            "memory_gib": 8, "power_watts": 700}}


def run(backend: str, replicas: int) -> None:
    """One backend, in this process."""
    os.environ.pop("REDIS_URL", None)  # the embedded default: the reconcile runs in-process
    os.environ["LLMGW_DB_POOL"] = "false"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    if backend == "postgresql":
        from bench.placements import bench_database

        os.environ["DATABASE_URL"] = bench_database(
            os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw"), BENCH_DB
        )
    else:
        os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='llmgw-bulk-')}/llmgw.sqlite3"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from placement import services
    from placement.models import GpuBooking, NodeBooking, Replica

    t0 = time.perf_counter()
    load(replicas)
    loaded = time.perf_counter() - t0
    t0 = time.perf_counter()
    services.model_apply(data=document(1))
    down = time.perf_counter() - t0
    left = Replica.objects.count()
    booked = GpuBooking.objects.count()
    cores = sum(NodeBooking.objects.values_list("cpu_cores", flat=True))
    t0 = time.perf_counter()
    services.model_delete(name="big")
    deleted = time.perf_counter() - t0
    print(
        f"{backend}: {replicas:,} placed replicas loaded in {loaded:.1f} s; scaled to 1 in {down:.2f} s "
        f"({left} replica, {booked} GPU and {cores} cores still booked); the model deleted in {deleted:.2f} s"
    )
    # The other way: the same model applied afresh on the emptied nodes, until every replica is placed
    # (the request places its first ones; the rest is one reconcile run, in batches on PostgreSQL).
    from placement.reconcile import reconcile_all

    t0 = time.perf_counter()
    services.model_apply(data=document(replicas))
    answered = time.perf_counter() - t0
    run = reconcile_all(model_names=["big"])
    placed_in = time.perf_counter() - t0
    placed = Replica.objects.filter(state="placed").count()
    print(
        f"{backend}: applied `replicas: {replicas:,}` on the empty nodes: answered in {answered:.2f} s, "
        f"all placed in {placed_in:.2f} s ({placed:,} placed, {run.pending} pending, "
        f"{GpuBooking.objects.count():,} GPUs booked)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--replicas", type=int, default=10_000)
    args = parser.parse_args()
    if args.backend != "both":
        run(args.backend, args.replicas)
        return
    for backend in ("sqlite", "postgresql"):  # one process each: Django is set up once per process
        subprocess.run(
            [sys.executable, __file__, "--backend", backend, "--replicas", str(args.replicas)], check=True
        )


if __name__ == "__main__":
    main()
