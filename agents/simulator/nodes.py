"""The simulator: agents for the nodes a cluster file declares, posting through the real heartbeat API.

Each simulated node keeps a seeded random source, a simulated replica runtime (the replicas the heartbeat
answer assigns go `starting`, then `ready` after a delay; those no longer assigned are reported `stopping`
once, then dropped) and a sensor model that follows load: GPUs running a replica draw and heat up, idle ones
sit near idle. One asyncio loop with one shared httpx.AsyncClient carries every node, so a thousand nodes
fit in one process.

No Django import at module level: the sensor model and the runtime are plain logic.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw.errors import InvalidInput

log = logging.getLogger(__name__)

NODE_KEYS = (
    "name",
    "gpus",
    "gpu_model",
    "gpu_memory_gib",
    "gpu_power_limit_watts",
    "cpu_cores",
    "memory_gib",
    "fabric",
    "labels",
)
HEARTBEAT_PATH = "/api/v1/agents/heartbeat"
DEFAULT_INTERVAL_SECONDS = 10
DEFAULT_READY_DELAY_SECONDS = 5.0
DEFAULT_GPU_POWER_LIMIT_WATTS = 700.0

# The sensor model: an idle Hopper SXM card, one serving (decode and prefill bursts), one loading weights.
IDLE_GPU_WATTS = 70.0
IDLE_GPU_CELSIUS = 32.0
LOADED_GPU_WATTS = (350.0, 650.0)
STARTING_GPU_WATTS = (150.0, 250.0)
CELSIUS_PER_GPU_WATT = 0.075  # 650 W → about 75 °C, under the 87 °C operating maximum
HBM_ABOVE_GPU_CELSIUS = 3.0
THERMAL_SLOWDOWN_CELSIUS = 87.0
IDLE_CPU_WATTS = 110.0
CPU_WATTS_PER_LOADED_GPU = 12.0
INLET_CELSIUS = (21.0, 25.0)  # inside ASHRAE's recommended 18–27 °C


# -- the cluster file ------------------------------------------------------------------------------------


def load_cluster(text: str, filename: str = "cluster.yaml") -> list[dict[str, Any]]:
    """The node specs of a cluster file, or InvalidInput naming the file, the line and the field."""
    from facility.domains import DomainError, validate_label
    from llmgw.yamldoc import load_documents

    docs = load_documents(text, filename)
    if len(docs) != 1:
        raise InvalidInput(f"{filename}: a cluster file is one YAML document with a nodes: list", field="nodes")
    doc = docs[0]
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a cluster file is a mapping with a nodes: list")
    for key in data:
        if key != "nodes":
            raise doc.error((key,), "unknown key; a cluster file takes: nodes")
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise doc.error(("nodes",), "must be a list of nodes, each with at least a name")
    specs: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(nodes):
        path: tuple[str | int, ...] = ("nodes", i)
        if not isinstance(item, dict):
            raise doc.error(path, "must be a mapping with at least a name")
        for key in item:
            if key not in NODE_KEYS:
                raise doc.error((*path, key), f"unknown key; a node takes: {', '.join(NODE_KEYS)}")
        if "name" not in item:
            raise doc.error(path, "name is required")
        name = item["name"]
        if not isinstance(name, str) or not _is_node_name(name):
            raise doc.error(
                (*path, "name"), f"{name!r} is not a node name (letters, digits, '.', '_' and '-', at most 253)"
            )
        if name in seen:
            raise doc.error((*path, "name"), f"{name} is declared twice in this file")
        seen.add(name)
        spec: dict[str, Any] = {"name": name}
        for key, low, high in (("gpus", 0, 64), ("cpu_cores", 0, 16384)):
            value = item.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise doc.error((*path, key), f"must be a whole number from {low} to {high}, not {value!r}")
            spec[key] = value
        for key, low, high in (
            ("gpu_memory_gib", 0, 4096),
            ("gpu_power_limit_watts", 1, 5000),
            ("memory_gib", 0, 1_048_576),
        ):
            if key not in item:
                continue
            value = item[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not low <= value <= high
            ):
                raise doc.error((*path, key), f"must be a number from {low} to {high}, not {value!r}")
            spec[key] = float(value)
        for key in ("gpu_model", "fabric"):
            value = item.get(key)
            if value is not None and not isinstance(value, str):
                raise doc.error((*path, key), f"must be text, not {value!r}")
            if value:
                spec[key] = value
        labels = item.get("labels") or {}
        if not isinstance(labels, dict):
            raise doc.error((*path, "labels"), "must be a mapping of key: value")
        spec["labels"] = {}
        for key, value in labels.items():
            # An unquoted `row: 1` is a number in YAML; a label value is its text.
            if isinstance(value, int | float) and not isinstance(value, bool):
                value = str(value)
            try:
                if not isinstance(key, str):
                    raise DomainError(f"a label key is text, not {key!r}")
                validate_label(key, value)
            except DomainError as exc:
                raise doc.error((*path, "labels", str(key)), str(exc)) from exc
            spec["labels"][key] = value
        specs.append(spec)
    return specs


def load_cluster_file(path: str | Path) -> list[dict[str, Any]]:
    """load_cluster on a file; a missing file is an InvalidInput too."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read the cluster file: {exc.strerror}", field="file") from exc
    return load_cluster(text, path.name)


