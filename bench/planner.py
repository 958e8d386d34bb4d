"""The planner's own speed: placements per second and latency, at 1,000 and 10,000 nodes, with drifting readings.

A synthetic cluster of 8-GPU nodes, 25 to a rack, each rack on two PDUs (half its nodes on each),
with power budgets on every rack and PDU that bind before the cards run out; a few racks warm and one
hot under enforce mode. Every node's sensors read a draw of its own (an idle draw of 700-1,300 W plus
80-95 % of what is placed on it), so no two nodes share a measured figure, and the readings drift:
between every two plans ``--readings`` nodes (default 1, more than heartbeats bring to one reconcile's
index) report a new reading, which the index takes (``update_node``). Twenty models with 8-, 4-, 2- and
1-GPU profiles, each measured at its own tokens per joule on H100 and H200, take turns placing one
replica at a time through the index (plan, then apply the plan as a commit would), until none fits.
Each placement is timed with the readings that came before it; the plain path (``plan_replica``,
every node checked) is timed on a sample for comparison, in a pass of its own over the same placements
(timed between the index's, its 5 ms plans of 1,000 nodes left the index's next placements running on
cold caches: the index's figure was then the plain path's cost as much as its own).

``--index FILE`` times another placement/index.py beside this one (the code before a change, as
``git show HEAD~1:placement/index.py > /tmp/index_before.py`` leaves it), on the same cluster and the
same readings, alternating which goes first: on a shared machine only figures taken side by side
compare. Both are then loaded from their files the same way (a module imported as usual and one loaded
from a file did not time alike), and the medians of the rounds are printed.

The placements run with Python's cyclic garbage collector paused, as the product's placement runs do
(``placement.commit.collector_paused`` around ``reconcile_all`` and ``lanes_place``); ``--collector``
leaves it on, to see what it would cost.

Then the same with the example plugin loaded, its filter and its scorer (``placement.examples.rack_affinity``,
one node in ten labelled for two models; ``--no-plugin`` leaves it out): both say they read labels, so the
index keeps its incremental plans (their verdicts and keys kept until a label moves), and the plain path
with it — every plan of an index with a rule that does not say what it reads — is timed on a sample as
before. One run prints all three: the index with the built-ins only, with the plugin, and the plain path.

Run: ``.venv/bin/python bench/planner.py`` (``--nodes 1000`` to pick one size). Prints figures, asserts
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from facility.domains import domains_of  # noqa: E402
from facility.power import Budget, FacilitySettings  # noqa: E402
from placement.examples import rack_affinity  # noqa: E402
from placement.index import PlacementIndex  # noqa: E402
from placement.planner import (  # noqa: E402
    DomainCondition,
    FacilityView,
    NodeView,
    NoFit,
    Profile,
    ReplicaRequest,
    plan_replica,
)
from placement.plugins import REGISTRY  # noqa: E402
from placement.selector import parse_selector  # noqa: E402

NODES_PER_RACK = 25
GPU_SIZES = (8, 8, 8, 4, 4, 4, 2, 2, 1, 1)


def idle_watts(i: int) -> float:
    """Node i's idle draw: its own figure between 700 and 1,300 W."""
    return 700 + (i * 7919 % 6007) / 10


def reading(node: NodeView, i: int, rng: random.Random) -> NodeView:
    """The node with a new reading: its idle draw and 80-95 % of what is placed on it, no two alike."""
    return dataclasses.replace(node, measured_watts=idle_watts(i) + rng.uniform(0.80, 0.95) * node.placed_watts)


def cluster(count: int) -> tuple[list[NodeView], FacilityView]:
    """``count`` nodes in racks of 25, two PDUs a rack, budgets that bind near 85% of the cards."""
    nodes = []
    budgets = {}
    rng = random.Random(count)
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
        if i % 10 == 5:  # the example plugin's label: kept for two models (only read with it loaded)
            labels[rack_affinity.LABEL] = f"model{i % 20:02},model{(i + 1) % 20:02}"
        node = NodeView(
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
        nodes.append(reading(node, i, rng))
    # A full node draws 350 + 8 × 700 = 5,950 W. Caps (less the 10% margin) hold about 85% of that.
    per_node = 5950 * 0.85 / 0.9
    members = Counter(d for node in nodes for d in node.domains if d.level in ("rack", "pdu"))
    for domain, size in members.items():
        budgets[domain] = Budget(domain, cap_watts=round(per_node * size, -2), other_watts=500)
    # One rack in sixteen warm, one in a hundred hot, enforced: ranked after the ok ones, and refused.
    racks = sorted(d for d in members if d.level == "rack")
    conditions = {
        rack: DomainCondition("hot" if n % 100 == 7 else "warm", enforce=True, detail="inlet 31.0 °C for 6 min")
        for n, rack in enumerate(racks)
        if n % 16 == 3 or n % 100 == 7
    }
    return nodes, FacilityView(settings=FacilitySettings(), budgets=budgets, holds={}, conditions=conditions)


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
                tokens_per_joule=(("H100", 1.8 + m / 37), ("H200", 2.6 + m / 41)),
            ),
        )
        for m in range(20)
    ]


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def load_index(path: str | None, name: str = "placement._index_compared") -> type:
    """PlacementIndex from this tree, or from a copy of placement/index.py at ``path`` (as module ``name``)."""
    if path is None:
        return PlacementIndex
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.PlacementIndex


