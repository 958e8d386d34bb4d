"""A 1,000-node site joining at once, as deployed: PostgreSQL, Redis, 2 web processes, a worker, the conditions
worker and beat, the nodes' agents simulated by `llmgw sim up`, the console open in Chromium.

Makes its own database (``--database``, default ``llmgw_bench_join``, on the server of DATABASE_URL) and
empties its Redis database (``--redis``, default redis://127.0.0.1:6379/7). The site is bench/console.py's —
40 racks in 2 rooms, 25 nodes of 8 × H200 a rack, each rack's nodes on its A and B PDUs — with budgets on
every rack and PDU, a three-phase feed per PDU, conditions in observe mode with capping and shedding on,
one rack replayed hot and one warm, and 5 models of 1,050 replicas in all. No node has joined when it starts:

- it starts ``llmgw serve`` twice (two ports), ``llmgw worker``, ``llmgw worker --queues conditions`` and
  ``llmgw beat``, then two ``llmgw sim up --interval 10`` (half the nodes each, one a web process);
- in Chromium it loads the Facility page over and over (every ``--every`` seconds) while the nodes join and
  after; once all are ready it opens the Nodes page beside it and counts what its socket receives a minute
  over ``--seconds`` (payloads as sent), the nodes beating on;
- every poll it counts the ready nodes (the Nodes page's rule) and the age of the oldest condition judgement.

It prints the time from the first heartbeat to every node ready, the fewest ready after that, the heartbeats
refused (each ``sim up``'s count by status at its end), the Facility page's load event p50/p99 during the
join and after, the Nodes socket's bytes a minute, the oldest judgement's age (worst seen and at the end),
exceptions in the processes' logs, and the load average. Every process it starts is stopped at its end,
Ctrl-C or failure included. Run: ``.venv/bin/python bench/join.py`` (``--nodes``, ``--after``,
``--timeout``). Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.console import PASSWORD, SCENARIO, cluster_yaml, rack_names, server_yaml  # noqa: E402
from bench.facility_browser import CHROMIUM, free_port  # noqa: E402
from bench.placements import bench_database, percentile  # noqa: E402

INTERVAL = 10  # the heartbeat interval the nodes say and keep (the protocol's longest)

# 5 models, 1,050 replicas, 3,550 of the 8,000 GPUs.
MODELS = "---\n".join(
    textwrap.dedent(f"""\
        kind: Model
        name: {name}
        replicas: {replicas}
        profile: {{gpus: {gpus}, cpu_cores: {gpus * 2}, memory_gib: {gpus * 32}, min_ready_seconds: 0, command: "serve {{model}} --port {{port}}"}}
        """)
    for name, replicas, gpus in (
        ("llama-70b", 200, 8), ("mixtral-8x22b", 300, 4), ("qwen-32b", 200, 2), ("embed-small", 250, 1),
        ("coder-7b", 100, 1),
    )
)

LOAD_TIMEOUT_MS = 60_000  # a Facility page load given up after this (counted at it)

TIMING = """() => {
  const n = performance.getEntriesByType('navigation')[0];
  return {load: n.loadEventEnd, ttfb: n.responseStart};
}"""


def site_yaml(nodes: int) -> str:
    """bench/console.py's budgets, a three-phase feed per PDU, shedding on."""
    feeds = "".join(
        f"    - {{name: F-{rack}-{side}, voltage: 415, amperage: 125, phase: three, pdus: [{rack}-{side}]}}\n"
        for _, _, rack in rack_names(nodes) for side in "ab"
    )
    text = server_yaml(nodes).replace("  capping:\n    enabled: true\n",
                                      "  capping:\n    enabled: true\n  shedding:\n    enabled: true\n")
    return text + f"  feeds:\n{feeds}"


