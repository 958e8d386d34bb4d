"""The planner's own speed: placements per second and latency, at 1,000 and 10,000 nodes.

A synthetic cluster of 8-GPU nodes, 25 to a rack, each rack on two PDUs (half its nodes on each),
with power budgets on every rack and PDU that bind before the cards run out. Twenty models with
8-, 4-, 2- and 1-GPU profiles take turns placing one replica at a time through the index
(plan, then apply the plan as a commit would), until none fits. Each placement is timed; the plain
path (``plan_replica``, every node checked) is timed on a sample for comparison.

Run: ``.venv/bin/python bench/planner.py`` (``--nodes 1000`` to pick one size). Prints figures, asserts
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from facility.domains import domains_of  # noqa: E402
from facility.power import Budget, FacilitySettings  # noqa: E402
from placement.index import PlacementIndex  # noqa: E402
from placement.planner import (  # noqa: E402
    FacilityView,
    NodeView,
    NoFit,
    Profile,
    ReplicaRequest,
    plan_replica,
)
from placement.selector import parse_selector  # noqa: E402

NODES_PER_RACK = 25
GPU_SIZES = (8, 8, 8, 4, 4, 4, 2, 2, 1, 1)


def cluster(count: int) -> tuple[list[NodeView], FacilityView]:
    """``count`` nodes in racks of 25, two PDUs a rack, budgets that bind near 85% of the cards."""
    nodes = []
    budgets = {}
    for i in range(count):
        rack = f"r{i // NODES_PER_RACK:03}"
        pdu = f"{rack}-{'ab'[i % 2]}"
        labels = {
            "llmgw.io/site": "sto1",
            "llmgw.io/row": f"{i // (NODES_PER_RACK * 10):02}",
            "llmgw.io/rack": rack,
            "llmgw.io/pdu": pdu,
            "gpu.model": "H200" if i % 3 else "H100",
            "gpu.memory_gib": "141" if i % 3 else "80",
        }
        nodes.append(
            NodeView(
                name=f"gpu{i:05}",
                ready=True,
                cordoned=False,
                labels=labels,
                domains=domains_of(labels),
                fabric=f"ib{i // 200}",
                gpus_total=8,
                free_gpus=tuple(range(8)),
                cpu_cores_total=128,
                cpu_cores_free=128,
                memory_gib_total=2048,
                memory_gib_free=2048,
                gpu_power_limit_watts=700,
                placed_watts=0,
                measured_watts=None,
                weights=frozenset({f"model{i % 20:02}"}) if i % 7 == 0 else frozenset(),
                replicas=0,
            )
        )
    # A full node draws 350 + 8 × 700 = 5,950 W. Caps (less the 10% margin) hold about 85% of that.
    per_node = 5950 * 0.85 / 0.9
    members = Counter(d for node in nodes for d in node.domains if d.level in ("rack", "pdu"))
    for domain, size in members.items():
        budgets[domain] = Budget(domain, cap_watts=round(per_node * size, -2), other_watts=500)
    return nodes, FacilityView(settings=FacilitySettings(), budgets=budgets, holds={})


def models() -> list[ReplicaRequest]:
    h200 = parse_selector("gpu.model in (H100,H200), gpu.memory_gib >= 80")
    return [
        ReplicaRequest(
            model=f"model{m:02}",
            profile=Profile(
                gpus=GPU_SIZES[m % len(GPU_SIZES)],
                cpu_cores=8,
                memory_gib=128,
                selector=h200 if m % 4 == 0 else None,
            ),
        )
        for m in range(20)
    ]


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(count: int, plain_sample: int) -> None:
    nodes, facility = cluster(count)
    started = time.perf_counter()
    index = PlacementIndex(nodes, facility)
    built = time.perf_counter() - started
    existing: dict[str, list[frozenset[str]]] = {}
    open_models = models()
    timings: list[float] = []
    plain: list[float] = []
    nofits = 0
    while open_models:
        for model in list(open_models):
            req = dataclasses.replace(model, existing=tuple(existing.get(model.model, ())))
            if len(plain) < plain_sample and len(timings) % 5 == 0:
                view = index.nodes()
                t0 = time.perf_counter()
                plan_replica(req, view, facility)
                plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            result = index.plan(req)
            if isinstance(result, NoFit):
                nofits += 1
                open_models.remove(model)
                continue
            index.apply(result)
            timings.append(time.perf_counter() - t0)
            existing.setdefault(req.model, []).append(result.nodes)
    free = sum(len(n.free_gpus) for n in index.nodes())
    total = sum(n.gpus_total for n in nodes)
    racks = [d for d in facility.budgets if d.level == "rack"]
    use = max(index.use_watts(d) / facility.budgets[d].limit_watts(0.1) for d in racks)
    print(
        f"{count:>6} nodes, {len(racks)} racks, {len(facility.budgets) - len(racks)} PDUs: "
        f"index built in {built * 1000:.0f} ms"
    )
    print(
        f"        index: {len(timings)} placements (plan + apply), "
        f"{len(timings) / sum(timings):,.0f} placements/s, "
        f"p50 {percentile(timings, 0.5) * 1e6:,.0f} µs, p99 {percentile(timings, 0.99) * 1e6:,.0f} µs; "
        f"ended with {free} of {total} GPUs free, fullest rack at {use:.0%} of its limit"
    )
    if plain:
        print(
            f"        plain plan_replica on a sample of {len(plain)}: "
            f"p50 {percentile(plain, 0.5) * 1e6:,.0f} µs, p99 {percentile(plain, 0.99) * 1e6:,.0f} µs"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="cluster size (repeatable)")
    parser.add_argument("--plain-sample", type=int, default=100, help="plain-path placements to time")
    args = parser.parse_args()
    for count in args.nodes or [1000, 10000]:
        run(count, args.plain_sample)


if __name__ == "__main__":
    main()
