"""Heartbeat throughput: 1,000 simulated nodes posting to the real server (PostgreSQL) over HTTP.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/llmgw .venv/bin/python bench/heartbeats.py \\
        [--nodes 1000] [--workers 2] [--connections 32] [--seconds 20]

Creates a fresh database (llmgw_bench on DATABASE_URL's server), migrates it, makes a token per node the way
real ones are made, starts `--workers` Daphne processes on consecutive ports, sends one warm-up round (the
nodes join), then keeps `--connections` heartbeats in flight for `--seconds` (each node in turn, its
sensors from the simulator) and prints heartbeats/s and p50/p99 latency. The target is 1,000 heartbeats/s:
10,000 nodes at a 10 s interval. The client runs on the same machine and takes CPU from the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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


def start_servers(env: dict[str, str], workers: int, port: int, server: str) -> list[subprocess.Popen]:
    """`workers` server processes on consecutive ports: uvicorn (httptools, uvloop) or daphne."""
    bin_dir = Path(sys.executable).parent
    if server == "uvicorn":
        argv = [str(bin_dir / "uvicorn"), "--no-access-log", "--log-level", "warning", "--http", "httptools",
                "--loop", "uvloop", "--host", "127.0.0.1", "llmgw.asgi:application", "--port"]
    else:
        argv = [str(bin_dir / "daphne"), "-v", "0", "-b", "127.0.0.1", "llmgw.asgi:application", "-p"]
    procs = [
        subprocess.Popen([*argv, str(port + i)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        for i in range(workers)
    ]
    import httpx

    for i in range(workers):
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port + i}/metrics", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    sys.exit(f"{server} on port {port + i} did not start")
                time.sleep(0.3)
    return procs


class Connection:
    """One keep-alive HTTP/1.1 connection: the least a client can spend per request, so the figure is the
    server's. (httpx costs about as much CPU per request as the server does, on the same two cores.)"""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, server: str) -> Connection:
        host, _, port = server.removeprefix("http://").partition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, server.removeprefix("http://"))

    async def post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Token {token}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
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


def bodies_for(nodes, rounds: int) -> list[list[bytes]]:
    """Each node's heartbeats for `rounds` beats, made before the clock starts (new readings each time)."""
    import json

    now = time.monotonic()
    return [[json.dumps(node.heartbeat(now + r)).encode() for r in range(rounds)] for node in nodes]


async def load(nodes, bodies, tokens, servers: list[str], connections: int, seconds: float | None):
    """Keep `connections` heartbeats in flight; None seconds: one round of every node. (latencies, errors)."""
    latencies: list[float] = []
    errors: list[str] = []
    cursor = 0
    stop_at = None if seconds is None else time.monotonic() + seconds

    async def worker(n: int) -> None:
        nonlocal cursor
        conn = await Connection.open(servers[n % len(servers)])
        try:
            while True:
                if stop_at is None:
                    if cursor >= len(nodes):
                        return
                elif time.monotonic() >= stop_at:
                    return
                i = cursor % len(nodes)
                beat = cursor // len(nodes)
                cursor += 1
                body = bodies[i][beat % len(bodies[i])]
                t0 = time.monotonic()
                status, payload = await conn.post("/api/v1/agents/heartbeat", body, tokens[nodes[i].name])
                if status == 200:
                    latencies.append(time.monotonic() - t0)
                else:
                    errors.append(f"{status}: {payload[:300]!r}")
        finally:
            conn.close()

    await asyncio.gather(*(worker(n) for n in range(connections)))
    return latencies, errors


def node_spec(name: str, *, rack: str, pdu: str) -> dict:
    """A simulated node like the ones `llmgw sim` reads: 8 H100s, in a rack on two PDUs."""
    return {
        "name": name, "gpus": 8, "gpu_model": "H100-SXM5-80GB", "gpu_memory_gib": 80, "gpu_power_limit_watts": 700,
        "cpu_cores": 96, "memory_gib": 2048, "fabric": "ib-a",
        "labels": {"llmgw.io/rack": rack, "llmgw.io/pdu": pdu},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2, help="server processes (default 2)")
    parser.add_argument("--server", choices=("uvicorn", "daphne"), default="uvicorn", help="default uvicorn")
    parser.add_argument("--connections", type=int, default=32, help="heartbeats in flight (default 32)")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--port", type=int, default=18100)
    parser.add_argument("--database", default="llmgw_bench")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("bench/heartbeats.py: set DATABASE_URL=postgres://… (the bench makes its own database on it)")

    url = bench_database(os.environ["DATABASE_URL"], args.database)
    data_dir = tempfile.mkdtemp(prefix="llmgw-bench-")
    env = {**os.environ, "DATABASE_URL": url, "LLMGW_DATA_DIR": data_dir, "DJANGO_SETTINGS_MODULE": "llmgw.settings",
           "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT),
           }
    subprocess.run([sys.executable, "-m", "llmgw.cli", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)

    import django

    django.setup()
    from agents.services import node_token_create
    from agents.simulator.nodes import SimNode

    specs = [node_spec(f"bench{i:05}", rack=f"r{i // 16:03}", pdu=f"r{i // 16:03}-a,r{i // 16:03}-b")
             for i in range(args.nodes)]
    tokens = {s["name"]: node_token_create(node_name=s["name"]) for s in specs}
    nodes = [SimNode(s) for s in specs]
    bodies = bodies_for(nodes, 4)
    from django.db import connections

    connections.close_all()

    procs = start_servers(env, args.workers, args.port, args.server)
    servers = [f"http://127.0.0.1:{args.port + i}" for i in range(args.workers)]
    try:
        started = time.monotonic()
        # Three rounds: the nodes join, then every server process has seen every node once (its first
        # heartbeat in a process takes the full path).
        for _ in range(3):
            _, errors = asyncio.run(load(nodes, bodies, tokens, servers, args.connections, None))
            if errors:
                sys.exit(f"warm-up: {len(errors)} heartbeats failed, first: {errors[0]}")
        print(f"warm-up: {args.nodes} nodes joined, 3 rounds in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        latencies, errors = asyncio.run(load(nodes, bodies, tokens, servers, args.connections, args.seconds))
        elapsed = time.monotonic() - started
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    slow = sum(1 for t in latencies if t > 0.05)
    loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    print(
        f"{args.nodes} nodes, {args.workers} {args.server} processes, {args.connections} in flight, {elapsed:.0f} s: "
        f"{len(latencies) / elapsed:.0f} heartbeats/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, {len(errors)} errors; "
        f"over 50 ms: {slow / max(len(latencies), 1):.1%}, max {latencies[-1] * 1000:.0f} ms; load average {loadavg}"
    )
    if errors:
        print(f"first error: {errors[0]}")


if __name__ == "__main__":
    main()
