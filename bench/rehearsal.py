"""A rehearsal: many events from several processes against PostgreSQL, then the independent auditor.

Makes its own database (``--database``, default ``llmgw_bench_rehearsal``, on the server of
DATABASE_URL), loads ``--nodes`` ready nodes × 8 GPUs in racks of 25 with budgets on every rack and PDU
(bench/placements.py's cluster), installs the auditor's commit log (bench/auditor.sql), then runs
``--processes`` processes for ``--seconds`` each, drawing events at random:

- heartbeats with drifting power: 500 nodes' measured peak set in one statement (nodes locked by name),
  each node one event;
- scale (place and free): a model's replicas set anew, then its reconcile (each replica created,
  placed or freed one event);
- hold and release of a rack, with or without drain, and a reconcile of everything;
- label moves: a node to its rack's other PDU (labels_set);
- budget changes: a rack's or PDU's cap moved within ±10 % of where it started (budget_set).

With ``--scale-out`` (and REDIS_URL), 2 ``llmgw serve``, 2 ``llmgw worker`` and ``llmgw beat`` run
alongside: scales go through the API of either web process (their reconciles queued to the workers)
and the processes above reconcile as well, as placers racing the workers.

Then the auditor's checks (bench/auditor.py): prints events, events/s, the errors the processes met,
and every violation. Exit status 1 when a violation is found. ``--plant`` writes a double booking
after the run, to show the auditor catching one.

Run: ``.venv/bin/python bench/rehearsal.py --seconds 120 --processes 4`` (≥ 1,000,000 events).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = (  # name, gpus, nodes, keep_within, most replicas
    ("r-8", 8, 1, "", 60),
    ("r-4", 4, 1, "", 120),
    ("r-2", 2, 1, "", 200),
    ("r-1", 1, 1, "", 300),
    ("r-1b", 1, 1, "", 300),
    ("r-pair", 8, 2, "rack", 30),
    ("r-cpu", 0, 1, "", 200),
)
HEARTBEATS_PER_STATEMENT = 500


def setup(nodes: int) -> None:
    """The cluster, facility settings and models (no replicas yet)."""
    from bench.placements import load_cluster
    from facility.services import settings_set
    from placement.models import Model

    load_cluster(nodes)
    settings_set(margin=0.1, gpu_watts=700, cpu_core_watts=5, node_watts=350)
    for name, gpus, count, keep_within, _ in MODELS:
        Model.objects.create(
            name=name, replicas=0, gpus=gpus, nodes=count, keep_within=keep_within, cpu_cores=4, memory_gib=32
        )


def heartbeats(cursor, node_ids: list[int], rng: random.Random) -> int:
    """Measured peaks drifting around each node's placed draw (and idle draw on empty nodes)."""
    chosen = rng.sample(node_ids, min(HEARTBEATS_PER_STATEMENT, len(node_ids)))
    cursor.execute(
        "UPDATE agents_node n SET measured_peak_watts = COALESCE(b.placed_watts, 0) * (0.6 + random() * 0.45) "
        "+ random() * 150, sensors_at = now(), last_heartbeat_at = now() "
        "FROM (SELECT id FROM agents_node WHERE id = ANY(%s) ORDER BY name FOR UPDATE) l "
        "LEFT JOIN placement_nodebooking b ON b.node_id = l.id WHERE n.id = l.id",
        [chosen],
    )
    return len(chosen)


