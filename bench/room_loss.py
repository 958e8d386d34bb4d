"""Room loss, timed: 10,000 nodes in 400 racks and 4 rooms, ~80 % full, one room held with drain.

Makes its own database (``llmgw_bench_room_loss``, or ``--database``, on the server of DATABASE_URL) and inserts the rows
directly (what heartbeats and past reconciles would have left): ``--nodes`` ready nodes × 8 GPUs, each
with its agent's last sensors document, 25 to a rack, racks in 4 rooms, budgets on every rack and PDU;
10 models (8- and 4-GPU) whose placed replicas fill ~80 % of the cards, spread over every rack. Then,
timed per phase, as an operator's ``llmgw ctl hold room:… --drain`` and the next reconcile would: the
hold, then reconcile runs (with ``LLMGW_DRAIN_SURGE``, default here 100,000: every displaced replica's
replacement at once) until every replica on the room has a placed replacement or a stated reason to
wait. The lost room's ~2,750 replicas cannot all fit in the 75 % of the cards left, so some wait, each
with its reason. Last, three rounds of the thermal conditions' evaluation (the agents' source over
every node's sensors, as beat runs it every 15 s), timed.

Run: ``.venv/bin/python bench/room_loss.py`` (``--nodes``, ``--fill``). Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_DB = "llmgw_bench_room_loss"
NODES_PER_RACK = 25
ROOMS = 4
GPUS = 8
MODEL_GPUS = (8, 8, 8, 8, 8, 4, 4, 4, 4, 4)


def sensors(i: int) -> dict:
    """A node's last readings as its agent reports them (~2.8 KB, the shape of agents.simulator's): the
    index reads each card's enforced power limit out of them (no power measured: placed watts count)."""
    gpus = [
        {"index": g, "uuid": f"GPU-{i:05}{g}-0000-0000-0000-000000000000", "temperature_celsius": 61.3,
         "memory_temperature_celsius": 70.1, "slowdown_temperature_celsius": 87, "power_watts": 512.4,
         "power_limit_watts": 700, "throttle_reasons": [], "enforced_power_limit_watts": 700,
         "default_power_limit_watts": 700, "max_sm_clock_mhz": 1980}
        for g in range(GPUS)
    ]
    return {"gpus": gpus, "replicas": [], "cpu_power_watts": 300.1, "cpu_temperature_celsius": 55.2,
            "inlet_temperature_celsius": 24.1}


