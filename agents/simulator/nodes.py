"""Simulated nodes: each keeps a seeded random source, a simulated replica runtime and a sensor model
that follows load.

The runtime: the replicas the heartbeat answer assigns go `starting`, then `ready` after a delay; those
no longer assigned are reported `stopping` once, then dropped. The sensors: GPUs running a replica draw
and heat up, idle ones sit near idle. Plain logic: no HTTP, no Django.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.node.protocol import Capping, HeartbeatError, validate_capping
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
# A card in poor airflow: above about 600 W it passes its slowdown temperature (idle, it reads as any other).
POOR_AIRFLOW_SHARE = 0.3
POOR_AIRFLOW_CELSIUS = 16.0
IDLE_CPU_WATTS = 110.0
CPU_WATTS_PER_LOADED_GPU = 12.0
INLET_CELSIUS = (21.0, 25.0)  # inside ASHRAE's recommended 18–27 °C

# The throughput model (REFERENCE.md, "Capping and LLM inference"). A card's draw is idle plus a dynamic
# part that grows with the square of its SM clock (voltage follows frequency); a power cap below the draw
# the load wants lowers the clock until the draw fits; a clock lock caps the clock outright. Tokens come
# from decode, memory bound (flat with the clock down to DECODE_KNEE of the top clock, then falling with
# it), and prefill, compute bound (proportional to the clock). So decode is untouched by a cap above its
# draw, and a moderate clock lock costs few tokens and saves more power: energy per token falls.
MAX_SM_CLOCK_MHZ = 1980  # Hopper SXM's top SM clock: a card's unless its spec says gpu_max_sm_clock_mhz
MIN_POWER_LIMIT_FRACTION = 200 / 700  # the lowest limit a Hopper SXM card accepts, of its default
MIN_CLOCK_FRACTION = 0.1
TOKENS_PER_SECOND_PER_GPU = 2400.0  # generated tokens/s of one card serving at the top of the loaded band
DECODE_SHARE = 0.85  # of a serving card's time
DECODE_KNEE = 0.6


def airflow_offsets(seed: str, gpus: int) -> list[float]:
    """How much warmer than the model each card runs, °C: in about one node of POOR_AIRFLOW_SHARE one card
    sits where the air reaches it warm (POOR_AIRFLOW_CELSIUS), and passes its slowdown temperature at the
    top of the loaded band. Its own generator: the node's readings otherwise repeat as they did."""
    rng = random.Random(f"{seed}:airflow")
    offsets = [0.0] * gpus
    if gpus and rng.random() < POOR_AIRFLOW_SHARE:
        offsets[rng.randrange(gpus)] = POOR_AIRFLOW_CELSIUS
    return offsets


def clock_fraction(
    *, demand_watts: float, limit_watts: float, locked_max_mhz: int | None, top_mhz: int = MAX_SM_CLOCK_MHZ
) -> float:
    """The fraction of its top SM clock (`top_mhz`) a card runs at: lowered by a power cap below its demand,
    or a lock."""
    fraction = 1.0
    if limit_watts < demand_watts and demand_watts > IDLE_GPU_WATTS:
        fraction = math.sqrt(max(limit_watts - IDLE_GPU_WATTS, 0.0) / (demand_watts - IDLE_GPU_WATTS))
    if locked_max_mhz is not None:
        fraction = min(fraction, locked_max_mhz / top_mhz)
    return max(fraction, MIN_CLOCK_FRACTION)


def drawn_watts(demand_watts: float, fraction: float) -> float:
    """What a card wanting `demand_watts` at the top clock draws at `fraction` of it."""
    return IDLE_GPU_WATTS + max(demand_watts - IDLE_GPU_WATTS, 0.0) * fraction**2


def throughput_fraction(fraction: float) -> float:
    """The share of its full-clock tokens/s a serving card keeps at `fraction` of the top clock."""
    return DECODE_SHARE * min(1.0, fraction / DECODE_KNEE) + (1 - DECODE_SHARE) * fraction


