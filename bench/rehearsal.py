"""A rehearsal: many events from several processes against PostgreSQL, then the independent auditor.

Makes its own database (``--database``, default ``llmgw_bench_rehearsal``, on the server of
DATABASE_URL), loads ``--nodes`` ready nodes × 8 GPUs in racks of 25 with budgets on every rack and PDU
(bench/placements.py's cluster), installs the auditor's commit log (bench/auditor.sql), then runs
``--processes`` processes until ``--events`` events all together or ``--seconds`` each (a progress line
every 10 s), drawing events at random (KINDS' weights; each process makes every kind once first):

- heartbeats with drifting power, as a busy web process receives them: 500 nodes' readings buffered
  and written in one statement by the readings batch (agents.readings), each node one event;
- scale (place and free): one or two models' replicas set anew, then their reconcile as a request
  makes it (at most 100 placements, the rest queued); each model's change and each replica created,
  placed (in batches of up to 128 per transaction) or freed one event;
- hold and release of a rack, with or without drain;
- label moves: a node to its rack's other PDU, or into another rack (labels_set);
- budget changes: a rack's or PDU's cap moved within ±10 % of where it started (budget_set);
- the reconcile those changes ask for, queued as on workers: run by the process when asked (at most
  every 2 s), one process at a time (the workers' advisory lock); each replica it places or frees one
  event.

With ``--scale-out`` (and REDIS_URL), 2 ``llmgw serve``, 2 ``llmgw worker`` and ``llmgw beat`` run
alongside: scales go through the API of either web process, changes queue their reconciles to the
workers, and the processes above reconcile as well, as placers racing the workers.

Then the auditor's checks (bench/auditor.py): prints events, events/s, each kind's count and process
seconds, the errors the processes met, and every violation. Exit status 1 when a violation is found.
``--plant`` writes a double booking after the run, to show the auditor catching one.

Run: ``.venv/bin/python bench/rehearsal.py --events 1000000 --processes 4``.
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
# Heartbeats written together, as the server's readings batch does (agents.readings: a busy web process
# gathers every node heard within FLUSH_SECONDS and writes them in one UPDATE … FROM (VALUES …)).
HEARTBEATS_PER_BATCH = 500
# Models one scale event changes together (an apply of several models), reconciled in one run.
MOST_MODELS_PER_SCALE = 2
# Every tenth node may be moved into another rack (a label move); a model kept within a rack is not
# placed on them (their label, its selector).
MOVABLE, MOVABLE_EVERY = ("pool", "movable"), 10
KEPT_SELECTOR = f"{MOVABLE[0]}!={MOVABLE[1]}"
# Without workers, a change's reconcile is queued (noted) and this process runs it, at most this often:
# the single-flight worker's pace (a reconcile asked while one runs goes again 2 s later).
RECONCILE_GAP_SECONDS = 2.0
# Each kind's share of the draws. Heartbeats are the steady load of a real fleet (1,000 nodes at 10 s
# send 100 a second; changes come a few a minute): here changes come far faster than that, while
# heartbeats still take about a third of the processes' time (see "process seconds by kind").
KINDS = (("heartbeat", 0.8), ("scale", 0.12), ("hold", 0.02), ("label", 0.03), ("budget", 0.03))
KIND_NAMES = [name for name, _ in KINDS]
KIND_WEIGHTS = [weight for _, weight in KINDS]
# How often the parent prints progress.
PROGRESS_SECONDS = 10.0

_counter = None  # events so far, all processes together (a multiprocessing.Value, inherited by fork)


def setup(nodes: int) -> None:
    """The cluster, facility settings and models (no replicas yet)."""
    from bench.placements import load_cluster
    from facility.services import settings_set
    from placement.models import Model

    load_cluster(nodes)
    settings_set(margin=0.1, gpu_watts=700, cpu_core_watts=5, node_watts=350)
    from agents.models import Node
    from agents.services import labels_set

    for name in Node.objects.order_by("name").values_list("name", flat=True)[::MOVABLE_EVERY]:
        labels_set(node_name=name, changes={MOVABLE[0]: MOVABLE[1]})
    for name, gpus, count, keep_within, _ in MODELS:
        Model.objects.create(
            name=name, replicas=0, gpus=gpus, nodes=count, keep_within=keep_within, cpu_cores=4, memory_gib=32,
            # A node moved to another rack would split a replica kept within its rack (the auditor's
            # check 4): the movable nodes are not for those models.
            node_selector=KEPT_SELECTOR if keep_within else "",
        )


class Rehearser:
    """One process's events: each kind a method that does it and says how many events it was."""

    def __init__(self, rng: random.Random, webs: list[str], token: str):
        from agents import readings
        from agents.models import Node
        from facility.models import Budget

        self.rng, self.webs, self.token = rng, webs, token
        # Models whose reconcile failed (reconcile_all logs it and goes on): shown among the errors met.
        self.failed_reconciles = 0
        rows = list(Node.objects.values_list("id", "name", "labels", "report_digest"))
        self.nodes = [(name, labels) for _, name, labels, _ in rows]
        self.digests = {name: digest for _, name, _, digest in rows}
        self.ids = {name: node_id for node_id, name, _, _ in rows}
        self.names = sorted(self.ids)
        self.racks = sorted({labels["llmgw.io/rack"] for _, labels in self.nodes})
        self.movable = [(name, labels) for name, labels in self.nodes if labels.get(MOVABLE[0]) == MOVABLE[1]]
        self.caps = dict(Budget.objects.values_list("domain", "cap_watts"))
        for name, digest in self.digests.items():
            # What each node's first (full) heartbeat left: its next same heartbeat takes the fast path.
            readings.remember(name, digest)
        self.first = self.rng.sample(KIND_NAMES, len(KIND_NAMES))
        self.asked = False  # a change asked for a reconcile (queued, as on workers)
        self.reconciled_at = time.monotonic()

    def heartbeat(self) -> tuple[str, int]:
        """A batch of nodes' heartbeats, power drifting around what is placed on each (idle draw on empty
        nodes), through the server's readings batch: buffered one by one, written in one statement."""
        from django.db import connection
        from django.utils import timezone

        from agents import readings
        from agents.services import measured_watts

        chosen = self.rng.sample(self.names, min(HEARTBEATS_PER_BATCH, len(self.names)))
        with connection.cursor() as cursor:
            # What the simulated nodes draw follows what is placed on them (one array parameter).
            cursor.execute(
                "SELECT node_id, placed_watts FROM placement_nodebooking WHERE node_id = ANY(%s)",
                [[self.ids[n] for n in chosen]],
            )
            placed = dict(cursor.fetchall())
        now = timezone.now()
        for name in chosen:
            watts = placed.get(self.ids[name], 0.0) * (0.6 + self.rng.random() * 0.45) + self.rng.random() * 150
            sensors = {"gpus": [{"index": i, "power_watts": round(watts / 8, 1)} for i in range(8)]}
            readings.buffer_readings(
                name, self.digests[name], at=now, sensors=sensors, watts=measured_watts(sensors), interval=3600
            )
        return "heartbeat", readings.flush()

    def scale(self) -> tuple[str, int]:
        """Several models' replicas set anew at once, then their reconcile: each model's change and each
        replica created, placed or freed one event. Through a web process's API when there are some."""
        from placement.models import Model
        from placement.reconcile import REQUEST_PLACEMENTS, reconcile_all

        chosen = self.rng.sample(MODELS, self.rng.randint(1, MOST_MODELS_PER_SCALE))
        for name, gpus, count, keep_within, most in chosen:
            wanted = self.rng.randint(0, most)
            if self.webs:
                self._scale_by_api(name, gpus, count, keep_within, wanted)
            else:
                Model.objects.filter(name=name).update(replicas=wanted)
        # Their reconcile as a request makes it: at most REQUEST_PLACEMENTS placed here, the rest queued.
        run = reconcile_all(model_names=[m[0] for m in chosen], max_placements=REQUEST_PLACEMENTS)
        self.failed_reconciles += run.failed
        if run.unfinished:
            self.asked = True
        return "scale", len(chosen) + run.created + run.placed + run.removed

    def _scale_by_api(self, name: str, gpus: int, count: int, keep_within: str, wanted: int) -> None:
        import httpx

        profile = {"gpus": gpus, "nodes": count, "cpu_cores": 4, "memory_gib": 32}
        if keep_within:
            profile["keep_within"] = keep_within
            profile["node_selector"] = KEPT_SELECTOR  # as the model was made: off the movable nodes
        answer = httpx.post(
            f"{self.rng.choice(self.webs)}/api/v1/models",
            json={"kind": "Model", "name": name, "replicas": wanted, "profile": profile},
            headers={"Authorization": f"Token {self.token}"},
            timeout=30,
        )
        answer.raise_for_status()

    def hold(self) -> tuple[str, int]:
        """A rack held (with or without drain), or its hold released."""
        from facility.models import Hold
        from facility.services import hold_create, hold_release

        rack = f"rack:{self.rng.choice(self.racks)}"
        if Hold.objects.filter(domain=rack).exists():
            hold_release(domain=rack)
        else:
            hold_create(domain=rack, reason="rehearsal", drain=self.rng.random() < 0.5)
        return "hold", 1

    def label(self) -> tuple[str, int]:
        """A node moved to one of its rack's PDUs (its other one, or the same again), or, one time in
        four, a movable node into another rack and one of that rack's PDUs (from outside the domains a
        commit into them locks); it comes back by a later move."""
        from agents.services import labels_set

        if self.rng.random() < 0.75:
            name, labels = self.rng.choice(self.nodes)
            rack = labels["llmgw.io/rack"]
        else:
            name, labels = self.rng.choice(self.movable)
            rack = self.rng.choice(self.racks)
        labels_set(node_name=name, changes={"llmgw.io/rack": rack, "llmgw.io/pdu": f"{rack}-{self.rng.choice('ab')}"})
        return "label", 1

    def budget(self) -> tuple[str, int]:
        """A rack's or PDU's cap moved within ±10 % of where it started."""
        from facility.services import budget_set

        domain = self.rng.choice(sorted(self.caps))
        budget_set(domain=domain, cap_watts=round(self.caps[domain] * self.rng.uniform(0.9, 1.1)))
        return "budget", 1

    def reconcile_due(self) -> bool:
        return self.asked and time.monotonic() - self.reconciled_at >= RECONCILE_GAP_SECONDS

    def reconcile(self) -> tuple[str, int]:
        """The queued reconcile: every model, drains included; each replica created, placed or freed one
        event. One at a time across the processes, as on workers (placement.tasks.reconcile's advisory
        lock); when another process holds it, asked again after RECONCILE_GAP_SECONDS."""
        from django.db import connection

        from placement.reconcile import reconcile_all
        from placement.tasks import RECONCILE_LOCK

        self.reconciled_at = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK])
            if not cursor.fetchone()[0]:
                return "reconcile", 0
        self.asked = False
        try:
            run = reconcile_all()
            self.failed_reconciles += run.failed
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [RECONCILE_LOCK])
            self.reconciled_at = time.monotonic()
        return "reconcile", run.created + run.placed + run.removed

    def draw(self):
        """The next event: the queued reconcile when due, else one at random by KINDS' weights."""
        if self.reconcile_due():
            return self.reconcile
        if self.first:  # each kind once first, so that even a short run has them all
            return getattr(self, self.first.pop())
        return getattr(self, self.rng.choices(KIND_NAMES, KIND_WEIGHTS)[0])