def load(count: int, fill: float) -> int:
    """Nodes, domains, budgets and placed replicas; the replicas placed."""
    from django.db import connection
    from django.utils import timezone

    from agents.models import GPU, Node, NodeDomain
    from facility.domains import domains_of
    from facility.models import Budget
    from placement.models import GpuBooking, Model, Replica, ReplicaState, Shard

    now = timezone.now()
    racks = count // NODES_PER_RACK
    per_room = racks // ROOMS
    nodes = []
    for i in range(count):
        rack = i // NODES_PER_RACK
        labels = {
            "llmgw.io/site": "sto1",
            "llmgw.io/room": f"hall{rack // per_room}",
            "llmgw.io/row": f"{rack // 10:03}",
            "llmgw.io/rack": f"r{rack:03}",
            "llmgw.io/pdu": f"r{rack:03}-{'ab'[i % 2]}",
        }
        nodes.append(Node(name=f"gpu{i:05}", cpu_cores=128, memory_gib=2048, labels=labels, agent_labels=labels,
                          last_heartbeat_at=now, heartbeat_interval_seconds=3600, sensors=sensors(i)))
    nodes = Node.objects.bulk_create(nodes, batch_size=2000)
    GPU.objects.bulk_create(
        (GPU(node=n, index=g, model="NVIDIA H200", memory_gib=141, power_limit_watts=700)
         for n in nodes for g in range(GPUS)), batch_size=5000,
    )
    members: dict[str, int] = {}
    rows = []
    for n in nodes:
        for d in domains_of(n.labels):
            rows.append(NodeDomain(node=n, domain=str(d), level=d.level))
            members[str(d)] = members.get(str(d), 0) + 1
    NodeDomain.objects.bulk_create(rows, batch_size=5000)
    per_node = (350 + GPUS * 700) / 0.9  # a full node fits under every cap: cards, not power, run out
    Budget.objects.bulk_create(
        Budget(domain=d, cap_watts=round(per_node * size, -2), other_watts=0)
        for d, size in members.items() if d.split(":")[0] in ("rack", "pdu")
    )
    # Replicas node by node: each node takes whole shards while its cards last, the models taking turns;
    # the nodes taken first of every rack, then second of every rack, …: every rack (and room) fills alike.
    models = [Model.objects.create(name=f"m{m:02}", replicas=0, gpus=g, cpu_cores=4, memory_gib=64,
                                   min_ready_seconds=0) for m, g in enumerate(MODEL_GPUS)]
    want = int(count * GPUS * fill)
    placed = {m.pk: 0 for m in models}
    plan = []  # (model, node, cards)
    used = 0
    turn = 0
    for node in sorted(nodes, key=lambda n: (int(n.name[3:]) % NODES_PER_RACK, n.name)):
        free = list(range(GPUS))
        while used < want:
            model = models[turn % len(models)]
            if len(free) < model.gpus:
                break
            turn += 1
            cards, free = free[: model.gpus], free[model.gpus :]
            plan.append((model, node, cards))
            used += model.gpus
        if used >= want:
            break
    replicas = []
    for model, _, _ in plan:
        placed[model.pk] += 1
        replicas.append(Replica(model=model, ordinal=placed[model.pk], state=ReplicaState.READY,
                                placed_at=now, ready_since=now))
    replicas = Replica.objects.bulk_create(replicas, batch_size=5000)
    shards = Shard.objects.bulk_create(
        (Shard(replica=r, node=node, gpu_indices=cards, cpu_cores=4, memory_gib=64, draw_watts=700 * len(cards),
               state=ReplicaState.READY) for r, (_, node, cards) in zip(replicas, plan, strict=True)),
        batch_size=5000,
    )
    GpuBooking.objects.bulk_create(
        (GpuBooking(shard=s, node_id=s.node_id, index=c) for s in shards for c in s.gpu_indices), batch_size=5000
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO placement_nodebooking (node_id, cpu_cores, memory_gib, placed_watts) "
            "SELECT node_id, SUM(cpu_cores), SUM(memory_gib), SUM(draw_watts) FROM placement_shard GROUP BY node_id"
        )
    for model in models:
        Model.objects.filter(pk=model.pk).update(replicas=placed[model.pk])
    return len(replicas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--fill", type=float, default=0.8, help="share of the cards the replicas take")
    parser.add_argument("--surge", type=int, default=100_000, help="LLMGW_DRAIN_SURGE for the drain")
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile of the hold and reconciles")
    parser.add_argument("--database", default=BENCH_DB, help="the bench database's name, dropped and made afresh")
    args = parser.parse_args()

    from bench.placements import bench_database

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    os.environ["DATABASE_URL"] = bench_database(base, args.database)
    os.environ.pop("REDIS_URL", None)
    os.environ["LLMGW_DB_POOL"] = "false"
    os.environ["LLMGW_DRAIN_SURGE"] = str(args.surge)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from facility.services import hold_create, settings_set
    from placement.models import Replica, ReplicaState, Shard
    from placement.reconcile import reconcile_all

    t0 = time.perf_counter()
    settings_set(margin=0.1, gpu_watts=700, cpu_core_watts=None, node_watts=350)
    placed = load(args.nodes, args.fill)
    room = "room:hall0"
    displaced = Shard.objects.filter(node__domains__domain=room).values("replica_id").distinct().count()
    print(
        f"loaded {args.nodes:,} nodes in {args.nodes // NODES_PER_RACK} racks and {ROOMS} rooms, "
        f"{placed:,} placed replicas ({args.fill:.0%} of the cards) in {time.perf_counter() - t0:.1f} s; "
        f"{displaced:,} replicas in {room}"
    )

    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    started = time.perf_counter()
    hold_create(domain=room, reason="room lost", drain=True)
    held = time.perf_counter() - started
    rounds = []

    def done() -> bool:
        waiting = Replica.objects.filter(replaces__isnull=False, state=ReplicaState.PENDING)
        made = Replica.objects.filter(replaces__isnull=False).count()
        return made >= displaced and not waiting.filter(reason="").exists()

    # Without Redis the hold's own request reconciles (the embedded default); then more runs if needed.
    while not done() and len(rounds) < 20:
        t = time.perf_counter()
        run = reconcile_all()
        rounds.append((time.perf_counter() - t, run))
    total = time.perf_counter() - started
    if args.profile:
        import pstats

        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(40)  # which step holds the time
    replaced = Replica.objects.filter(replaces__isnull=False).exclude(state=ReplicaState.PENDING).count()
    waiting = Replica.objects.filter(replaces__isnull=False, state=ReplicaState.PENDING)
    reasons: dict[str, int] = {}
    for reason in waiting.values_list("reason", flat=True):
        reasons[reason[:90]] = reasons.get(reason[:90], 0) + 1
    print(f"hold {room} --drain, with its reconcile (the drain's replacements made and placed): {held:.2f} s")
    for number, (seconds, run) in enumerate(rounds, 1):
        print(
            f"reconcile {number}: {seconds:.2f} s — {run.created:,} replacements made, {run.placed:,} placed, "
            f"{run.pending:,} pending, {run.removed:,} removed"
        )
    print(
        f"room loss: {displaced:,} displaced replicas; {replaced:,} replacements placed and "
        f"{waiting.count():,} waiting with a stated reason, in {total:.2f} s from the hold"
    )
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {count:,} waiting: {reason}")

    from django.utils import timezone

    from agents.models import Node
    from facility.evaluation import conditions_evaluate

    Node.objects.update(sensors_at=timezone.now())  # every node's sensors fresh: the agents' source reads them
    seconds = []
    for _ in range(3):
        t = time.perf_counter()
        conditions_evaluate()
        seconds.append(time.perf_counter() - t)
    print(f"a conditions round over {args.nodes:,} nodes' sensors: {', '.join(f'{s:.2f}' for s in seconds)} s")


if __name__ == "__main__":
    main()
