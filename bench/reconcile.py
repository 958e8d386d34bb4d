"""A reconcile round's time at 1,000 models × 10 replicas on PostgreSQL: idle, and after one change.

Makes its own database (``llmgw_bench_reconcile``, or ``--database``, on the server of DATABASE_URL,
default ``postgres://postgres@127.0.0.1:5432/llmgw``), bulk-loads ``--nodes`` ready nodes × 8 GPUs with
rack and PDU budgets (bench/placements.py's cluster), and ``--models`` models of ``--replicas`` one-GPU
replicas each, placed by a first reconcile. Then times, with ``placement.reconcile.reconcile_all`` as
beat's reconcile runs it:

- a round that works on every model, as every round did before a round passed over the models whose
  inputs had not moved (their digests cleared first);
- the idle round: nothing changed since the last one;
- the round after one model is scaled up by one replica (it is placed in that round);
- the round after one node joins (nothing waits: no model's inputs moved);
- the round after a node joins while one model has a replica waiting (that model is tried again).

Run: ``.venv/bin/python bench/reconcile.py`` (``--rounds`` for more samples of each). Prints figures,
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BENCH_DB = "llmgw_bench_reconcile"


def load_models(count: int, replicas: int) -> None:
    """``count`` one-GPU models with ``replicas`` pending replicas each, by bulk insert."""
    from placement.models import Model, Replica

    Model.objects.bulk_create(
        [Model(name=f"m{i:04}", replicas=replicas, gpus=1, cpu_cores=4, memory_gib=64) for i in range(count)],
        batch_size=1000,
    )
    Replica.objects.bulk_create(
        [Replica(model=m, ordinal=i + 1) for m in Model.objects.all() for i in range(replicas)], batch_size=5000
    )


def node_join(name: str) -> None:
    """One more ready node, as its first heartbeat leaves it."""
    from django.utils import timezone

    from agents.models import GPU, Node
    from agents.services import node_refresh_labels

    labels = {"llmgw.io/site": "sto1", "llmgw.io/rack": "r999", "llmgw.io/pdu": "r999-a"}
    node = Node.objects.create(
        name=name, cpu_cores=128, memory_gib=2048, labels=labels, agent_labels=labels,
        last_heartbeat_at=timezone.now(), heartbeat_interval_seconds=3600,
    )
    GPU.objects.bulk_create([GPU(node=node, index=g, model="NVIDIA H200", memory_gib=141, power_limit_watts=700)
                             for g in range(8)])
    node_refresh_labels(node)


def timed(label: str, rounds: int, before=None) -> None:
    """Run ``before()`` then one round, ``rounds`` times; print the median and the round's counts."""
    from placement.reconcile import reconcile_all

    samples = []
    run = None
    for _ in range(rounds):
        if before is not None:
            before()
        started = time.perf_counter()
        run = reconcile_all()
        samples.append(time.perf_counter() - started)
    # (A checkout from before rounds passed over models has no such counts: its rounds work on every one.)
    counts = f"worked on {run.worked}, passed over {run.passed}, " if hasattr(run, "worked") else ""
    print(f"{label:<62} {statistics.median(samples) * 1000:9.0f} ms  ({counts}placed {run.placed})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=10, help="replicas per model")
    parser.add_argument("--rounds", type=int, default=3, help="samples of each round (the median is printed)")
    parser.add_argument("--database", default=BENCH_DB, help="the bench database's name, dropped and made afresh")
    args = parser.parse_args()

    from placements import analyze, bench_database, load_cluster, quiet

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    url = bench_database(base, args.database)
    os.environ["DATABASE_URL"] = url
    os.environ.pop("REDIS_URL", None)
    # The nodes' one heartbeat is their bulk load's: none is evicted as silent while the bench runs.
    os.environ["LLMGW_EVICT_AFTER_SECONDS"] = "0"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from placement.models import Model, Replica
    from placement.reconcile import reconcile_all

    load_cluster(args.nodes)
    load_models(args.models, args.replicas)
    analyze()
    started = time.perf_counter()
    digests = hasattr(Model, "reconciled_digest")  # False: a checkout from before, for its figures
    first = reconcile_all(budget=None) if digests else reconcile_all()
    print(f"{args.nodes} nodes, {args.models} models × {args.replicas} replicas: first round placed "
          f"{first.placed} in {time.perf_counter() - started:.1f} s")
    reconcile_all()  # the models the first round changed rest from here on
    analyze()
    print(f"(settled: {quiet(url)})")

    if digests:
        timed("every model worked on (each round, before)", 1,
              before=lambda: Model.objects.update(reconciled_digest=""))
    reconcile_all()
    timed("idle: nothing changed", args.rounds)
    scaled = iter(Model.objects.order_by("name").values_list("name", flat=True))

    def scale_one() -> None:
        name = next(scaled)
        Model.objects.filter(name=name).update(replicas=args.replicas + 1)

    timed("one model scaled up by one replica (placed in the round)", args.rounds, before=scale_one)
    joined = iter(range(10**6))
    timed("one node joins, nothing waits", args.rounds, before=lambda: node_join(f"late{next(joined):05}"))
    # A model whose next replica fits nowhere: tried again whenever the cluster moves.
    Model.objects.filter(name="m0999").update(replicas=args.replicas + 1, gpus=64)
    Replica.objects.filter(model__name="m0999", state="pending").delete()
    reconcile_all()
    timed("one node joins, one model waits (tried again)", args.rounds,
          before=lambda: node_join(f"late{next(joined):05}"))


if __name__ == "__main__":
    main()
