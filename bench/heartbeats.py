"""Heartbeats over HTTP: simulated nodes posting to the real server (PostgreSQL), paced or as fast as possible.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/llmgw .venv/bin/python bench/heartbeats.py \\
        [--nodes 1000] [--rate 1100 | --connections 32] [--workers 2] [--seconds 20]

Creates a fresh database (--database on DATABASE_URL's server), migrates it, makes a token per node the way
real ones are made, starts `--workers` uvicorn processes on consecutive ports, and warms up: one round in
which the nodes join, then one round to each process (a node's first heartbeat in a process takes Django's
full path), then one quick round to every process so that no node's turn comes past its ready window.

`--rate R` (paced, open loop): every node posts every nodes/R seconds (its `interval_seconds` says the same,
so it stays ready), the sends spread evenly over the interval, each beat to the next process in turn (as a
node's new connections land on any process behind one port). A heartbeat's latency runs from the time it was
due, not from when the client got round to it, so a stall on either side counts for every heartbeat it
delays (no coordinated omission); a heartbeat is never held back because an earlier one is still in flight.
Without `--rate` (closed loop) `--connections` heartbeats are kept in flight: the most the server takes.

The load comes from a separate process (this script with `--client`): asyncio on uvloop with raw keep-alive
HTTP/1.1, no Django, its garbage collector frozen. It shares the cores with the server; it prints what it
spent (CPU seconds, and how late it sent). Printed: achieved heartbeats/s, p50/p90/p99/p99.9/max, the count
over 50 ms, errors and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
HEARTBEAT_PATH = "/api/v1/agents/heartbeat"
SLOW_SECONDS = 0.05


def bench_database(url: str, name: str) -> str:
    """Drop and create database `name` on the server of `url`; return its URL."""
    import psycopg

    parts = urlsplit(url)
    if not parts.scheme.startswith("postgres"):
        sys.exit("bench/heartbeats.py: DATABASE_URL must be a postgres://… URL")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path=f"/{name}"))


def start_servers(env: dict[str, str], workers: int, port: int) -> list[subprocess.Popen]:
    """`workers` uvicorn processes (httptools, uvloop) on consecutive ports, each answering before this returns."""
    import httpx

    bin_dir = Path(sys.executable).parent
    argv = [str(bin_dir / "uvicorn"), "--no-access-log", "--log-level", "warning", "--http", "httptools",
            "--loop", "uvloop", "--host", "127.0.0.1", "llmgw.asgi:application", "--port"]
    procs = [
        subprocess.Popen([*argv, str(port + i)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        for i in range(workers)
    ]
    for i in range(workers):
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port + i}/login/", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    sys.exit(f"uvicorn on port {port + i} did not start")
                time.sleep(0.3)
    return procs


# -- the client (its own process: no Django) ----------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection: the least a client can spend per request, so the figure is the
    server's. (httpx costs about as much CPU per request as the server does, on the same two cores.)"""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, server: str) -> Connection:
        host, _, port = server.partition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, server)

    async def post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Token {token}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("closed by the server (idle past its keep-alive)")
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        payload = await self.reader.readexactly(length) if length else b""
        return int(status_line.split()[1]), payload

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Keep-alive connections per server: a send takes an idle one or opens one, so none waits for another,
    up to `limit` per server (then it waits for one to come back: the wait counts in its latency)."""

    def __init__(self, servers: list[str], limit: int = 400):
        self.idle: dict[str, list[Connection]] = {s: [] for s in servers}
        self.slots = {s: asyncio.Semaphore(limit) for s in servers}

    async def fill(self, per_server: int) -> None:
        for server, idle in self.idle.items():
            idle += await asyncio.gather(*(Connection.open(server) for _ in range(per_server)))

    async def post(self, server: str, body: bytes, token: str) -> tuple[int, bytes]:
        """Post on an idle connection (once more on a new one if the server had closed it)."""
        async with self.slots[server]:
            idle = self.idle[server]
            for attempt in (1, 2):
                conn = idle.pop() if idle and attempt == 1 else await Connection.open(server)
                try:
                    answer = await conn.post(HEARTBEAT_PATH, body, token)
                except ConnectionResetError:
                    conn.close()
                    if attempt == 2:
                        raise
                    continue
                except BaseException:
                    conn.close()
                    raise
                idle.append(conn)
                return answer
            raise AssertionError("unreachable")

    def close(self) -> None:
        for idle in self.idle.values():
            for conn in idle:
                conn.close()


class Results:
    def __init__(self):
        self.latencies: list[float] = []
        self.late: list[float] = []  # how long after its due time the client sent each heartbeat
        self.errors: list[str] = []
        self.warmup_errors = 0
        self.sent = 0  # paced: every heartbeat sent, the warm-up's too
        self.warmup_error = ""
        self.first_at = self.last_at = 0.0

    def record(self, status: int, payload: bytes, latency: float) -> None:
        if status == 200:
            self.latencies.append(latency)
        else:
            self.errors.append(f"{status}: {payload[:300]!r}")


async def paced(plan: dict, results: Results) -> None:
    """Heartbeat j is due at start + j/rate: node j mod N's (j div N)th beat, so each node posts every N/rate
    seconds at its own phase. Node i joins at start + i/join_rate (its beats before then are not sent), and
    only the beats due from `measure_from` seconds after the start are counted."""
    loop = asyncio.get_running_loop()
    bodies, tokens, servers, rate = plan["bodies"], plan["tokens"], plan["servers"], plan["rate"]
    nodes, join_rate = len(bodies), plan["join_rate"]
    pool = Pool(servers)
    await pool.fill(plan["connections"])
    pending: set[asyncio.Task] = set()
    start = loop.time() + 0.2
    measure_from = start + plan["measure_from"]
    stop_at = measure_from + plan["seconds"]

    async def send(j: int, due: float) -> None:
        node, beat = j % nodes, j // nodes
        results.sent += 1
        counted = due >= measure_from
        if counted:
            results.late.append(loop.time() - due)
        server = servers[(node + (0 if plan.get("sticky") else beat) + plan["server_offset"]) % len(servers)]
        try:
            status, payload = await pool.post(server, bodies[node][beat % len(bodies[node])], tokens[node])
        except (OSError, asyncio.IncompleteReadError) as exc:
            status, payload = 599, f"{type(exc).__name__}: {exc}".encode()
        if counted:
            results.record(status, payload, loop.time() - due)
            results.last_at = max(results.last_at, loop.time())
        elif status != 200:
            results.warmup_errors += 1
            results.warmup_error = results.warmup_error or f"{status}: {payload[:300]!r}"

    results.first_at = measure_from
    j = 0
    while (due := start + j / rate) < stop_at:
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        while (due := start + j / rate) <= loop.time() and due < stop_at:
            if due >= start + (j % nodes) / join_rate:  # the node has joined
                task = loop.create_task(send(j, due))
                pending.add(task)
                task.add_done_callback(pending.discard)
            j += 1
    if pending:
        await asyncio.wait(pending, timeout=60)
    pool.close()


async def closed(plan: dict, results: Results) -> None:
    """Keep `connections` heartbeats in flight, each node in turn; seconds None: one round of every node."""
    loop = asyncio.get_running_loop()
    bodies, tokens, servers = plan["bodies"], plan["tokens"], plan["servers"]
    nodes = len(bodies)
    seconds = plan["seconds"]
    cursor = 0
    results.first_at = loop.time()
    stop_at = None if seconds is None else loop.time() + seconds

    async def worker(n: int) -> None:
        nonlocal cursor
        pool = Pool(servers)
        try:
            while stop_at is None and cursor < nodes or stop_at is not None and loop.time() < stop_at:
                i, beat = cursor % nodes, cursor // nodes
                cursor += 1
                server = servers[(i + beat + plan["server_offset"]) % len(servers)]
                t0 = loop.time()
                status, payload = await pool.post(server, bodies[i][beat % len(bodies[i])], tokens[i])
                results.record(status, payload, loop.time() - t0)
        finally:
            pool.close()

    await asyncio.gather(*(worker(n) for n in range(plan["connections"])))
    results.last_at = loop.time()


def client_main(plan_path: str, out_path: str) -> None:
    """The load, in this process: uvloop, the garbage collector off (its pauses would count as the server's)."""
    import uvloop

    with open(plan_path, "rb") as f:
        plan = pickle.load(f)
    gc.collect()
    gc.freeze()
    gc.disable()
    results = Results()
    cpu0, wall0 = time.process_time(), time.monotonic()
    runner = paced if plan["rate"] else closed
    uvloop.run(runner(plan, results))
    out = {**results.__dict__, "cpu_seconds": time.process_time() - cpu0, "wall_seconds": time.monotonic() - wall0}
    with open(out_path, "wb") as f:
        pickle.dump(out, f)


def run_client(plan: dict) -> dict:
    """Run one load in a client process; its results."""
    with tempfile.TemporaryDirectory(prefix="llmgw-hb-") as tmp:
        plan_path, out_path = Path(tmp) / "plan", Path(tmp) / "out"
        plan_path.write_bytes(pickle.dumps(plan))
        subprocess.run([sys.executable, __file__, "--client", str(plan_path), str(out_path)], check=True)
        return pickle.loads(out_path.read_bytes())


# -- the bench ---------------------------------------------------------------------------------------------


def bodies_for(nodes, rounds: int) -> list[list[bytes]]:
    """Each node's heartbeats for `rounds` beats, made before the clock starts (new readings each time)."""
    import json

    now = time.monotonic()
    return [[json.dumps(node.heartbeat(now + r)).encode() for r in range(rounds)] for node in nodes]


def node_spec(name: str, *, rack: str, pdu: str) -> dict:
    """A simulated node like the ones `llmgw sim` reads: 8 H100s, in a rack on two PDUs."""
    return {
        "name": name, "gpus": 8, "gpu_model": "H100-SXM5-80GB", "gpu_memory_gib": 80, "gpu_power_limit_watts": 700,
        "cpu_cores": 96, "memory_gib": 2048, "fabric": "ib-a",
        "labels": {"llmgw.io/rack": rack, "llmgw.io/pdu": pdu},
    }


def quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))] if sorted_values else float("nan")