def worker(args: tuple) -> tuple[int, dict[str, int], dict[str, int]]:
    """One process's events until its time is up: (events, counts by kind, errors by kind).

    With web processes (``webs``: their base URLs, and an operator token), a scale goes through the
    API of one of them (its reconcile queued to the workers), and this process reconciles too: a
    placer racing the workers."""
    seed, seconds, webs, token = args
    from django.db import connection, connections

    from agents.models import Node
    from agents.services import labels_set
    from facility.models import Budget, Hold
    from facility.services import budget_set, hold_create, hold_release
    from placement.models import Model
    from placement.reconcile import reconcile_all

    connections.close_all()
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    rng = random.Random(seed)
    node_ids = list(Node.objects.values_list("id", flat=True))
    nodes = list(Node.objects.values_list("name", "labels"))
    racks = sorted({labels["llmgw.io/rack"] for _, labels in nodes})
    caps = dict(Budget.objects.values_list("domain", "cap_watts"))
    events = 0
    kinds: dict[str, int] = {}
    errors: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    connection.ensure_connection()
    while time.monotonic() < deadline:
        draw = rng.random()
        try:
            if draw < 0.6:
                kind = "heartbeat"
                with connection.cursor() as cursor:
                    done = heartbeats(cursor, node_ids, rng)
            elif draw < 0.85:
                kind = "scale"
                name, gpus, count, keep_within, most = MODELS[rng.randrange(len(MODELS))]
                wanted = rng.randint(0, most)
                if webs:
                    import httpx

                    profile = {"gpus": gpus, "nodes": count, "cpu_cores": 4, "memory_gib": 32}
                    if keep_within:
                        profile["keep_within"] = keep_within
                    answer = httpx.post(
                        f"{rng.choice(webs)}/api/v1/models",
                        json={"kind": "Model", "name": name, "replicas": wanted, "profile": profile},
                        headers={"Authorization": f"Token {token}"},
                        timeout=30,
                    )
                    answer.raise_for_status()
                    kinds["web"] = kinds.get("web", 0) + 1
                else:
                    Model.objects.filter(name=name).update(replicas=wanted)
                run = reconcile_all(model_names=[name])
                done = 1 + run.created + run.placed + run.removed
            elif draw < 0.88:
                kind = "hold"
                rack = f"rack:{rng.choice(racks)}"
                if Hold.objects.filter(domain=rack).exists():
                    hold_release(domain=rack)
                else:
                    hold_create(domain=rack, reason="rehearsal", drain=rng.random() < 0.5)
                reconcile_all()
                done = 1
            elif draw < 0.94:
                kind = "label"
                name, labels = rng.choice(nodes)
                rack = labels["llmgw.io/rack"]
                labels_set(node_name=name, changes={"llmgw.io/pdu": f"{rack}-{rng.choice('ab')}"})
                done = 1
            else:
                kind = "budget"
                domain = rng.choice(sorted(caps))
                budget_set(domain=domain, cap_watts=round(caps[domain] * rng.uniform(0.9, 1.1)))
                done = 1
        except Exception as exc:  # noqa: BLE001 - counted and shown: the auditor judges the outcome
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            connection.close()
            continue
        events += done
        kinds[kind] = kinds.get(kind, 0) + done
    connections.close_all()
    return events, kinds, errors


