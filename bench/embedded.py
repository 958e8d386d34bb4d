"""The embedded default under its own simulator: 1,000 simulated nodes against `llmgw demo` (SQLite).

    .venv/bin/python bench/embedded.py [--nodes 1000] [--interval 10] [--rounds 3] [--port 18300]

Starts `llmgw demo ADDR` in a fresh data directory (SQLite, tasks in-process, its own 32 simulated nodes), makes a
token per node the way `llmgw sim` does, then runs every node's simulated agent (agents.simulator, httpx, at most
100 connections, starts spread over one interval, as `llmgw sim up` does) for `--rounds` intervals and
prints how many heartbeats were sent and how many failed, with the first errors. Round one is the nodes
joining (each a full write); the rest are the steady state. The target is 0 failed heartbeats.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


async def drive(nodes, tokens, server: str, *, interval: float, rounds: int, connections: int = 100):
    """Every node beats every `interval` seconds, `rounds` times, starts spread over one interval."""
    from agents.simulator.client import client_for, post_heartbeat

    results = []
    async with client_for(server, connections) as client:

        async def node_loop(node, offset: float) -> None:
            loop = asyncio.get_running_loop()
            next_at = loop.time() + offset
            for round_ in range(rounds):
                delay = next_at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                results.append((round_, await post_heartbeat(client, node, tokens[node.name])))
                next_at += interval

        await asyncio.gather(*(node_loop(n, interval * i / len(nodes)) for i, n in enumerate(nodes)))
    return results


def report(title: str, results) -> None:
    failed = [r for r in results if not r.ok]
    seconds = sorted(r.seconds for r in results)
    print(f"  {title}: {len(results)} heartbeats, {len(failed)} failed; p50 {seconds[len(seconds) // 2] * 1000:.0f} ms, "
          f"p99 {seconds[int(len(seconds) * 0.99)] * 1000:.0f} ms, max {seconds[-1] * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=18300)
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="llmgw-embedded-")
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG"}}
    env.update(LLMGW_DATA_DIR=data_dir, DJANGO_SETTINGS_MODULE="llmgw.settings", LOG_LEVEL="WARNING")
    addr = f"127.0.0.1:{args.port}"
    log = open(Path(data_dir) / "demo.log", "w")  # noqa: SIM115 - closed with the server
    server = subprocess.Popen([str(Path(sys.executable).with_name("llmgw")), "demo", "--addr", addr], cwd=ROOT,
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://{addr}/login/", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("llmgw demo did not start:\n" + (Path(data_dir) / "demo.log").read_text()[-3000:])
                time.sleep(0.5)
        os.environ.update(env)
        import django

        django.setup()
        from django.db import connections

        from agents.services import node_token_create
        from agents.simulator.nodes import SimNode
        from tests.conftest import node_spec

        specs = [node_spec(f"sim{i:04}", rack=f"s{i // 16:03}", pdu=f"s{i // 16:03}-a") for i in range(args.nodes)]
        tokens = {s["name"]: node_token_create(node_name=s["name"]) for s in specs}
        connections.close_all()
        nodes = [SimNode(s, interval=int(args.interval)) for s in specs]
        started = time.monotonic()
        results = asyncio.run(drive(nodes, tokens, f"http://{addr}", interval=args.interval, rounds=args.rounds))
        elapsed = time.monotonic() - started
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
    print(f"{args.nodes} nodes, every {args.interval:g} s, {args.rounds} rounds in {elapsed:.1f} s")
    for round_ in range(args.rounds):
        report(f"round {round_ + 1}", [r for n, r in results if n == round_])
    failed = [r for _, r in results if not r.ok]
    report("all", [r for _, r in results])
    for error, count in collections.Counter(r.error for r in failed).most_common(5):
        print(f"  {count} × {error}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