def report(args, out: dict) -> None:
    latencies = sorted(out["latencies"])
    if not latencies:
        print(f"{args.nodes} nodes: no heartbeat answered (overloaded: each waited past the end); "
              f"{len(out['errors'])} errors, {len(out['late'])} sent")
        return
    elapsed = max(out["last_at"] - out["first_at"], 1e-9)
    ms = {q: quantile(latencies, q) * 1000 for q in (0.5, 0.9, 0.99, 0.999)}
    slow = sum(1 for t in latencies if t > SLOW_SECONDS)
    loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    if args.rate:
        how = f"paced at {args.rate:g}/s (each node every {args.nodes / args.rate:.2f} s)"
    else:
        how = f"closed loop, {args.connections} in flight"
    print(
        f"{args.nodes} nodes, {args.workers} uvicorn processes, {how}, {elapsed:.0f} s: "
        f"{len(latencies) / elapsed:.0f} heartbeats/s, p50 {ms[0.5]:.1f} ms, p90 {ms[0.9]:.1f} ms, "
        f"p99 {ms[0.99]:.1f} ms, p99.9 {ms[0.999]:.1f} ms, max {latencies[-1] * 1000 if latencies else 0:.0f} ms; "
        f"over 50 ms: {slow} of {len(latencies)} ({slow / max(len(latencies), 1):.2%}); {len(out['errors'])} errors; "
        f"load average {loadavg}"
    )
    late = sorted(out["late"])
    sent = out["sent"] or len(latencies)  # paced: the warm-up's heartbeats too, as the CPU figure
    client = f"client: {out['cpu_seconds']:.1f} CPU s in {out['wall_seconds']:.0f} s " \
             f"({out['cpu_seconds'] / out['wall_seconds']:.0%} of a core, " \
             f"{out['cpu_seconds'] / max(sent, 1) * 1e6:.0f} µs a heartbeat)"
    if late:
        client += f", sent late by p99 {quantile(late, 0.99) * 1000:.1f} ms, max {late[-1] * 1000:.1f} ms"
    print(client)
    if out["errors"]:
        print(f"first error: {out['errors'][0]}")


