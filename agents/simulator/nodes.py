"""Simulated nodes: each keeps a seeded random source, a simulated replica runtime and a sensor model
that follows load.

The runtime: the replicas the heartbeat answer assigns go `starting`, then `ready` after a delay; those
no longer assigned are reported `stopping` once, then dropped. The sensors: GPUs running a replica draw
and heat up, idle ones sit near idle. Plain logic: no HTTP, no Django.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.simulator.cluster import DEFAULT_INTERVAL_SECONDS, gpu_uuid, heartbeat_for

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
            "slowdown_temperature_celsius": THERMAL_SLOWDOWN_CELSIUS,
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