class Fleet:
    """2 web processes, 2 Celery workers and beat on one database and Redis, as subprocesses."""

    def __init__(self, url: str, redis: str) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-rehearsal-"))
        self.env = {
            **os.environ, "DATABASE_URL": url, "REDIS_URL": redis, "LLMGW_RECONCILE_INTERVAL": "1",
            "ALLOWED_HOSTS": "127.0.0.1,localhost", "LOG_LEVEL": "WARNING", "LLMGW_DATA_DIR": str(self.dir),
        }
        self.env.pop("LLMGW_CONFIG", None)
        self.procs: list = []

    def _start(self, name: str, *argv: str) -> None:
        import subprocess

        llmgw = str(Path(sys.executable).with_name("llmgw"))
        log = open(self.dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen([llmgw, *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def start(self) -> list[str]:
        """Start them all; the web processes' base URLs once both answer."""
        import socket

        import httpx
        import redis as redis_client

        redis_client.Redis.from_url(self.env["REDIS_URL"]).flushdb()
        webs = []
        for i in range(2):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            self._start(f"web{i}", "serve", f"127.0.0.1:{port}")
            webs.append(f"http://127.0.0.1:{port}")
        for i in range(2):
            self._start(f"worker{i}", "worker", "--concurrency", "1", "--pool", "solo", "-n", f"rehearsal{i}@%h",
                        "--without-gossip", "--without-mingle", "--without-heartbeat")
        self._start("beat", "beat", "--schedule", str(self.dir / "beat-schedule"))
        deadline = time.monotonic() + 60
        for web in webs:
            while True:
                try:
                    if httpx.get(f"{web}/login/", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{web} did not start; logs in {self.dir}")
                time.sleep(0.2)
        return webs

    def stop(self) -> None:
        import signal

        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except Exception:  # noqa: BLE001 - a process that will not stop is killed
                os.killpg(proc.pid, signal.SIGKILL)
        tasks = sum((self.dir / f"worker{i}.log").read_text().count("succeeded") for i in range(2))
        print(f"fleet: 2 web processes, 2 workers ({tasks} tasks succeeded), beat; logs in {self.dir}")


def plant_double_booking(url: str) -> None:
    """A second shard on a booked card (as a broken commit would leave): for the auditor to find."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT s.node_id, s.gpu_indices, r.id FROM placement_shard s JOIN placement_replica r "
            "ON r.id <> s.replica_id WHERE jsonb_array_length(s.gpu_indices) > 0 LIMIT 1"
        ).fetchone()
        node_id, cards, other = row
        conn.execute(
            "INSERT INTO placement_shard (replica_id, node_id, gpu_indices, cpu_cores, memory_gib, draw_watts, "
            "state, restarts, message, created_at) VALUES (%s, %s, %s, 0, 0, 0, 'placed', 0, '', now())",
            (other, node_id, psycopg.types.json.Jsonb(cards)),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--database", default="llmgw_bench_rehearsal")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plant", action="store_true", help="plant a double booking before the audit")
    parser.add_argument(
        "--scale-out", action="store_true",
        help="also run 2 `llmgw serve`, 2 `llmgw worker` and `llmgw beat` on REDIS_URL; scales go through the API",
    )
    args = parser.parse_args()

    from bench import auditor
    from bench.placements import bench_database

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    url = bench_database(base, args.database)
    os.environ["DATABASE_URL"] = url
    redis = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if args.scale_out:
        os.environ["REDIS_URL"] = redis  # changes queue reconciles for the workers, as in production
    else:
        os.environ.pop("REDIS_URL", None)  # reconciles run in these processes, none is queued
    os.environ["LLMGW_DB_POOL"] = "false"  # forked processes: no pooled connection crosses a fork
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    setup(args.nodes)
    auditor.install(url, fresh_seconds=settings.LLMGW_MEASURED_FRESH_SECONDS)
    from django.db import connections

    webs: list[str] = []
    token = ""
    fleet = None
    if args.scale_out:
        from llmgw.users_cli import token_create

        token = token_create(username="rehearsal", role="operator")
        fleet = Fleet(url, redis)
        webs = fleet.start()
    connections.close_all()
    import multiprocessing

    started = time.perf_counter()
    try:
        with multiprocessing.get_context("fork").Pool(args.processes) as pool:
            results = pool.map(
                worker, [(args.seed * 1000 + i, args.seconds, webs, token) for i in range(args.processes)]
            )
    finally:
        if fleet is not None:
            fleet.stop()
    wall = time.perf_counter() - started
    events = sum(r[0] for r in results)
    kinds: dict[str, int] = {}
    errors: dict[str, int] = {}
    for _, k, e in results:
        for key, value in k.items():
            kinds[key] = kinds.get(key, 0) + value
        for key, value in e.items():
            errors[key] = errors.get(key, 0) + value
    print(
        f"{events:,} events in {wall:.1f} s from {args.processes} processes: {events / wall:,.0f} events/s "
        f"({', '.join(f'{k} {v:,}' for k, v in sorted(kinds.items()))}); errors met: {errors or 'none'}"
    )
    if args.plant:
        plant_double_booking(url)
    t0 = time.perf_counter()
    found = auditor.violations(url)
    print(
        f"auditor: {auditor.logged_commits(url):,} logged domain post-states checked in "
        f"{time.perf_counter() - t0:.1f} s; violations: {len(found)}"
    )
    for kind, detail in found[:50]:
        print(f"  {kind}: {detail}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