def warm_up(plan: dict, workers: int) -> None:
    """The nodes join (round one); each process sees every node once (their first heartbeat in a process
    takes the full path); then one quick round to every process, so every node is fresh in each."""
    # A round with offset k sends node i to process (i + k) mod workers: offsets 0 … workers-1 reach every
    # process with every node (the first of them is the joining round).
    for offset in [*range(workers), *range(workers)]:
        out = run_client({**plan, "rate": None, "seconds": None, "server_offset": offset, "connections": 32})
        if out["errors"]:
            sys.exit(f"warm-up: {len(out['errors'])} heartbeats failed, first: {out['errors'][0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rate", type=float, help="paced: heartbeats/s in all (each node every nodes/rate s)")
    parser.add_argument("--workers", type=int, default=2, help="server processes (default 2)")
    parser.add_argument("--connections", type=int, default=32,
                        help="closed loop: heartbeats in flight; paced: connections opened per process at start")
    parser.add_argument("--seconds", type=float, default=20, help="measured (after the warm-up)")
    parser.add_argument("--join-rate", type=float, default=50,
                        help="paced: nodes joining per second before the measured seconds (default 50); 0: the "
                             "nodes join in the closed-loop warm-up first, and the paced run measures steady state")
    parser.add_argument("--sticky", action="store_true",
                        help="paced: each node posts to one process, as an agent's kept-alive connection does "
                             "(default: each beat to the next process, a new connection every time)")
    parser.add_argument("--port", type=int, default=18100)
    parser.add_argument("--database", default="llmgw_bench")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", ""),
                        help="REDIS_URL for the servers (a multi-process deployment's channel layer and task queue; "
                             "default $REDIS_URL); empty: each process alone, reconciles in the joining request")
    parser.add_argument("--client", nargs=2, metavar=("PLAN", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return client_main(*args.client)
    if not os.environ.get("DATABASE_URL"):
        sys.exit("bench/heartbeats.py: set DATABASE_URL=postgres://… (the bench makes its own database on it)")
    interval = args.nodes / args.rate if args.rate else 10
    if not 0.1 <= interval <= 10:
        sys.exit(f"bench/heartbeats.py: nodes/rate is each node's interval, {interval:g} s: it must be 0.1–10 s")

    url = bench_database(os.environ["DATABASE_URL"], args.database)
    data_dir = tempfile.mkdtemp(prefix="llmgw-bench-")
    env = {**os.environ, "DATABASE_URL": url, "LLMGW_DATA_DIR": data_dir, "DJANGO_SETTINGS_MODULE": "llmgw.settings",
           "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT), "REDIS_URL": args.redis}
    subprocess.run([sys.executable, "-m", "llmgw.cli", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)

    import django

    django.setup()
    from agents.services import node_token_create
    from agents.simulator.nodes import SimNode

    specs = [node_spec(f"bench{i:05}", rack=f"r{i // 16:03}", pdu=f"r{i // 16:03}-a,r{i // 16:03}-b")
             for i in range(args.nodes)]
    tokens = [node_token_create(node_name=s["name"]) for s in specs]
    nodes = [SimNode(s, interval=interval) for s in specs]
    bodies = bodies_for(nodes, 4)
    from django.db import connections

    connections.close_all()

    procs = start_servers(env, args.workers, args.port)
    plan = {"bodies": bodies, "tokens": tokens, "servers": [f"127.0.0.1:{args.port + i}" for i in range(args.workers)],
            "server_offset": 0}
    try:
        started = time.monotonic()
        if args.rate and not args.join_rate:
            # Steady state: every node joined and seen by each process at the closed loop's pace, then paced.
            warm_up(plan, args.workers)
            print(f"warm-up: {args.nodes} nodes joined and seen by each process in {time.monotonic() - started:.1f} s")
            out = run_client({**plan, "rate": args.rate, "seconds": args.seconds, "connections": args.connections,
                              "join_rate": float("inf"), "measure_from": 2 * interval, "sticky": args.sticky})
        elif args.rate:
            # The nodes join at --join-rate while the ones in keep their pace; a node's first two beats take
            # the full path (joining, then its first in the other process): measured after two intervals more.
            measure_from = args.nodes / args.join_rate + 2 * interval * args.workers / 2 + 1
            out = run_client({**plan, "rate": args.rate, "seconds": args.seconds, "connections": args.connections,
                              "join_rate": args.join_rate, "measure_from": measure_from})
            print(f"warm-up: {args.nodes} nodes joined at {args.join_rate:g}/s, measured from {measure_from:.0f} s; "
                  f"{out['warmup_errors']} failed before {out['warmup_error'][:200]}")
        else:
            warm_up(plan, args.workers)
            print(f"warm-up: {args.nodes} nodes joined and seen by each process in {time.monotonic() - started:.1f} s")
            out = run_client({**plan, "rate": None, "seconds": args.seconds, "connections": args.connections})
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    report(args, out)


if __name__ == "__main__":
    main()