def queue_reconciles_for(rehearser: Rehearser) -> None:
    """Without workers (no REDIS_URL) a change would reconcile inside the call that made it (the embedded
    default); on PostgreSQL with workers it is queued and one worker reconciles for every change since.
    The latter is production's: each change asks, and the rehearser runs the asked reconcile."""
    from placement import tasks

    def ask() -> None:
        rehearser.asked = True

    tasks._enqueue = ask  # request_reconcile's on_commit hook; one ask per transaction, as before


def worker(args: tuple) -> tuple[int, dict[str, int], dict[str, int], dict[str, float]]:
    """One process's events until its time is up or all processes together reached the events wanted:
    (events, counts by kind, errors by kind, seconds by kind).

    With web processes (``webs``: their base URLs, and an operator token), a scale goes through the
    API of one of them (its reconcile queued to the workers), and this process reconciles too: a
    placer racing the workers."""
    seed, seconds, wanted, webs, token = args
    from django.db import connection, connections

    connections.close_all()
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    rehearser = Rehearser(random.Random(seed), webs, token)
    if not webs:
        queue_reconciles_for(rehearser)
    events = 0
    kinds: dict[str, int] = {}
    spent: dict[str, float] = {}
    errors: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    connection.ensure_connection()
    while time.monotonic() < deadline and (wanted is None or _counter.value < wanted):
        event = rehearser.draw()
        began = time.perf_counter()
        try:
            kind, done = event()
        except Exception as exc:  # noqa: BLE001 - counted and shown: the auditor judges the outcome
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            connection.close()
            continue
        spent[kind] = spent.get(kind, 0.0) + time.perf_counter() - began
        events += done
        kinds[kind] = kinds.get(kind, 0) + done
        with _counter.get_lock():
            _counter.value += done
    connections.close_all()
    if rehearser.failed_reconciles:
        errors["a model's reconcile failed"] = rehearser.failed_reconciles
    return events, kinds, errors, spent


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
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default 120 s without --events)")
    parser.add_argument("--events", type=int, default=None, help="stop once the processes together made this many events")
    parser.add_argument("--database", default="llmgw_bench_rehearsal")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plant", action="store_true", help="plant a double booking before the audit")
    parser.add_argument(
        "--scale-out", action="store_true",
        help="also run 2 `llmgw serve`, 2 `llmgw worker` and `llmgw beat` on REDIS_URL; scales go through the API",
    )
    args = parser.parse_args()
    seconds = args.seconds if args.seconds is not None else (1e9 if args.events else 120.0)

    from bench import auditor
    from bench.placements import bench_database

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    url = bench_database(base, args.database)
    os.environ["DATABASE_URL"] = url
    redis = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if args.scale_out:
        os.environ["REDIS_URL"] = redis  # changes queue reconciles for the workers, as in production
    else:
        os.environ.pop("REDIS_URL", None)  # no workers: the processes run the reconciles changes ask for
    os.environ["LLMGW_DB_POOL"] = "false"  # forked processes: no pooled connection crosses a fork
    # A node's measured peak is the highest reading of this window: short enough that the drift is felt
    # both ways within a run (the default 15 minutes would only ratchet up).
    os.environ.setdefault("LLMGW_MEASURED_WINDOW_SECONDS", "30")
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
    results, wall = rehearse(args, seconds, webs, token, fleet)
    report(args, results, wall, url)


