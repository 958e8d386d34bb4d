"""The console at 1,000 simulated nodes in 40 racks, in Chromium: what a facility engineer's browser pays.

Makes its own database (``llmgw_bench_console`` on the server of DATABASE_URL), applies a facility of 2
rooms, 8 rows and 40 racks (25 nodes each, a rack's nodes on its A and B PDUs), budgets on every rack and
PDU, conditions in observe mode with capping on, two racks' inlet air replayed warm and hot, three models;
the 1,000 nodes join through the heartbeat service, then 48 h of history is written. It starts ``llmgw
serve`` on it, and the simulated agents (agents.simulator: every node posting a heartbeat through the real
API every ``--interval`` seconds, 20 by default (each saying 10 s, the protocol's longest, so it stays
ready): what one embedded server on a shared two-core machine carries; the figure says how many went through). Then in Chromium (Playwright, Debian's /usr/bin/chromium,
1440×900) it loads the Facility and the Models page ``--runs`` times each:

- page bytes (the HTML document, decoded), elements and height, time to the load event;
- at steady state, with the page open and the nodes beating: bytes the live socket received a minute
  (payloads as sent, before any compression), over ``--seconds``;
- long tasks (a PerformanceObserver of ``longtask`` from the first byte): the longest, and how many
  passed 200 ms, during the loads and during the steady state;
- the server's log: exceptions (``Traceback``, ``KeyError``, ``ERROR``).

Targets of the issue: a page ≤ 1.5 MB, ≤ 1 s to the load event, ≤ 200 KB a minute on the socket, no long
task over 200 ms. Run: ``.venv/bin/python bench/console.py`` (``--runs``, ``--seconds``, ``--nodes``,
``--interval``; ``--reuse`` keeps the database a run before made). Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.facility_browser import CHROMIUM, free_port  # noqa: E402
from bench.placements import bench_database, percentile  # noqa: E402

BENCH_DB = "llmgw_bench_console"
PASSWORD = "bench-pass-9"
NODES_PER_RACK = 25
RACKS_PER_ROW = 5
ROWS_PER_ROOM = 4
HOT_RACK = "a1-02"
WARM_RACK = "b2-03"

# From the first byte: every long task the page runs (its parse, htmx binding, live swaps).
LONG_TASKS = """
window.__longTasks = [];
try {
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) { window.__longTasks.push(e.duration); }
  }).observe({type: "longtask", buffered: true});
} catch (e) {}
"""
TIMING = """() => {
  const n = performance.getEntriesByType('navigation')[0];
  return {load: n.loadEventEnd, ttfb: n.responseStart, bytes: n.decodedBodySize, transfer: n.transferSize,
          elements: document.getElementsByTagName('*').length, height: document.documentElement.scrollHeight,
          long: window.__longTasks.slice()};
}"""


def rack_names(nodes: int) -> list[tuple[str, str, str]]:
    """(room, row, rack) of each rack, in physical order: hall-a rows a1..a4, hall-b rows b1..b4."""
    out = []
    for i in range(max(1, nodes // NODES_PER_RACK)):
        room = "ab"[min(i // (RACKS_PER_ROW * ROWS_PER_ROOM), 1)]
        row = f"{room}{i // RACKS_PER_ROW % ROWS_PER_ROOM + 1}"
        out.append((f"hall-{room}", row, f"{row}-{i % RACKS_PER_ROW + 1:02}"))
    return out


def cluster_yaml(nodes: int) -> str:
    """The simulated cluster: 8 × H200 per node, a rack's nodes alternating on its A and B PDUs."""
    racks = rack_names(nodes)
    lines = ["nodes:"]
    for i in range(nodes):
        room, row, rack = racks[min(i // NODES_PER_RACK, len(racks) - 1)]
        lines += [
            f"  - name: gpu{i:05}",
            "    gpus: 8",
            "    gpu_model: H200-SXM5-141GB",
            "    gpu_memory_gib: 141",
            "    gpu_power_limit_watts: 700",
            "    cpu_cores: 128",
            "    memory_gib: 2048",
            f"    fabric: ib-{rack[:2]}",
            "    labels:",
            "      llmgw.io/site: sto1",
            f"      llmgw.io/room: {room}",
            f'      llmgw.io/row: "{row}"',
            f"      llmgw.io/rack: {rack}",
            f"      llmgw.io/pdu: {rack}-{'ab'[i % 2]}",
            "      gpu.model: H200",
        ]
    return "\n".join(lines) + "\n"


def server_yaml(nodes: int) -> str:
    """Budgets on every rack and PDU that hold about 85% of full cards; observe mode; capping on."""
    per_node = 5950 * 0.85 / 0.9
    budgets = []
    for _, _, rack in rack_names(nodes):
        budgets.append(f"    - {{domain: 'rack:{rack}', cap_watts: {round(per_node * NODES_PER_RACK, -2):.0f}, other_watts: 800}}")
        for side in "ab":
            budgets.append(f"    - {{domain: 'pdu:{rack}-{side}', cap_watts: {round(per_node * NODES_PER_RACK / 2, -2):.0f}}}")
    return textwrap.dedent("""\
        facility:
          margin: 0.1
          gpu_watts: 700
          cpu_core_watts: 10
          node_watts: 350
          conditions:
            mode: observe
          capping:
            enabled: true
          budgets:
        """) + "\n".join(budgets) + "\n"


SCENARIO = {
    "kind": "FacilityScenario",
    "name": "bench-console",
    "tracks": [
        {"domains": [f"rack:{HOT_RACK}"], "signal": "inlet_temp_c", "stale_after": "10m",
         "points": [["0s", 35.0], ["24h", 35.0]]},
        {"domains": [f"rack:{WARM_RACK}"], "signal": "inlet_temp_c", "stale_after": "10m",
         "points": [["0s", 29.0], ["24h", 29.0]]},
    ],
}

MODELS = textwrap.dedent("""\
    kind: Model
    name: llama-70b
    replicas: 60
    profile: {gpus: 8, cpu_cores: 16, memory_gib: 256, min_ready_seconds: 0, command: "serve {model} --port {port}"}
    ---
    kind: Model
    name: mixtral-8x22b
    replicas: 80
    profile: {gpus: 4, cpu_cores: 8, memory_gib: 128, min_ready_seconds: 0, command: "serve {model} --port {port}"}
    ---
    kind: Model
    name: embed-small
    replicas: 40
    profile: {gpus: 1, cpu_cores: 4, memory_gib: 32, min_ready_seconds: 0, command: "serve {model} --port {port}"}
    """)


def prepare(nodes: int, work: Path, *, reuse: bool = False) -> tuple[str, Path]:
    """The bench database with the facility, the models, the scenario, the nodes joined and 48 h of history
    (``reuse``: the one a run before made), and the nodes' tokens; (its URL, the tokens file)."""
    from urllib.parse import urlparse, urlunparse

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    url = urlunparse(urlparse(base)._replace(path=f"/{BENCH_DB}")) if reuse else bench_database(base, BENCH_DB)
    os.environ["DATABASE_URL"] = url
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from agents.services import node_token_create
    from facility.services import facility_apply, scenario_start
    from llmgw.users_cli import token_create
    from placement.services import models_apply

    (work / "cluster.yaml").write_text(cluster_yaml(nodes))
    if not reuse:
        facility_apply(text=server_yaml(nodes))
        models_apply(text=MODELS)
        join(nodes, work / "cluster.yaml")
        from bench.facility_page import load_history

        print(f"{load_history()} history points")
    scenario_start(data=SCENARIO, speed=10.0)  # from now: the hot rack is hot a minute into the run
    tokens = {f"gpu{i:05}": node_token_create(node_name=f"gpu{i:05}") for i in range(nodes)}
    (work / "tokens.json").write_text(json.dumps(tokens))
    from django.contrib.auth import get_user_model

    if not get_user_model().objects.filter(username="bench").exists():
        token_create(username="bench", role="operator")

    user = get_user_model().objects.get(username="bench")
    user.set_password(PASSWORD)
    user.save()
    from django.db import connection

    connection.close()
    return url, work / "tokens.json"


def join(nodes: int, cluster: Path) -> None:
    """Every node's first heartbeat through the service its agent's first POST reaches (one embedded server
    on two cores takes minutes to admit a thousand agents at once; joining is not what this bench measures)."""
    from agents.services import heartbeat_record
    from agents.simulator.cluster import load_cluster_file
    from agents.simulator.nodes import SimNode

    t0 = time.perf_counter()
    for spec in load_cluster_file(cluster):
        node = SimNode(spec)
        heartbeat_record(node_name=node.name, heartbeat=node.heartbeat(time.monotonic()))
    print(f"{nodes} nodes joined in {time.perf_counter() - t0:.0f} s")


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


class Beats:
    """The simulated agents in a thread of their own: every node beats every `interval` seconds (its starts
    spread over one interval), counting what went through."""

    def __init__(self, cluster: Path, tokens: dict[str, str], server: str, interval: float):
        from agents.simulator.cluster import load_cluster_file
        from agents.simulator.nodes import SimNode

        # Each says 10 s, the protocol's longest; beating every 20 s keeps it ready (3 intervals missed).
        self.nodes = [SimNode(spec, interval=10) for spec in load_cluster_file(cluster)]
        self.tokens, self.server, self.interval = tokens, server, interval
        self.ok = self.failed = 0
        self.started = time.monotonic()
        self.seconds = 0.0
        self.loop = None
        self.stopping = None
        self.thread = None

    def start(self) -> None:
        import asyncio
        import threading

        ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            self.stopping = asyncio.Event()
            ready.set()
            self.loop.run_until_complete(self.beat_all())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait()

    async def beat_all(self) -> None:
        import asyncio

        from agents.simulator.client import client_for, post_heartbeat

        async with client_for(self.server, 64) as client:
            async def beat(node, offset: float) -> None:
                next_at = self.loop.time() + offset
                while not self.stopping.is_set():
                    try:
                        await asyncio.wait_for(self.stopping.wait(), timeout=max(0.0, next_at - self.loop.time()))
                        return
                    except TimeoutError:
                        pass
                    result = await post_heartbeat(client, node, self.tokens[node.name])
                    if result.ok:
                        self.ok += 1
                    else:
                        self.failed += 1
                    next_at = max(next_at + self.interval, self.loop.time())

            count = len(self.nodes)
            await asyncio.gather(*(beat(n, self.interval * i / count) for i, n in enumerate(self.nodes)))

    def stop(self) -> None:
        self.seconds = time.monotonic() - self.started
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stopping.set)
            self.thread.join(timeout=60)


def log_exceptions(log: Path) -> dict[str, int]:
    text = log.read_text(errors="replace")
    return {"Traceback": text.count("Traceback"), "KeyError": text.count("KeyError"),
            "ERROR": sum(1 for line in text.splitlines() if " ERROR " in line or line.startswith("ERROR"))}


def measure(page, path: str, runs: int, seconds: float) -> dict:
    """Load `path` `runs` times, then keep it open `seconds` counting the live socket's bytes."""
    loads: list[dict] = []
    for _ in range(runs):
        page.goto(path, wait_until="load")
        page.wait_for_function("document.getElementById('live-status')?.dataset.state === 'open'")
        loads.append(page.evaluate(TIMING))
    frames: list[int] = []

    def on_socket(ws) -> None:
        ws.on("framereceived", lambda payload: frames.append(len(payload.encode() if isinstance(payload, str) else payload)))

    page.on("websocket", on_socket)
    page.goto(path, wait_until="load")
    page.wait_for_function("document.getElementById('live-status')?.dataset.state === 'open'")
    page.wait_for_timeout(10_000)  # the first renders after connecting are not the steady state
    page.evaluate("window.__longTasks = []")
    frames.clear()
    page.wait_for_timeout(seconds * 1000)
    steady_bytes = sum(frames)
    steady_frames = len(frames)
    steady_long = page.evaluate("window.__longTasks.slice()")
    page.remove_listener("websocket", on_socket)
    load_long = [d for load in loads for d in load["long"]]
    return {
        "bytes": loads[-1]["bytes"], "elements": loads[-1]["elements"], "height": loads[-1]["height"],
        "load_p50": percentile([x["load"] for x in loads], 0.5), "load_max": max(x["load"] for x in loads),
        "ttfb_p50": percentile([x["ttfb"] for x in loads], 0.5),
        "load_long_max": max(load_long, default=0.0), "load_long_over": sum(1 for d in load_long if d > 200),
        "socket_kb_min": steady_bytes / 1024 / (seconds / 60), "socket_frames_min": steady_frames / (seconds / 60),
        "steady_long_max": max(steady_long, default=0.0), "steady_long_over": sum(1 for d in steady_long if d > 200),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60.0, help="steady state measured this long, per page")
    parser.add_argument("--interval", type=float, default=20.0,
                        help="seconds between a node's heartbeats (under 30: each says 10 s, and 3 missed is not ready)")
    parser.add_argument("--reuse", action="store_true", help="the database a run before made, as it is")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-console-"))
    t0 = time.perf_counter()
    url, tokens = prepare(args.nodes, work, reuse=args.reuse)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DATABASE_URL": url, "LLMGW_DATA_DIR": str(work), "ALLOWED_HOSTS": "127.0.0.1,localhost",
           "LOG_LEVEL": "WARNING"}
    for key in ("REDIS_URL", "LLMGW_CONFIG", "DJANGO_SETTINGS_MODULE"):
        env.pop(key, None)
    llmgw = shutil.which("llmgw", path=str(Path(sys.executable).parent)) or "llmgw"
    server_log = work / "server.log"
    server = start([llmgw, "serve", f"127.0.0.1:{port}"], env, server_log)
    sim = None
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/login/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"llmgw serve did not start: {server_log.read_text()[-3000:]}")
            time.sleep(0.3)
        sim = Beats(work / "cluster.yaml", json.loads(tokens.read_text()), base, args.interval)
        sim.start()
        time.sleep(45)  # the reconcile places the models; conditions judge the replayed racks
        print(f"ready in {time.perf_counter() - t0:.0f} s with the setup; heartbeats so far: {sim.ok} through, "
              f"{sim.failed} failed; server log so far: {log_exceptions(server_log)}")
        from playwright.sync_api import sync_playwright

        results = {}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            context = browser.new_context(base_url=base, viewport={"width": 1440, "height": 900})
            context.add_init_script(LONG_TASKS)
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto("/login/")
            page.fill("input[name=username]", "bench")
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url("**/nodes/")
            for path in ("/facility/", "/models/"):
                page.goto(path)  # warm: the server's first render, the browser's cache of static files
                results[path] = measure(page, path, args.runs, args.seconds)
            page.goto("/facility/")
            page.screenshot(path=str(work / "facility.png"), full_page=False)
            browser.close()
        after = log_exceptions(server_log)
    finally:
        if sim is not None:
            sim.stop()
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"the console in Chromium at {args.nodes} nodes, 40 racks, nodes beating every {args.interval:g} s "
          f"({args.runs} loads a page, steady state {args.seconds:.0f} s; work dir {work}):")
    for path, r in results.items():
        print(f"  {path}: page {r['bytes'] / 1024:.0f} KiB, {r['elements']:,} elements, {r['height']:,} px tall; "
              f"load event p50 {r['load_p50']:.0f} ms, max {r['load_max']:.0f} ms (first byte p50 {r['ttfb_p50']:.0f} ms); "
              f"socket {r['socket_kb_min']:.1f} KiB/min ({r['socket_frames_min']:.0f} frames/min); "
              f"long tasks: loads max {r['load_long_max']:.0f} ms ({r['load_long_over']} over 200 ms), "
              f"steady max {r['steady_long_max']:.0f} ms ({r['steady_long_over']} over 200 ms)")
    print(f"  heartbeats: {sim.ok} went through, {sim.failed} failed ({sim.ok / max(1.0, sim.seconds):.0f}/s); "
          f"server log after the runs: {after}")


if __name__ == "__main__":
    main()
