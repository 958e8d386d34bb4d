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


def start_servers(env: dict[str, str], workers: int, port: int) -> list[subprocess.Popen]:
    daphne = str(Path(sys.executable).parent / "daphne")
    procs = [
        subprocess.Popen(
            [daphne, "-v", "0", "-b", "127.0.0.1", "-p", str(port + i), "llmgw.asgi:application"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        )
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
                    sys.exit(f"daphne on port {port + i} did not start")
                time.sleep(0.3)
    return procs


async def load(nodes, tokens, servers: list[str], connections: int, seconds: float | None):
    """Keep `connections` heartbeats in flight; None seconds: one round of every node. (latencies, errors)."""
    import httpx

    from agents.sim import post_heartbeat

    per_server = max(1, connections // len(servers))
    limits = httpx.Limits(max_connections=per_server, max_keepalive_connections=per_server)
    clients = [httpx.AsyncClient(base_url=s, limits=limits, timeout=60) for s in servers]
    latencies: list[float] = []
    errors: list[str] = []
    cursor = 0
    stop_at = None if seconds is None else time.monotonic() + seconds

    async def worker() -> None:
        nonlocal cursor
        while True:
            if stop_at is None:
                if cursor >= len(nodes):
                    return
            elif time.monotonic() >= stop_at:
                return
            i = cursor % len(nodes)
            cursor += 1
            node = nodes[i]
            result = await post_heartbeat(clients[i % len(clients)], node, tokens[node.name])
            if result.ok:
                latencies.append(result.seconds)
            else:
                errors.append(result.error)

    try:
        await asyncio.gather(*(worker() for _ in range(connections)))
    finally:
        for client in clients:
            await client.aclose()
    return latencies, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2, help="Daphne processes (default 2)")
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
           # Under ASGI each request's sync code runs in its own thread, so persistent connections
           # (kept per thread) pile up until PostgreSQL refuses more: connect per request.
           "DB_CONN_MAX_AGE": os.environ.get("DB_CONN_MAX_AGE", "0")}
    subprocess.run([sys.executable, "-m", "llmgw.cli", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)

    import django

    django.setup()
    from agents.services import node_token_create
    from agents.sim import SimNode
    from tests.conftest import node_spec

    specs = [node_spec(f"bench{i:05}", rack=f"r{i // 16:03}", pdu=f"r{i // 16:03}-a,r{i // 16:03}-b")
             for i in range(args.nodes)]
    tokens = {s["name"]: node_token_create(node_name=s["name"]) for s in specs}
    nodes = [SimNode(s) for s in specs]
    from django.db import connections

    connections.close_all()

    procs = start_servers(env, args.workers, args.port)
    servers = [f"http://127.0.0.1:{args.port + i}" for i in range(args.workers)]
    try:
        started = time.monotonic()
        _, errors = asyncio.run(load(nodes, tokens, servers, args.connections, None))
        if errors:
            sys.exit(f"warm-up: {len(errors)} heartbeats failed, first: {errors[0]}")
        print(f"warm-up: {args.nodes} nodes joined in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        latencies, errors = asyncio.run(load(nodes, tokens, servers, args.connections, args.seconds))
        elapsed = time.monotonic() - started
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    print(
        f"{args.nodes} nodes, {args.workers} daphne processes, {args.connections} in flight, {elapsed:.0f} s: "
        f"{len(latencies) / elapsed:.0f} heartbeats/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, {len(errors)} errors"
    )
    if errors:
        print(f"first error: {errors[0]}")


if __name__ == "__main__":
    main()