def rehearse(args, seconds: float, webs: list[str], token: str, fleet) -> tuple[list, float]:
    """The processes' events, with a progress line every PROGRESS_SECONDS: (their results, wall seconds)."""
    global _counter
    import multiprocessing

    context = multiprocessing.get_context("fork")
    _counter = context.Value("q", 0)  # before the pool: its processes inherit it
    started = time.perf_counter()
    try:
        with context.Pool(args.processes) as pool:
            pending = pool.map_async(
                worker, [(args.seed * 1000 + i, seconds, args.events, webs, token) for i in range(args.processes)]
            )
            while not pending.ready():
                pending.wait(PROGRESS_SECONDS)
                so_far, elapsed = _counter.value, time.perf_counter() - started
                print(f"  {elapsed:6.0f} s: {so_far:,} events, {so_far / elapsed:,.0f} events/s; load {_load()}",
                      flush=True)
            results = pending.get()
    finally:
        if fleet is not None:
            fleet.stop()
    return results, time.perf_counter() - started


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def report(args, results: list, wall: float, url: str) -> None:
    """The figures, then the auditor's verdict; exit status 1 when it found a violation."""
    from bench import auditor

    events = sum(r[0] for r in results)
    kinds: dict[str, int] = {}
    errors: dict[str, int] = {}
    spent: dict[str, float] = {}
    for _, k, e, t in results:
        for into, part in ((kinds, k), (errors, e), (spent, t)):
            for key, value in part.items():
                into[key] = into.get(key, 0) + value
    print(
        f"{events:,} events in {wall:.1f} s from {args.processes} processes: {events / wall:,.0f} events/s "
        f"({', '.join(f'{k} {v:,}' for k, v in sorted(kinds.items()))}); errors met: {errors or 'none'}"
    )
    print(
        "process seconds by kind: " + ", ".join(f"{k} {v:,.1f}" for k, v in sorted(spent.items()))
        + f"; load average {_load()}"
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