def _is_node_name(name: str) -> bool:
    from agents.services import NODE_NAME_RE

    return bool(NODE_NAME_RE.match(name))


def heartbeat_for(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The heartbeat a node of the cluster file would send, with no load on it."""
    gpus = [
        {
            "index": i,
            "uuid": gpu_uuid(spec["name"], i),
            "name": spec.get("gpu_model", ""),
            "memory_gib": spec.get("gpu_memory_gib"),
            "power_limit_watts": spec.get("gpu_power_limit_watts"),
        }
        for i in range(spec.get("gpus", 0))
    ]
    return {
        "node": spec["name"],
        "agent_version": "sim",
        "interval_seconds": DEFAULT_INTERVAL_SECONDS,
        "inventory": {
            "gpus": gpus,
            "cpu_cores": spec.get("cpu_cores", 0),
            "memory_gib": spec.get("memory_gib", 0),
            "hostname": spec["name"],
            "fabric": spec.get("fabric") or "",
        },
        "labels": dict(spec.get("labels") or {}),
        "sensors": {},
        "replicas": [],
    }


def gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-sim-{node_name}-{index}"


# -- the simulated runtime -------------------------------------------------------------------------------


@dataclass
class SimReplica:
    """A replica the simulated runtime runs: its GPUs, its state and since when (monotonic seconds)."""

    id: int
    gpus: tuple[int, ...]
    state: str
    since: float


@dataclass
class SimRuntime:
    """What a node's runtime would report: assigned replicas start, are ready after a delay, and stop."""

    ready_delay: float = DEFAULT_READY_DELAY_SECONDS
    replicas: dict[int, SimReplica] = field(default_factory=dict)

    def assign(self, assignments: Iterable[Mapping[str, Any]], now: float) -> None:
        """Take the heartbeat answer's replicas: new ones start; ones no longer listed begin stopping."""
        wanted = {int(a["id"]): tuple(int(g) for g in a.get("gpus") or ()) for a in assignments}
        for replica_id, gpus in wanted.items():
            current = self.replicas.get(replica_id)
            if current is None or current.state == "stopping":
                self.replicas[replica_id] = SimReplica(replica_id, gpus, "starting", now)
            elif current.gpus != gpus:
                current.gpus = gpus
        for replica_id, replica in self.replicas.items():
            if replica_id not in wanted and replica.state != "stopping":
                replica.state, replica.since = "stopping", now

    def states(self, now: float) -> list[dict[str, Any]]:
        """The states to report now; a starting replica past the delay is ready, a stopping one is reported once."""
        out = []
        for replica in list(self.replicas.values()):
            if replica.state == "starting" and now - replica.since >= self.ready_delay:
                replica.state, replica.since = "ready", now
            out.append({"id": replica.id, "state": replica.state})
            if replica.state == "stopping":
                del self.replicas[replica.id]
        return out

    def gpu_states(self) -> dict[int, str]:
        """GPU index → the state of the replica running on it (starting or ready); idle GPUs are absent."""
        out: dict[int, str] = {}
        for replica in self.replicas.values():
            if replica.state in ("starting", "ready"):
                for index in replica.gpus:
                    # A ready replica's load wins over a starting one sharing the card.
                    if out.get(index) != "ready":
                        out[index] = replica.state
        return out


# -- the sensor model ------------------------------------------------------------------------------------


class SimNode:
    """One simulated agent: its spec, a seeded random source, its runtime and sensors that follow load."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        *,
        interval: int = DEFAULT_INTERVAL_SECONDS,
        ready_delay: float = DEFAULT_READY_DELAY_SECONDS,
        seed: int = 0,
    ):
        self.spec = dict(spec)
        self.name: str = spec["name"]
        self.interval = interval
        self.runtime = SimRuntime(ready_delay=ready_delay)
        # A string seed hashes the same in every run, so a node's readings repeat run to run.
        self.rng = random.Random(f"{seed}:{self.name}")
        self.power_limit = float(spec.get("gpu_power_limit_watts") or DEFAULT_GPU_POWER_LIMIT_WATTS)
        self.inlet_base = self.rng.uniform(*INLET_CELSIUS)
        # Each card's serving level wanders inside the loaded band, as traffic does.
        self.gpu_level = [self.rng.uniform(*LOADED_GPU_WATTS) for _ in range(spec.get("gpus", 0))]

    def gpu_sensors(self, index: int, state: str | None) -> dict[str, Any]:
        """One GPU's readings for the load on it: None (idle), 'starting' (loading weights) or 'ready'."""
        rng = self.rng
        if state == "ready":
            level = self.gpu_level[index] + rng.gauss(0, 20)
            self.gpu_level[index] = min(max(level, LOADED_GPU_WATTS[0]), LOADED_GPU_WATTS[1])
            demand = self.gpu_level[index]
        elif state == "starting":
            demand = rng.uniform(*STARTING_GPU_WATTS)
        else:
            demand = IDLE_GPU_WATTS + rng.gauss(0, 3)
        reasons = []
        if demand >= self.power_limit:
            demand = self.power_limit * rng.uniform(0.97, 1.0)
            reasons.append("sw_power_cap")
        power = max(demand, 0.0)
        temperature = IDLE_GPU_CELSIUS + (power - IDLE_GPU_WATTS) * CELSIUS_PER_GPU_WATT + rng.gauss(0, 0.5)
        if temperature >= THERMAL_SLOWDOWN_CELSIUS:
            reasons.append("sw_thermal")
        return {
            "index": index,
            "uuid": gpu_uuid(self.name, index),
            "temperature_celsius": round(temperature, 1),
            "memory_temperature_celsius": round(temperature + HBM_ABOVE_GPU_CELSIUS + rng.gauss(0, 0.5), 1),
            "power_watts": round(power, 1),
            "power_limit_watts": self.power_limit,
            "throttle_reasons": reasons,
        }

    def sensors(self) -> dict[str, Any]:
        """The node's readings now: its GPUs under their replicas' load, CPU power and temperature, inlet."""
        load = self.runtime.gpu_states()
        gpus = [self.gpu_sensors(i, load.get(i)) for i in range(self.spec.get("gpus", 0))]
        loaded = sum(1 for state in load.values() if state == "ready")
        cpu_power = IDLE_CPU_WATTS + CPU_WATTS_PER_LOADED_GPU * loaded + self.rng.gauss(0, 5)
        return {
            "gpus": gpus,
            "cpu_power_watts": round(max(cpu_power, 0.0), 1),
            "cpu_temperature_celsius": round(38.0 + 0.1 * cpu_power + self.rng.gauss(0, 0.5), 1),
            "inlet_temperature_celsius": round(self.inlet_base + self.rng.gauss(0, 0.2), 1),
        }

    def heartbeat(self, now: float) -> dict[str, Any]:
        """The heartbeat to send now: inventory, labels, replica states, then sensors for that load."""
        body = heartbeat_for(self.spec)
        body["interval_seconds"] = self.interval
        body["inventory"]["gpus"] = [
            {**gpu, "power_limit_watts": self.power_limit} for gpu in body["inventory"]["gpus"]
        ]
        body["replicas"] = self.runtime.states(now)
        body["sensors"] = self.sensors()
        return body

    def take_answer(self, answer: Mapping[str, Any], now: float) -> None:
        """Apply the heartbeat answer: the replicas this node must run."""
        self.runtime.assign(answer.get("replicas") or [], now)


# -- driving them over HTTP ------------------------------------------------------------------------------


@dataclass
class BeatResult:
    """How one heartbeat went: ok, or the error a person reads, and how long it took."""

    node: str
    ok: bool
    seconds: float
    error: str = ""


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
        return BeatResult(node.name, False, clock() - start, f"{type(exc).__name__}: {exc}")
    if response.status_code != 200:
        return BeatResult(node.name, False, clock() - start, _error_text(response))
    node.take_answer(response.json(), clock())
    return BeatResult(node.name, True, clock() - start)


def _client(server: str, connections: int) -> Any:
    import httpx

    # httpx logs every request at INFO: a thousand nodes would drown what the sim has to say.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=server.rstrip("/"), limits=limits, timeout=30.0)


async def beat_round(
    nodes: list[SimNode], tokens: Mapping[str, str], server: str, *, connections: int = 64
) -> list[BeatResult]:
    """One heartbeat from every node, `connections` at a time."""
    async with _client(server, connections) as client:
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
) -> None:
    """Every node beats every `interval` seconds, their starts spread over one interval, until `stop` is set."""
    stop = stop or asyncio.Event()
    async with _client(server, connections) as client:

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