@dataclasses.dataclass
class Figures:
    """One run's figures."""

    built: float
    timings: list[float]
    cpu: list[float]  # each placement's CPU time: what a machine shared with other work does not inflate
    plain: list[float]
    free: int
    total: int
    fullest: float
    readings: int
    plans: list  # every plan's shards (to check that two indexes planned alike)


def run_once(
    count: int, plain_sample: int, index_class: type = PlacementIndex, readings: int = 1, collector: bool = False
) -> Figures:
    """Place until nothing fits; the readings of ``readings`` nodes move before each plan. The collector is
    paused meanwhile unless ``collector`` (placement.commit.collector_paused: this module stays free of
    Django, so it pauses it by hand)."""
    paused = not collector and gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _run_once(count, plain_sample, index_class, readings)
    finally:
        if paused:
            gc.enable()


def _run_once(count: int, plain_sample: int, index_class: type, readings: int) -> Figures:
    nodes, facility = cluster(count)
    rng = random.Random(1)
    started = time.perf_counter()
    index = index_class(nodes, facility)
    built = time.perf_counter() - started
    existing: dict[str, list[frozenset[str]]] = {}
    open_models = models()
    timings: list[float] = []
    cpu: list[float] = []
    plain: list[float] = []
    plans = []
    moved = 0
    while open_models:
        for model in list(open_models):
            req = dataclasses.replace(model, existing=tuple(existing.get(model.model, ())))
            if len(plain) < plain_sample and len(timings) % 5 == 0:
                view = index.nodes()
                t0 = time.perf_counter()
                plan_replica(req, view, facility)
                plain.append(time.perf_counter() - t0)
            drifted = []
            for _ in range(readings):
                i = rng.randrange(count)
                drifted.append(reading(index.node(nodes[i].name), i, rng))
            t0, c0 = time.perf_counter(), time.thread_time()
            for view in drifted:
                index.update_node(view)
            result = index.plan(req)
            if isinstance(result, NoFit):
                open_models.remove(model)
                continue
            index.apply(result)
            timings.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            moved += len(drifted)
            plans.append(result.shards)
            existing.setdefault(req.model, []).append(result.nodes)
    free = sum(len(n.free_gpus) for n in index.nodes())
    total = sum(n.gpus_total for n in nodes)
    racks = [d for d in facility.budgets if d.level == "rack"]
    fullest = max(index.use_watts(d) / facility.budgets[d].limit_watts(0.1) for d in racks)
    return Figures(built, timings, cpu, plain, free, total, fullest, moved, plans)


def line(label: str, figures: Figures) -> str:
    timings, cpu = figures.timings, figures.cpu
    return (
        f"        {label}: {len(timings)} placements (readings + plan + apply), "
        f"{len(timings) / sum(timings):,.0f} placements/s, "
        f"p50 {percentile(timings, 0.5) * 1e6:,.0f} µs, p99 {percentile(timings, 0.99) * 1e6:,.0f} µs; "
        f"by CPU time {len(cpu) / sum(cpu):,.0f}/s, p50 {percentile(cpu, 0.5) * 1e6:,.0f} µs, "
        f"p99 {percentile(cpu, 0.99) * 1e6:,.0f} µs (index built in {figures.built * 1000:.0f} ms)"
    )