def tokens_per_second(demand_watts: float, fraction: float) -> float:
    """Generated tokens/s of a serving card: its load (the draw it wants) scaled by what its clock allows."""
    load = max(demand_watts - IDLE_GPU_WATTS, 0.0) / (LOADED_GPU_WATTS[1] - IDLE_GPU_WATTS)
    return TOKENS_PER_SECOND_PER_GPU * load * throughput_fraction(fraction)


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
        capping_permitted: bool = True,
    ):
        """capping_permitted=False: an agent without root, whose GPUs keep their defaults whatever is asked."""
        self.spec = dict(spec)
        self.name: str = spec["name"]
        self.interval = interval
        self.runtime = SimRuntime(ready_delay=ready_delay)
        # A string seed hashes the same in every run, so a node's readings repeat run to run.
        self.rng = random.Random(f"{seed}:{self.name}")
        self.power_limit = float(spec.get("gpu_power_limit_watts") or DEFAULT_GPU_POWER_LIMIT_WATTS)
        self.max_sm_clock = int(spec.get("gpu_max_sm_clock_mhz") or MAX_SM_CLOCK_MHZ)
        self.inlet_base = self.rng.uniform(*INLET_CELSIUS)
        # Each card's serving level wanders inside the loaded band, as traffic does.
        self.gpu_level = [self.rng.uniform(*LOADED_GPU_WATTS) for _ in range(spec.get("gpus", 0))]
        self.gpu_airflow = airflow_offsets(f"{seed}:{self.name}", spec.get("gpus", 0))
        self.capping: Capping | None = None
        self.capping_permitted = capping_permitted
        self.gpu_tokens_per_second: dict[int, float] = {}

    def gpu_cap(self, index: int) -> tuple[float, tuple[int, int] | None, str | None]:
        """What GPU `index` holds under the last capping answer: enforced limit, locked clocks, status."""
        want = self.capping.for_gpu(gpu_uuid(self.name, index)) if self.capping is not None else None
        if want is None:
            return self.power_limit, None, None
        if not self.capping_permitted:
            return self.power_limit, None, "not permitted"
        if want.power_limit_watts is not None:
            low = self.power_limit * MIN_POWER_LIMIT_FRACTION
            return min(max(want.power_limit_watts, low), self.power_limit), None, None
        if want.locked_clocks_mhz is not None:
            low, high = want.locked_clocks_mhz
            return self.power_limit, (min(low, self.max_sm_clock), min(high, self.max_sm_clock)), None
        return self.power_limit, None, None

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
        limit, locked, status = self.gpu_cap(index)
        fraction = clock_fraction(
            demand_watts=demand, limit_watts=limit, locked_max_mhz=locked[1] if locked else None,
            top_mhz=self.max_sm_clock,
        )
        power = max(drawn_watts(demand, fraction), 0.0)
        if power >= limit * 0.97:
            # Held at its limit: the firmware's power cap, with the small wobble a real card shows.
            power = min(power, limit) * rng.uniform(0.97, 1.0)
            reasons.append("sw_power_cap")
        noise = rng.gauss(0, 0.5)
        # Poor airflow shows under load: its degrees come with the draw (none idle, all at the band's top).
        per_watt = CELSIUS_PER_GPU_WATT + self.gpu_airflow[index] / (LOADED_GPU_WATTS[1] - IDLE_GPU_WATTS)
        temperature = IDLE_GPU_CELSIUS + (power - IDLE_GPU_WATTS) * per_watt + noise
        if temperature >= THERMAL_SLOWDOWN_CELSIUS:
            # Past its slowdown temperature the card lowers its clocks until it holds there: it draws what
            # keeps it at the slowdown temperature, and serves fewer tokens (the dynamic draw goes with the
            # square of the clock).
            reasons.append("sw_thermal")
            held = IDLE_GPU_WATTS + (THERMAL_SLOWDOWN_CELSIUS - IDLE_GPU_CELSIUS) / per_watt
            if power > held > IDLE_GPU_WATTS:
                fraction *= math.sqrt((held - IDLE_GPU_WATTS) / (power - IDLE_GPU_WATTS))
                power = held
            temperature = THERMAL_SLOWDOWN_CELSIUS + abs(noise)
        if state == "ready":
            self.gpu_tokens_per_second[index] = tokens_per_second(demand, fraction)
        else:
            self.gpu_tokens_per_second.pop(index, None)
        return {
            "index": index,
            "uuid": gpu_uuid(self.name, index),
            "temperature_celsius": round(temperature, 1),
            "memory_temperature_celsius": round(temperature + HBM_ABOVE_GPU_CELSIUS + rng.gauss(0, 0.5), 1),
            "slowdown_temperature_celsius": THERMAL_SLOWDOWN_CELSIUS,
            "power_watts": round(power, 1),
            "power_limit_watts": limit,
            "throttle_reasons": reasons,
            **self._capping_sensors(limit, locked, status),
        }

    def _capping_sensors(self, limit: float, locked: tuple[int, int] | None, status: str | None) -> dict[str, Any]:
        """The capping keys of a GPU's readings, as the agent reports them (agents.node.capping)."""
        out: dict[str, Any] = {
            "enforced_power_limit_watts": limit,
            "default_power_limit_watts": self.power_limit,
            "max_sm_clock_mhz": self.max_sm_clock,
        }
        if locked is not None:
            out["locked_clocks_mhz"] = list(locked)
        if status is not None:
            out["capping"] = status
        return out

    def replica_throughput(self) -> list[dict[str, Any]]:
        """Each ready replica's generated tokens/s: the sum over its GPUs (from the last sensors)."""
        out = []
        for replica in sorted(self.runtime.replicas.values(), key=lambda r: r.id):
            figures = [self.gpu_tokens_per_second[i] for i in replica.gpus if i in self.gpu_tokens_per_second]
            if replica.state == "ready" and figures:
                out.append({"id": replica.id, "tokens_per_second": round(sum(figures), 1)})
        return out

    def sensors(self) -> dict[str, Any]:
        """The node's readings now: its GPUs under their replicas' load, CPU power and temperature, inlet."""
        load = self.runtime.gpu_states()
        gpus = [self.gpu_sensors(i, load.get(i)) for i in range(self.spec.get("gpus", 0))]
        loaded = sum(1 for state in load.values() if state == "ready")
        cpu_power = IDLE_CPU_WATTS + CPU_WATTS_PER_LOADED_GPU * loaded + self.rng.gauss(0, 5)
        return {
            "gpus": gpus,
            "replicas": self.replica_throughput(),
            "cpu_power_watts": round(max(cpu_power, 0.0), 1),
            "cpu_temperature_celsius": round(38.0 + 0.1 * cpu_power + self.rng.gauss(0, 0.5), 1),
            "inlet_temperature_celsius": round(self.inlet_base + self.rng.gauss(0, 0.2), 1),
        }

    def heartbeat(self, now: float) -> dict[str, Any]:
        """The heartbeat to send now: inventory, labels, replica states, then sensors for that load."""
        body = heartbeat_for(self.spec)
        body["interval_seconds"] = self.interval
        body["inventory"]["gpus"] = [
            {**gpu, "power_limit_watts": self.gpu_cap(gpu["index"])[0]} for gpu in body["inventory"]["gpus"]
        ]
        body["replicas"] = self.runtime.states(now)
        body["sensors"] = self.sensors()
        return body

    def take_answer(self, answer: Mapping[str, Any], now: float) -> None:
        """Apply the heartbeat answer: the replicas this node must run, the capping its GPUs must hold."""
        self.runtime.assign(answer.get("replicas") or [], now)
        try:
            self.capping = validate_capping(answer.get("capping"))
        except HeartbeatError:
            pass  # as the agent does: a block that breaks the protocol changes nothing