def prepare(args, work: Path) -> dict[str, str]:
    """The bench database and Redis database, empty of nodes: the site, the models, the scenario, the nodes'
    tokens (tokens.json, for the sims) and a console user; the environment the processes run in."""
    import redis

    url = bench_database(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw"), args.database)
    redis.Redis.from_url(args.redis).flushdb()
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": args.redis, "LLMGW_DATA_DIR": str(work),
           "ALLOWED_HOSTS": "127.0.0.1,localhost", "LOG_LEVEL": "WARNING"}
    for key in ("LLMGW_CONFIG", "DJANGO_SETTINGS_MODULE", "LLMGW_URL", "LLMGW_TOKEN"):
        env.pop(key, None)
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "LLMGW_DATA_DIR", "ALLOWED_HOSTS")})
    os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw.settings"
    # The bench reads the database between Chromium's steps, from the thread Playwright's loop runs in.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from agents.services import node_token_create
    from facility.services import facility_apply, scenario_start
    from llmgw.users import user_create
    from placement.services import models_apply

    facility_apply(text=site_yaml(args.nodes), confirm=True)
    models_apply(text=MODELS)
    scenario_start(data=SCENARIO, speed=10.0)
    user_create(username="bench", role="operator", password=PASSWORD)
    names = [f"gpu{i:05}" for i in range(args.nodes)]
    (work / "tokens.json").write_text(json.dumps({name: node_token_create(node_name=name) for name in names}))
    cluster = cluster_yaml(args.nodes).split("  - name: ")
    half = 1 + args.nodes // 2
    (work / "cluster-1.yaml").write_text("  - name: ".join(cluster[:half]))
    (work / "cluster-2.yaml").write_text("  - name: ".join([cluster[0], *cluster[half:]]))
    from django.db import connection

    connection.close()
    return env