def run(
    count: int, plain_sample: int, *, compare: str | None = None, rounds: int = 1, readings: int = 1,
    collector: bool = False, warmups: int = 1, plugin: bool = True,
) -> None:
    """Print the figures at ``count`` nodes; with ``compare``, that index's beside this one's, alternating;
    with ``plugin`` (and no ``compare``), the index's and the plain path's with the example filter loaded."""
    _, facility = cluster(count)
    racks = sum(1 for d in facility.budgets if d.level == "rack")
    print(
        f"{count:>6} nodes, {racks} racks, {len(facility.budgets) - racks} PDUs, "
        f"{sum(1 for c in facility.conditions.values() if c.condition == 'warm')} racks warm and "
        f"{sum(1 for c in facility.conditions.values() if c.condition == 'hot')} hot (enforced); "
        f"{readings} node's reading moves between every two plans; "
        f"the garbage collector {'on' if collector else 'paused, as in a placement run'}; "
        f"{warmups} untimed run{'s' if warmups != 1 else ''} first"
    )
    if compare:
        ours = load_index(str(Path(__file__).resolve().parents[1] / "placement" / "index.py"), "placement._index_ours")
        other = load_index(compare)
    else:
        ours, other = PlacementIndex, None
    for _ in range(warmups):
        # Untimed: a placer runs in a long-lived process, whose first placements ever pay once for what a
        # new process has not yet done (its allocator's arenas, the interpreter's specialising): 4-8 %
        # of a 1,000-node run here. Each timed run still builds its own index, shapes and rankings.
        for index_class in (ours, other) if other is not None else (ours,):
            run_once(count, 0, index_class, readings=readings, collector=collector)
    rates: dict[str, list[float]] = {"index": [], f"index of {compare}": []}
    plain: list[float] = []
    for number in range(rounds):
        runs = [("index", ours), (f"index of {compare}", other)] if other is not None else [("index", ours)]
        if number % 2:
            runs.reverse()  # the one run first is timed on a machine not yet warm: each goes first in turn
        done = {}
        for label, index_class in runs:
            done[label] = run_once(count, 0, index_class, readings=readings, collector=collector)
            print(line(label, done[label]))
            rates[label].append(len(done[label].cpu) / sum(done[label].cpu))
        figures = done["index"]
        if number == 0 and plain_sample:
            # The same placements again, the plain path timed on a sample of them (the index's not counted).
            plain = run_once(count, plain_sample, ours, readings=readings, collector=collector).plain
        if other is not None and done[f"index of {compare}"].plans != figures.plans:
            print("        (the two planned differently!)")
    if other is not None and rounds > 1:
        print("        medians by CPU time: " + "; ".join(f"{label} {statistics.median(r):,.0f}/s" for label, r in rates.items()))
    print(
        f"        ended with {figures.free} of {figures.total} GPUs free, fullest rack at {figures.fullest:.0%} of "
        f"its limit; {figures.readings} readings moved"
    )
    if plain:
        print(
            f"        plain plan_replica on a sample of {len(plain)}: "
            f"p50 {percentile(plain, 0.5) * 1e6:,.0f} µs, p99 {percentile(plain, 0.99) * 1e6:,.0f} µs"
        )
    if compare or not plugin:
        return
    # The example plugin, its filter and its scorer (both say they read labels: the index keeps its plans,
    # their verdicts and keys kept), one node in ten kept for two models; then the plain path with it on, as
    # every plan goes with a rule that does not say what it reads.
    # Its calls' time budget is the product's, on the wall clock: on a machine shared with other work a
    # call the process was paused in overran it, and the failing plugin sent the run the plain way.
    REGISTRY.call_seconds = 1.0
    for item in rack_affinity.FILTERS:
        REGISTRY.add_filter(item)
    for item in rack_affinity.SCORERS:
        REGISTRY.add_scorer(item)
    try:
        with_plugin = run_once(count, plain_sample, ours, readings=readings, collector=collector)
    finally:
        REGISTRY.remove_external()
    print(line("index, the example rack-affinity plugin loaded (filter and scorer, reads declared)", with_plugin))
    ours_rate = len(figures.cpu) / sum(figures.cpu)
    plugin_rate = len(with_plugin.cpu) / sum(with_plugin.cpu)
    print(f"        with the plugin: {plugin_rate / ours_rate:.0%} of the built-ins-only figure, by CPU time")
    if with_plugin.plain:
        print(
            f"        plain path (plan_replica, every node asked every rule) with it, on a sample of "
            f"{len(with_plugin.plain)}: {len(with_plugin.plain) / sum(with_plugin.plain):,.0f} plans/s, "
            f"p50 {percentile(with_plugin.plain, 0.5) * 1e6:,.0f} µs, "
            f"p99 {percentile(with_plugin.plain, 0.99) * 1e6:,.0f} µs"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="cluster size (repeatable)")
    parser.add_argument("--plain-sample", type=int, default=100, help="plain-path placements to time")
    parser.add_argument("--readings", type=int, default=1, help="nodes whose reading moves between two plans")
    parser.add_argument("--index", help="another placement/index.py to time beside this one's, alternating")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each index")
    parser.add_argument(
        "--warmups", type=int, default=1,
        help="untimed runs first (a placer's process is long-lived and warm; 0 times a new process's first run)",
    )
    parser.add_argument(
        "--no-plugin", action="store_true",
        help="leave out the run with the example rack-affinity plugin loaded",
    )
    parser.add_argument(
        "--collector", action="store_true",
        help="leave the garbage collector on while placing (a placement run pauses it)",
    )
    args = parser.parse_args()
    for flag, value, least in (
        ("--rounds", args.rounds, 1), ("--warmups", args.warmups, 0), ("--readings", args.readings, 0),
        ("--plain-sample", args.plain_sample, 0), *(("--nodes", count, 1) for count in args.nodes or ()),
    ):
        if value < least:
            parser.error(f"{flag} is {value}: at least {least}")
    for count in args.nodes or [1000, 10000]:
        run(
            count, args.plain_sample, compare=args.index, rounds=args.rounds, readings=args.readings,
            collector=args.collector, warmups=args.warmups, plugin=not args.no_plugin,
        )


if __name__ == "__main__":
    main()
