"""A cooling failure three ways — nothing, capping, shedding — on a simulated 1,000-node facility.

Replays llmgw/demo/scenarios/crac-failure.yaml (its hot track drives the ten racks of row 1, 250 nodes;
the other track the 30 racks of rows 2–4) on a simulated clock, one step per 30 s evaluation, for the
scenario's 50 minutes. Nothing sleeps; it takes a second or two.

How it is simulated (every figure is the model's, not a measurement):
- 1,000 nodes of 8 Hopper SXM cards (700 W default limit), 25 to a rack. 900 run one 8-GPU replica
  each (20 % batch, 60 % standard, 20 % critical, by node order); 100 in rows 2–4 are free, the room
  a shed replacement needs. A serving card wants 600 W; its tokens/s and draw under a cap follow the
  simulator's throughput model (agents.simulator.nodes: decode flat down to 60 % of the top clock,
  prefill proportional to the clock, draw idle + dynamic × clock²).
- The scenario's inlet is the air with the row's full heat load. The inlet's rise above the 24 °C
  supply scales with the heat the row's cards dump: a row drawing 80 % of its nominal load rises
  80 % as far.
- Each rack's condition comes from facility.conditions.evaluate (default thresholds, enforce mode).
- Heat costs tokens: above the hot threshold (32 °C) a card's firmware slows it to 70 % of its clock,
  above 34 °C to 50 % (thermal slowdown) — what capping and shedding are there to avoid.
- Capping: facility.capping's loop (floor 0.7, steps of 10 % of the default per evaluation, restore
  after 10 minutes ok) on every warm or hot rack's cards.
- Shedding: facility.shedding's rule (shed_after 10 m, interval 5 m, enforce mode): one replica per
  hot rack per interval, lowest class first, critical never; the replacement starts on a free node
  outside row 1 and both run for its 2-minute start before the old one stops (replacement first: no
  tokens lost to the move itself).

Tokens served sums every replica's tokens over the replay; tokens lost is what the same replicas
would have served at full clock, less what they served. Time above the hot threshold: the minutes any
row-1 rack's condition was ``hot``, and the rack-minutes its inlet read above 32 °C.

Run: ``.venv/bin/python bench/thermal_event.py``. Prints a table, asserts nothing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.simulator.nodes import clock_fraction, drawn_watts, tokens_per_second  # noqa: E402
from facility.conditions import HOT, INLET, DomainState, Reading, Thresholds, evaluate  # noqa: E402
from facility.response import CappingConfig, ShedRule, capped_step, restored_step  # noqa: E402
from facility.sources import parse_scenario  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[1] / "llmgw" / "demo" / "scenarios" / "crac-failure.yaml"
NODES, GPUS, PER_RACK = 1000, 8, 25
SERVING_NODES = 900
ROW1_RACKS = 10
DEFAULT_LIMIT = 700.0
DEMAND = 600.0
SUPPLY_C = 24.0
STEP = 30.0
START_SECONDS = 120.0
CLASSES = ("batch", "standard", "standard", "standard", "critical")  # 20 / 60 / 20 %
CLASS_ORDER = {"batch": 0, "standard": 1, "critical": 2}


def thermal_fraction(inlet: float) -> float:
    """The share of its clock a card keeps at this inlet (firmware thermal slowdown)."""
    return 0.5 if inlet > 34 else 0.7 if inlet > 32 else 1.0


@dataclass
class Rack:
    name: str
    row1: bool
    replicas: list[tuple[int, str]] = field(default_factory=list)  # (replica id, class) serving here
    limit: float = DEFAULT_LIMIT
    ok_since: float | None = None
    state: DomainState = field(default_factory=DomainState)
    last_shed: float | None = None


def run(mode: str) -> dict[str, float]:
    scenario = parse_scenario(yaml.safe_load(SCENARIO.read_text()))
    hot_track = next(t for t in scenario.tracks if "rack:r1-01" in {str(d) for d in t.domains})
    cool_track = next(t for t in scenario.tracks if t is not hot_track)
    racks = [Rack(f"r{1 + i // 10}-{1 + i % 10:02d}", i < ROW1_RACKS) for i in range(NODES // PER_RACK)]
    for node in range(SERVING_NODES):
        racks[node // PER_RACK].replicas.append((node, CLASSES[node % len(CLASSES)]))
    free_outside = NODES - SERVING_NODES  # free nodes, all in rows 2-4
    moving: list[tuple[float, Rack, tuple[int, str]]] = []  # replacement ready at, old rack, replica
    moved: list[tuple[int, str]] = []  # replicas now on a cool row's node
    capping = CappingConfig(enabled=True)
    shed = ShedRule(enabled=True)
    thresholds = Thresholds()
    served = full = hot_minutes = rack_minutes_hot = 0.0
    nominal = {r.name: len(r.replicas) * GPUS * DEMAND for r in racks}
    t = 0.0
    while t <= scenario.duration:
        any_hot = False
        for rack in racks:
            track = hot_track if rack.row1 else cool_track
            air = track.value_at(t)
            draw = len(rack.replicas) * GPUS * drawn_watts(DEMAND, clock_fraction(
                demand_watts=DEMAND, limit_watts=rack.limit, locked_max_mhz=None))
            share = draw / nominal[rack.name] if nominal[rack.name] else 0.0
            inlet = SUPPLY_C + max(air - SUPPLY_C, 0.0) * min(share, 1.0) if rack.row1 else air
            rack.state, _ = evaluate(rack.state, {INLET: Reading(inlet, t, 120.0)}, t, thresholds)
            hot = rack.state.condition == HOT
            any_hot = any_hot or (hot and rack.row1)
            if inlet > thresholds.hot_inlet_c:
                rack_minutes_hot += STEP / 60
            clock = min(clock_fraction(demand_watts=DEMAND, limit_watts=rack.limit, locked_max_mhz=None),
                        thermal_fraction(inlet))
            per_replica = GPUS * tokens_per_second(DEMAND, clock) * STEP
            served += len(rack.replicas) * per_replica
            full += len(rack.replicas) * GPUS * tokens_per_second(DEMAND, 1.0) * STEP
            pressed = rack.state.condition in ("warm", HOT)
            if mode == "capping":
                if pressed:
                    rack.limit, rack.ok_since = capped_step(rack.limit, DEFAULT_LIMIT, capping), None
                else:
                    rack.ok_since = t if rack.ok_since is None else rack.ok_since
                    if t - rack.ok_since >= capping.restore_after:
                        rack.limit = restored_step(rack.limit, DEFAULT_LIMIT, capping)
            if mode == "shedding" and hot and rack.state.since is not None and t - rack.state.since >= shed.shed_after:
                due = rack.last_shed is None or t - rack.last_shed >= shed.interval
                candidates = sorted((r for r in rack.replicas if r[1] != "critical"),
                                    key=lambda r: (CLASS_ORDER[r[1]], -r[0]))
                if due and candidates and free_outside > 0:
                    replica = candidates[0]
                    free_outside -= 1
                    moving.append((t + START_SECONDS, rack, replica))
                    rack.last_shed = t
        # Replicas moved serve from a cool node (full clock), started ones take over from the old.
        served += len(moved) * GPUS * tokens_per_second(DEMAND, 1.0) * STEP
        full += len(moved) * GPUS * tokens_per_second(DEMAND, 1.0) * STEP
        for item in [m for m in moving if m[0] <= t]:
            moving.remove(item)
            _, old, replica = item
            old.replicas.remove(replica)
            moved.append(replica)
        if any_hot:
            hot_minutes += STEP / 60
        t += STEP
    return {"served": served, "lost": full - served, "moved": len(moved) + len(moving),
            "hot_minutes": hot_minutes, "rack_minutes": rack_minutes_hot}


def main() -> None:
    rows = [(mode, run(mode)) for mode in ("nothing", "capping", "shedding")]
    header = f"{'RESPONSE':<10} {'TOKENS SERVED':>15} {'TOKENS LOST':>13} {'LOST %':>7} {'MOVED':>6} " \
             f"{'HOT MIN':>8} {'RACK-MIN > 32 °C':>17}"
    print(header)
    for mode, r in rows:
        total = r["served"] + r["lost"]
        print(f"{mode:<10} {r['served'] / 1e9:>13.2f} G {r['lost'] / 1e6:>11.1f} M {100 * r['lost'] / total:>6.2f}% "
              f"{r['moved']:>6d} {r['hot_minutes']:>8.1f} {r['rack_minutes']:>17.1f}")


if __name__ == "__main__":
    main()