class Processes:
    """The processes the bench starts, each the leader of its own process group (a Celery worker's pool, a
    server's children go with it), stopped in reverse order however the bench ends."""

    def __init__(self, work: Path, env: dict[str, str]):
        self.work, self.env = work, env
        self.started: list[tuple[str, subprocess.Popen]] = []
        self.llmgw = shutil.which("llmgw", path=str(Path(sys.executable).parent)) or "llmgw"

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        log = (self.work / f"{name}.log").open("w")
        process = subprocess.Popen([self.llmgw, *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.started.append((name, process))
        return process

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")

    def stop(self, name: str, sig: int = signal.SIGTERM, wait: float = 30.0) -> None:
        for own, process in self.started:
            if own == name:
                self._stop(process, sig, wait)

    @staticmethod
    def _stop(process: subprocess.Popen, sig: int, wait: float) -> None:
        if process.poll() is None:
            try:  # the leader alone: a worker ends its pool's jobs and children itself (a warm shutdown)
                os.kill(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        try:  # what is left of its group (a pool's child, a server's worker), and the leader if it lingered
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def stop_all(self) -> None:
        for _, process in reversed(self.started):
            self._stop(process, signal.SIGTERM, 20.0)


def cpu_by_session() -> dict[int, float]:
    """CPU seconds (user + system) of every running process, summed by its session; postgres' and
    redis-server's by their names (negative keys: -1, -2), as they are not the bench's."""
    tick = os.sysconf("SC_CLK_TCK")
    totals: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone since listed
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        session, used = int(fields[3]), (int(fields[11]) + int(fields[12])) / tick
        key = -1 if name.startswith("postgres") else -2 if name.startswith("redis-server") else session
        totals[key] = totals.get(key, 0.0) + used
    return totals


def wait_serving(base: str, process: subprocess.Popen, log: Path) -> None:
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{base}/login/", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"llmgw serve at {base} did not start: {log.read_text()[-3000:]}")
        time.sleep(0.5)


def site_state() -> tuple[int, float | None]:
    """(nodes ready now, the age in seconds of the oldest condition judgement; None before the first)."""
    from django.db import connection
    from django.db.models import Min
    from django.utils import timezone

    from agents.filtersets import node_state_lines
    from agents.models import Node
    from facility.models import DomainCondition

    try:
        ready = sum(1 for line in node_state_lines(Node.objects.all()) if line.state == "ready")
        oldest = DomainCondition.objects.aggregate(at=Min("evaluated_at"))["at"]
    finally:
        connection.close()
    return ready, None if oldest is None else (timezone.now() - oldest).total_seconds()


def log_counts(text: str) -> dict[str, int]:
    return {
        "Traceback": text.count("Traceback"), "PoolTimeout": text.count("PoolTimeout"),
        "over capacity": text.count("over capacity"), "readings not written": text.count("readings not written"),
        "ERROR": sum(1 for line in text.splitlines() if " ERROR " in line or line.startswith("ERROR")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--database", default="llmgw_bench_join", help="the bench's PostgreSQL database (dropped first)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/7", help="the bench's Redis database (emptied first)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up waiting for every node ready after this")
    parser.add_argument("--after", type=float, default=120.0, help="seconds measured once every node is ready")
    parser.add_argument("--seconds", type=float, default=60.0, help="the Nodes socket counted this long")
    parser.add_argument("--every", type=float, default=5.0, help="a Facility page load every this many seconds")
    args = parser.parse_args()
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", args.database):
        raise SystemExit(f"--database: {args.database!r} is not a plain lower-case name")
    # Ctrl-C (and a TERM) end the bench through its finally, which stops every process it started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-join-"))
    env = prepare(args, work)
    processes = Processes(work, env)
    ports = [free_port(), free_port()]
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    figures: dict = {"loads_join": [], "loads_after": [], "oldest": [], "least_ready_after": None}
    tallies: list[str] = []
    figures["cpu_before"] = cpu_by_session()
    try:
        for i, port in enumerate(ports, 1):
            processes.start(f"web-{i}", "serve", f"127.0.0.1:{port}")
        processes.start("worker", "worker", "--concurrency", "2", "--hostname", "worker@%h")
        processes.start("conditions", "worker", "--queues", "conditions", "--concurrency", "1",
                        "--hostname", "conditions@%h")
        processes.start("beat", "beat", "--schedule", str(work / "celerybeat-schedule"))
        for i, (base, (_, process)) in enumerate(zip(bases, processes.started[:2], strict=True), 1):
            wait_serving(base, process, work / f"web-{i}.log")
        try:
            run(args, processes, bases, work, figures)
        except Exception:  # the figures so far are still reported
            traceback.print_exc()
    finally:
        figures["cpu_after"] = cpu_by_session()
        for i in (1, 2):
            processes.stop(f"sim-{i}", signal.SIGINT, 30.0)  # it prints its count of answers as it ends
            if (work / f"sim-{i}.log").exists():
                tallies += [line for line in processes.log(f"sim-{i}").splitlines() if " heartbeats: " in line][-1:]
        processes.stop_all()
    report(args, work, figures, tallies, processes)


def run(args, processes: Processes, bases: list[str], work: Path, figures: dict) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(base_url=bases[0], viewport={"width": 1440, "height": 900})
            facility = context.new_page()
            facility.set_default_timeout(LOAD_TIMEOUT_MS)
            facility.goto("/login/")
            facility.fill("input[name=username]", "bench")
            facility.fill("input[name=password]", PASSWORD)
            facility.click("button[type=submit]")
            facility.wait_for_url("**/nodes/")
            facility.goto("/facility/")  # warm: the first render, the browser's cache of static files
            for i in (1, 2):
                processes.start(f"sim-{i}", "sim", "up", "-f", str(work / f"cluster-{i}.yaml"), "--server",
                                bases[i - 1], "--interval", str(INTERVAL), "--tokens", str(work / "tokens.json"))
            started = time.monotonic()
            all_ready_at = None
            nodes_page = frames = None
            counting_from = None
            while True:
                at = time.monotonic()
                try:
                    facility.goto("/facility/", wait_until="load")
                    load = facility.evaluate(TIMING)["load"]
                except PlaywrightTimeout:  # counted as a load that took the whole timeout
                    load = LOAD_TIMEOUT_MS
                    figures["loads_timed_out"] = figures.get("loads_timed_out", 0) + 1
                ready, oldest = site_state()
                if oldest is not None:
                    figures["oldest"].append(oldest)
                elapsed = time.monotonic() - started
                (figures["loads_after"] if all_ready_at else figures["loads_join"]).append(load)
                print(f"{elapsed:6.0f} s: {ready:5} ready; Facility page {load:6.0f} ms; oldest judgement "
                      f"{'-' if oldest is None else f'{oldest:.0f} s'}", flush=True)
                if all_ready_at is None and ready >= args.nodes:
                    all_ready_at = elapsed
                    figures["all_ready"] = elapsed
                elif all_ready_at is not None:
                    least = figures["least_ready_after"]
                    figures["least_ready_after"] = ready if least is None else min(least, ready)
                if all_ready_at is None and elapsed > args.timeout and "ready_at_timeout" not in figures:
                    figures["ready_at_timeout"] = ready
                if nodes_page is None and (all_ready_at is not None or "ready_at_timeout" in figures):
                    # Every node ready, or the wait given up: the Nodes page, as the site stands, beside the other.
                    nodes_page, frames = open_nodes(context)
                    counting_from = time.monotonic() + 10  # the renders after connecting are not the steady state
                if counting_from is not None and time.monotonic() >= counting_from and "counting" not in figures:
                    frames.clear()
                    figures["counting"] = time.monotonic()
                if "counting" in figures and "socket" not in figures and \
                        time.monotonic() - figures["counting"] >= args.seconds:
                    seconds = time.monotonic() - figures["counting"]
                    figures["socket"] = (sum(frames) / 1024 / (seconds / 60), len(frames) / (seconds / 60))
                after = elapsed - all_ready_at if all_ready_at is not None else None
                if "socket" in figures and ("ready_at_timeout" in figures or after >= args.after):
                    break
                time.sleep(max(0.0, args.every - (time.monotonic() - at)))
            if nodes_page is not None:
                nodes_page.close()
        finally:
            browser.close()


def open_nodes(context):
    """The Nodes page (its first page of rows), with every frame its socket receives counted."""
    frames: list[int] = []
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.on("websocket", lambda ws: ws.on(
        "framereceived", lambda payload: frames.append(len(payload.encode() if isinstance(payload, str) else payload))
    ))
    page.goto("/nodes/", wait_until="load")
    page.wait_for_function("document.getElementById('live-status')?.dataset.state === 'open'")
    return page, frames


def report(args, work: Path, figures: dict, tallies: list[str], processes: Processes) -> None:
    load = os.getloadavg()
    join, after = figures["loads_join"], figures["loads_after"]

    def loads(values: list[float]) -> str:
        if not values:
            return "none"
        return f"p50 {percentile(values, 0.5):.0f} ms, p99 {percentile(values, 0.99):.0f} ms ({len(values)} loads)"

    print(f"\n{args.nodes} nodes joining through 2 × llmgw sim up (every {INTERVAL} s) into PostgreSQL and Redis, "
          f"2 web processes, a worker, the conditions worker and beat (work dir {work}):")
    if "all_ready" in figures:
        print(f"  every node ready {figures['all_ready']:.0f} s after the first heartbeat; the fewest ready after "
              f"that: {figures['least_ready_after']}")
    else:
        print(f"  not every node ready within {args.timeout:.0f} s: {figures.get('ready_at_timeout')} ready")
    print(f"  heartbeats: {' | '.join(tallies) or 'no count (a sim did not end cleanly)'}")
    print(f"  Facility page load event: while joining {loads(join)}; after {loads(after)}; given up after "
          f"{LOAD_TIMEOUT_MS / 1000:.0f} s (counted at it): {figures.get('loads_timed_out', 0)}")
    socket = figures.get("socket")
    print("  Nodes page socket: " + (f"{socket[0]:.1f} KiB a minute ({socket[1]:.0f} frames a minute), "
                                     f"{args.nodes} nodes beating" if socket else "not measured"))
    oldest = figures["oldest"]
    print("  oldest condition judgement: " + (f"{max(oldest):.0f} s at worst, {oldest[-1]:.0f} s at the end"
                                              if oldest else "none judged"))
    for name, _ in processes.started:
        counts = log_counts(processes.log(name))
        if any(counts.values()):
            print(f"  {name}.log: {counts}")
    before, after = figures["cpu_before"], figures["cpu_after"]
    used = {name: after.get(process.pid, 0.0) for name, process in processes.started}
    used["postgres"] = after.get(-1, 0.0) - before.get(-1, 0.0)
    used["redis"] = after.get(-2, 0.0) - before.get(-2, 0.0)
    used["bench and Chromium"] = after.get(os.getsid(0), 0.0) - before.get(os.getsid(0), 0.0)
    print("  CPU seconds used, by process: " + ", ".join(f"{name} {seconds:.0f}" for name, seconds in used.items()))
    print(f"  load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
