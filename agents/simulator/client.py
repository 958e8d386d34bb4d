"""Driving simulated nodes over HTTP: one asyncio loop with one shared httpx.AsyncClient carries every
node, so a thousand nodes fit in one process. Each posts through the real heartbeat API."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agents.simulator.nodes import SimNode

log = logging.getLogger(__name__)

HEARTBEAT_PATH = "/api/v1/agents/heartbeat"


@dataclass
class BeatResult:
    """How one heartbeat went: ok, or the error a person reads, and how long it took."""

    node: str
    ok: bool
    seconds: float
    error: str = ""
    # The answer's status ("200", "503"), or the client's error's name ("ReadTimeout") when none came.
    status: str = "200"


def _error_text(response: Any) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    return f"HTTP {response.status_code}: {detail or response.text[:200]}"


async def post_heartbeat(
    client: Any, node: SimNode, token: str, clock: Callable[[], float] = time.monotonic
) -> BeatResult:
    """Send one heartbeat of a node and take its answer; never raises for a server that fails."""
    import httpx

    start = clock()
    body = node.heartbeat(start)
    try:
        response = await client.post(HEARTBEAT_PATH, json=body, headers={"Authorization": f"Token {token}"})
    except httpx.HTTPError as exc:
        return BeatResult(node.name, False, clock() - start, f"{type(exc).__name__}: {exc}", type(exc).__name__)
    if response.status_code != 200:
        return BeatResult(node.name, False, clock() - start, _error_text(response), str(response.status_code))
    node.take_answer(response.json(), clock())
    return BeatResult(node.name, True, clock() - start)


def client_for(server: str, connections: int) -> Any:
    import httpx

    # httpx logs every request at INFO: a thousand nodes would drown what the sim has to say.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=server.rstrip("/"), limits=limits, timeout=30.0)


async def beat_round(
    nodes: list[SimNode], tokens: Mapping[str, str], server: str, *, connections: int = 64
) -> list[BeatResult]:
    """One heartbeat from every node, `connections` at a time."""
    async with client_for(server, connections) as client:
        return list(await asyncio.gather(*(post_heartbeat(client, n, tokens[n.name]) for n in nodes)))


def run_round(
    nodes: list[SimNode], tokens: Mapping[str, str], server: str, *, connections: int = 64
) -> list[BeatResult]:
    """beat_round from synchronous code (the command's --once, the tests)."""
    return asyncio.run(beat_round(nodes, tokens, server, connections=connections))


async def run_nodes(
    nodes: list[SimNode],
    tokens: Mapping[str, str],
    server: str,
    *,
    interval: float,
    stop: asyncio.Event | None = None,
    connections: int = 100,
    tally: Counter | None = None,
) -> None:
    """Every node beats every `interval` seconds, their starts spread over one interval, until `stop` is set;
    each answer's status counted in `tally`."""
    stop = stop or asyncio.Event()
    async with client_for(server, connections) as client:

        async def beat_forever(node: SimNode, offset: float) -> None:
            loop = asyncio.get_running_loop()
            next_at = loop.time() + offset
            failing = False
            while not stop.is_set():
                delay = next_at - loop.time()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                        return
                    except TimeoutError:
                        pass
                result = await post_heartbeat(client, node, tokens[node.name])
                if tally is not None:
                    tally[result.status] += 1
                if not result.ok and not failing:
                    log.warning("sim %s: heartbeat failed: %s (retrying every interval)", node.name, result.error)
                elif result.ok and failing:
                    log.info("sim %s: heartbeats go through again", node.name)
                failing = not result.ok
                # Keep the cadence: a slow answer does not push the next beat later.
                next_at += interval
                if next_at < loop.time():
                    next_at = loop.time()

        count = max(len(nodes), 1)
        await asyncio.gather(*(beat_forever(n, interval * i / count) for i, n in enumerate(nodes)))


def tally_text(tally: Counter) -> str:
    """``1,200 heartbeats: 1,188 ok; refused or failed: 12 (503 × 9, ReadTimeout × 3)``."""
    total = sum(tally.values())
    ok = tally.get("200", 0)
    failed = {status: n for status, n in tally.items() if status != "200"}
    text = f"{total:,} heartbeats: {ok:,} ok"
    if failed:
        parts = ", ".join(f"{status} × {n:,}" for status, n in sorted(failed.items(), key=lambda kv: -kv[1]))
        text += f"; refused or failed: {total - ok:,} ({parts})"
    return text
