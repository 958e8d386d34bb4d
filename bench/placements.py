"""Committed placements per second on PostgreSQL: plan (the index) + guarded commit, one replica at a time.

Makes its own database (``llmgw_bench_placements``, or ``--database``, on the server of DATABASE_URL, default
``postgres://postgres@127.0.0.1:5432/llmgw``), migrates it, and bulk-loads 1,000 ready nodes × 8 GPUs
over 40 racks (25 nodes each) and 80 PDUs (two per rack), with power budgets on every rack and PDU that
bind near 85% of the cards. Twenty models with 8-, 4-, 2- and 1-GPU profiles take turns: each turn
places one pending replica through ``placement.commit.replica_place`` — the path a reconcile takes:
plan on the index, then lock budgets and nodes, re-check, write shards, book GPUs — until none fits.

Prints placements/s and p50/p99 latency of plan + commit; then the same models placed in batches,
taking turns (one batch a turn), each round of turns in one run of batches as a reconcile places its
models (``placement.commit.lanes_place``), between runs of the lean single-commit probe
(bench/probe.py); then one model's 1,000 pending replicas in one call, as reconcile places a model
(the batched commit path, each batch committed before the next is planned), twice; then the planner
alone (bench/planner.py).
Run: ``.venv/bin/python bench/placements.py`` (``--profile`` for the top of a cProfile; ``--phases`` for
where the batched run's time went, step by step; ``--nodes``).
Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NODES_PER_RACK = 25
GPU_SIZES = (8, 8, 8, 4, 4, 4, 2, 2, 1, 1)
MODELS = 20
BENCH_DB = "llmgw_bench_placements"
PROBE_DB = "llmgw_bench_probe"


def bench_database(base_url: str, name: str | None = None) -> str:
    """Drop and create the bench database ``name`` (default: BENCH_DB, as ``--database`` set it) on the
    server of ``base_url``; its URL."""
    import psycopg

    name = name or BENCH_DB
    parts = urlparse(base_url)
    admin = urlunparse(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return urlunparse(parts._replace(path=f"/{name}"))


def quiet(base_url: str, wait: float = 30.0) -> str:
    """Let the server settle before a measured run: a checkpoint (the runs before wrote WAL), then no
    autovacuum worker busy (they start on the tables a run before changed, and share the two cores
    with the run that follows), waiting at most ``wait`` seconds. Returns what it waited for."""
    import psycopg

    parts = urlparse(base_url)
    admin = urlunparse(parts._replace(path="/postgres"))
    started = time.perf_counter()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        workers = 0
        while time.perf_counter() - started < wait:
            workers = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            ).fetchone()[0]
            if not workers:
                break
            time.sleep(0.2)
    return f"{time.perf_counter() - started:.1f} s" + (f", {workers} autovacuum workers still busy" if workers else "")


def load_cluster(count: int) -> None:
    """Nodes, GPUs, domains and budgets by bulk insert (what a thousand first heartbeats would leave)."""
    from django.utils import timezone

    from agents.models import GPU, Node, NodeDomain
    from facility.domains import domains_of
    from facility.models import Budget

    now = timezone.now()
    nodes = []
    for i in range(count):
        rack = f"r{i // NODES_PER_RACK:03}"
        labels = {
            "llmgw.io/site": "sto1",
            "llmgw.io/row": f"{i // (NODES_PER_RACK * 10):02}",
            "llmgw.io/rack": rack,
            "llmgw.io/pdu": f"{rack}-{'ab'[i % 2]}",
            "gpu.model": "H200" if i % 3 else "H100",
            "gpu.memory_gib": "141" if i % 3 else "80",
        }
        nodes.append(
            Node(
                name=f"gpu{i:05}",
                fabric=f"ib{i // 200}",
                cpu_cores=128,
                memory_gib=2048,
                labels=labels,
                agent_labels=labels,
                last_heartbeat_at=now,
                heartbeat_interval_seconds=3600,
                weights=[f"model{i % MODELS:02}"] if i % 7 == 0 else [],
            )
        )
    Node.objects.bulk_create(nodes, batch_size=500)
    nodes = list(Node.objects.order_by("name"))
    GPU.objects.bulk_create(
        [
            GPU(node=n, index=g, model="NVIDIA H200", memory_gib=141, power_limit_watts=700)
            for n in nodes
            for g in range(8)
        ],
        batch_size=2000,
    )
    members: dict[str, int] = {}
    rows = []
    for n in nodes:
        for d in domains_of(n.labels):
            rows.append(NodeDomain(node=n, domain=str(d), level=d.level))
            members[str(d)] = members.get(str(d), 0) + 1
    NodeDomain.objects.bulk_create(rows, batch_size=2000)
    # A full node draws 350 + 8 × 700 = 5,950 W; caps (less the 10% margin) hold about 85% of that.
    per_node = 5950 * 0.85 / 0.9
    Budget.objects.bulk_create(
        [
            Budget(domain=d, cap_watts=round(per_node * size, -2), other_watts=500)
            for d, size in members.items()
            if d.split(":")[0] in ("rack", "pdu")
        ]
    )


def analyze() -> None:
    """The planner's statistics of the tables just loaded, as a server with autovacuum has them minutes
    later (a server with it off, as one of these machines is, never does: the commit's read then scanned
    every node's domains, 3 ms of each placement)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def load_models(per_model: int) -> list:
    """Twenty models and ``per_model`` pending replicas each (scaling is not what is timed)."""
    from placement.models import Model, Replica

    models = []
    for m in range(MODELS):
        models.append(
            Model.objects.create(
                name=f"model{m:02}",
                replicas=per_model,
                gpus=GPU_SIZES[m % len(GPU_SIZES)],
                cpu_cores=8,
                memory_gib=128,
                node_selector="gpu.model in (H100,H200), gpu.memory_gib >= 80" if m % 4 == 0 else "",
            )
        )
    Replica.objects.bulk_create(
        [Replica(model=model, ordinal=i + 1) for model in models for i in range(per_model)], batch_size=2000
    )
    return models


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def place_all(models: list) -> tuple[list[float], float, int, int]:
    """Round-robin over the models, one replica at a time, through replica_place; until none fits. As a
    run of one-by-one placements does (placement.commit.batches._lanes_one_by_one, under lanes_place),
    placement_changed goes out once a round of turns, for the round's nodes, its time counted with the
    round's last placement, and the garbage collector is paused meanwhile."""
    from placement.commit import collector_paused

    with collector_paused():
        return _place_all(models)


def _place_all(models: list) -> tuple[list[float], float, int, int]:
    from placement import snapshot
    from placement.commit import replica_place
    from placement.index import PlacementIndex
    from placement.signals import placement_changed_on_commit

    started = time.perf_counter()
    index = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
    built = time.perf_counter() - started
    queues = {m.name: snapshot.pending_replicas(m) for m in models}
    requests = {m.name: snapshot.replica_request(m) for m in models}
    timings: list[float] = []
    conflicts = 0
    open_models = [m.name for m in models]
    while open_models:
        placed: set[str] = set()
        for name in list(open_models):
            if not queues[name]:
                open_models.remove(name)
                continue
            replica = queues[name].pop(0)
            t0 = time.perf_counter()
            outcome = replica_place(replica=replica, request=requests[name], index=index, announce=False)
            elapsed = time.perf_counter() - t0
            if outcome.plan is None:
                open_models.remove(name)
                continue
            timings.append(elapsed)
            placed |= outcome.plan.nodes
            conflicts += len(outcome.plan and replica.explain.get("conflicts", []) or [])
            requests[name] = dataclasses.replace(
                requests[name], existing=(*requests[name].existing, outcome.plan.nodes)
            )
        if placed:
            t0 = time.perf_counter()
            placement_changed_on_commit(nodes=placed)
            timings[-1] += time.perf_counter() - t0
    return timings, built, conflicts, sum(len(q) for q in queues.values())


def place_batched(models: list, batch: int) -> tuple[int, float, int]:
    """Round-robin over the models, ``batch`` replicas a turn, one transaction a batch (as a reconcile does
    on PostgreSQL); until none fits. Each round's turns in one run of batches (``lanes_place``, as a
    reconcile places its models, one after another). (placements, wall seconds, left pending)."""
    from placement import snapshot
    from placement.commit import Lane, collector_paused, lanes_place
    from placement.index import PlacementIndex

    with collector_paused():  # as reconcile_all runs
        started = time.perf_counter()
        index = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
        queues = {m.name: snapshot.pending_replicas(m) for m in models}
        requests = {m.name: snapshot.replica_request(m) for m in models}
        placed = 0
        open_models = [m.name for m in models]
        while open_models:
            lanes = {}
            for name in open_models:
                turn, queues[name] = queues[name][:batch], queues[name][batch:]
                lanes[name] = Lane(turn, requests[name])
            lanes_place(lanes=list(lanes.values()), index=index, batch=batch)
            for name, lane in lanes.items():
                nodes = [outcome.plan.nodes for _, outcome in lane.tried() if outcome.plan is not None]
                placed += len(nodes)
                requests[name] = dataclasses.replace(requests[name], existing=(*requests[name].existing, *nodes))
                if lane.stopped is not None or not queues[name]:
                    open_models.remove(name)
        return placed, time.perf_counter() - started, sum(len(q) for q in queues.values())


def place_one_model(model, batch: int) -> tuple[int, float]:
    """All of one model's pending replicas through one replicas_place call, as reconcile places a model:
    several batches, each committed before the next is planned. (placed, seconds)."""
    from placement import snapshot
    from placement.commit import collector_paused, replicas_place
    from placement.index import PlacementIndex

    with collector_paused():
        started = time.perf_counter()
        index = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
        outcomes, _ = replicas_place(
            replicas=snapshot.pending_replicas(model), request=snapshot.replica_request(model), index=index, batch=batch
        )
        return sum(1 for _, outcome in outcomes if outcome.plan is not None), time.perf_counter() - started


class Phases:
    """Wall time spent in the steps of a path, by wrapping them (``--phases``): where a placement's time
    goes, in the figures the README quotes. ``STEPS`` are the batched path's, ``ONE_AT_A_TIME`` the steps of
    replica_place (one placement per transaction)."""

    ONE_AT_A_TIME = (
        ("placement.index", "PlacementIndex", "plan", "plan (index)"),
        ("placement.commit.single", None, "placed_explain", "explain"),
        ("placement.commit.single", None, "_commit_pipelined", "lock, read, check, write, COMMIT (2 trips)"),
        # The plain way (a transaction of the caller's, SQLite, or a strict write's lost race):
        ("placement.commit.writes", None, "_locked_state", "lock budgets and nodes, read use"),
        ("placement.commit.writes", None, "_write_postgresql_batch", "write (one statement)"),
        ("psycopg", "Connection", "commit", "commit"),
        ("placement.index", "PlacementIndex", "apply", "apply the plan to the index"),
        ("placement.signals", None, "placement_changed_on_commit", "placement_changed (sent)"),
    )
    STEPS = (
        ("placement.snapshot", None, "pending_replicas", "load pending replicas"),
        ("placement.snapshot", None, "replica_request", "load each model's request"),
        ("placement.snapshot", None, "node_views", "read nodes for the index"),
        ("placement.index", "PlacementIndex", "plan", "plan (index)"),
        ("placement.index", "PlacementIndex", "apply", "apply plans to the index"),
        # Patched where each is called from (a function imported into a module is looked up there).
        ("placement.commit.batches", None, "_locked_state", "lock budgets and nodes, read use"),
        ("placement.commit.writes", None, "_locked_state", "lock budgets and nodes, read use"),
        ("placement.commit.recheck", "_Locked", "check", "re-check plans on the locked rows"),
        ("placement.commit.batches", None, "_write_postgresql_batch", "write (one statement a batch)"),
        ("psycopg", "Connection", "commit", "commit"),
        ("placement.commit.run", None, "replica_pending", "write a stop's reason"),
    )

    def __init__(self, steps: tuple | None = None) -> None:
        import importlib

        self.steps = steps or self.STEPS
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._undo = []
        for module, cls, name, label in self.steps:
            owner = importlib.import_module(module)
            if cls is not None:
                owner = getattr(owner, cls)
            original = getattr(owner, name)
            setattr(owner, name, self._timed(original, label))
            self._undo.append((owner, name, original))

    def _timed(self, original, label: str):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - started
                self.calls[label] = self.calls.get(label, 0) + 1

        return timed

    def close(self) -> None:
        for owner, name, original in self._undo:
            setattr(owner, name, original)

    def print(self, wall: float, placed: int, what: str = "the batched run") -> None:
        print(f"where {what}'s {wall:.2f} s went (wall time in each step, {placed} placements):")
        for label in dict.fromkeys(label for *_, label in self.steps):
            if label in self.seconds:
                seconds = self.seconds[label]
                print(f"  {label:36} {seconds * 1000:7.0f} ms  {seconds / wall:4.0%}  "
                      f"{self.calls[label]:5} calls, {seconds / max(placed, 1) * 1e6:5.0f} µs a placement")
        rest = wall - sum(self.seconds.values())
        print(f"  {'the rest (bookkeeping, signals)':36} {rest * 1000:7.0f} ms  {rest / wall:4.0%}")


def fresh_cluster(nodes: int, per_model: int) -> list:
    """The bench database emptied and loaded again (the same name: Django's settings stay right)."""
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    bench_database(os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres")
    call_command("migrate", verbosity=0)
    load_cluster(nodes)
    models = load_models(per_model)
    analyze()
    return models


def _placer(share: list) -> tuple[list[float], int]:
    """One placer process: its own connection and index; its share of the models."""
    from django.db import connections

    connections.close_all()
    timings, _, conflicts, _ = place_all(share)
    connections.close_all()
    return timings, conflicts


def run_concurrently(models: list, processes: int, nodes: int) -> None:
    """`processes` placers at once over one pool of nodes, as several reconciling workers would run: each
    plans on its own index and the guarded commit settles who gets what. Prints committed placements/s
    over the wall clock."""
    import multiprocessing

    from django.db import connections

    from placement.models import GpuBooking

    connections.close_all()
    shares = [models[i::processes] for i in range(processes)]
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        results = pool.map(_placer, shares)
    wall = time.perf_counter() - started
    timings = [t for result in results for t in result[0]]
    conflicts = sum(result[1] for result in results)
    booked = GpuBooking.objects.count()
    print(
        f"{nodes} nodes, {processes} placers at once: {len(timings)} committed placements in {wall:.2f} s, "
        f"{len(timings) / wall:,.0f} placements/s, p50 {percentile(timings, 0.5) * 1000:.2f} ms, "
        f"p99 {percentile(timings, 0.99) * 1000:.2f} ms; {booked} of {nodes * 8} GPUs booked, "
        f"{conflicts} lost races"
    )


def main() -> None:
    global BENCH_DB
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--per-model", type=int, default=250, help="pending replicas made per model")
    parser.add_argument(
        "--profile", action="store_true", help="print the top of a cProfile of the placements"
    )
    parser.add_argument("--skip-planner", action="store_true", help="do not run bench/planner.py afterwards")
    parser.add_argument(
        "--phases", action="store_true", help="time the batched run's steps and print where its time went"
    )
    parser.add_argument("--batch", type=int, default=128, help="replicas per transaction in the batched run")
    parser.add_argument("--rounds", type=int, default=3, help="batched runs, each between two probes")
    parser.add_argument("--probe-seconds", type=float, default=3.0, help="how long each probe commits")
    parser.add_argument(
        "--database", default=BENCH_DB,
        help="the bench database's name, dropped and made afresh (the probe's: this name and _probe)",
    )
    parser.add_argument(
        "--processes", type=int, default=1,
        help="placers at once, each with its own index and its share of the models (default 1: one at a time)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: at least 1 (each batched run is set beside the probes before and after it)")
    BENCH_DB = args.database
    probe_database = PROBE_DB if args.database == "llmgw_bench_placements" else f"{args.database}_probe"

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    os.environ["DATABASE_URL"] = bench_database(base)
    os.environ.pop("REDIS_URL", None)
    # Plain connections: placer processes are forked, and a pool's connections must not cross a fork.
    os.environ["LLMGW_DB_POOL"] = "false"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    load_cluster(args.nodes)
    models = load_models(args.per_model)
    analyze()
    print(
        f"loaded {args.nodes} nodes × 8 GPUs, 40 racks, 80 PDUs with budgets in {time.perf_counter() - t0:.1f} s"
    )

    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    if args.processes > 1:
        run_concurrently(models, args.processes, args.nodes)
        return
    one_phases = Phases(Phases.ONE_AT_A_TIME) if args.phases else None
    timings, built, conflicts, left = place_all(models)
    if one_phases is not None:
        one_phases.close()
    if args.profile:
        profiler.disable()
    from placement.models import GpuBooking

    booked = GpuBooking.objects.count()
    print(
        f"{args.nodes} nodes: index built in {built * 1000:.0f} ms; {len(timings)} committed placements "
        f"(plan + guarded commit on PostgreSQL), {len(timings) / sum(timings):,.0f} placements/s, "
        f"p50 {percentile(timings, 0.5) * 1000:.2f} ms, p99 {percentile(timings, 0.99) * 1000:.2f} ms; "
        f"{booked} of {args.nodes * 8} GPUs booked, {conflicts} lost races, {left} replicas left pending"
    )
    if one_phases is not None:
        one_phases.print(sum(timings), len(timings), "one at a time")
    if args.profile:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    one_rate = len(timings) / sum(timings)

    # The lean probe on the same server, beside each batched run: what one commit per placement allows
    # is the disk's flush, and it moves between runs minutes apart (209-819/s on one machine in two
    # hours), while the batched run moves with the CPU (a shared 2-core machine slows by 10-20 % under
    # minutes of load). So they alternate, probe, batched, probe, ..., each after the server settled,
    # and each batched run is held to the faster of the probes on either side of it.
    from bench.probe import probe

    settled = [quiet(base)]
    count, probe_wall = probe(base, seconds=args.probe_seconds, database=probe_database)
    probes = [count / probe_wall]
    rates = []
    for run in range(args.rounds):
        models = fresh_cluster(args.nodes, args.per_model)
        settled.append(quiet(base))
        phases = Phases() if args.phases and run == 0 else None
        placed, wall, left = place_batched(models, args.batch)
        if phases is not None:
            phases.close()
        rates.append(placed / wall)
        print(
            f"{args.nodes} nodes: {placed} committed placements in batches of up to {args.batch} in {wall:.2f} s "
            f"(index build included), {rates[-1]:,.0f} placements/s; {GpuBooking.objects.count()} GPUs booked, "
            f"{left} replicas left pending"
        )
        if phases is not None:
            phases.print(wall, placed)
        settled.append(quiet(base))
        count, probe_wall = probe(base, seconds=args.probe_seconds, database=probe_database)
        probes.append(count / probe_wall)
    print(f"the server settled before each run in {'; '.join(settled)}")
    print(
        f"one at a time: {one_rate:,.0f}/s against the probe just after it, {probes[0]:,.0f}/s: "
        f"{one_rate / probes[0]:.2f}× the probe"
    )
    ratios = [rate / max(probes[i], probes[i + 1]) for i, rate in enumerate(rates)]
    print(
        f"side by side: one at a time {one_rate:,.0f}/s | batched ({args.batch}), each round of turns in one "
        f"run {', '.join(f'{r:,.0f}' for r in rates)}/s | lean single-commit probe "
        f"{', '.join(f'{p:,.0f}' for p in probes)}/s (before, between and after) | batched / the faster probe "
        f"beside it = {', '.join(f'{r:.2f}×' for r in ratios)}, median {percentile(ratios, 0.5):.2f}×"
    )
    # One model's many pending replicas in one call (a large apply, a lost room's replacements).
    figures = []
    for _ in range(2):
        model = fresh_cluster(args.nodes, 1000)[1]  # 8 GPUs a replica, no selector
        quiet(base)
        figures.append(place_one_model(model, args.batch))
    print(
        "one model's 1,000 pending replicas in one call, as reconcile places a model (batches of "
        f"{args.batch}): "
        + "; ".join(
            f"{placed} placed in {wall:.2f} s, {placed / wall:,.0f}/s ({placed / wall / max(probes):.2f}× the fastest probe)"
            for placed, wall in figures
        )
    )
    if not args.skip_planner:
        from bench import planner

        for count in (1000, 10000):
            planner.run(count, 100)


if __name__ == "__main__":
    main()
