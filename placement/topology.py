"""Which of a node's free GPUs a shard takes: the set best joined, as the node's topology says.

A node reports how its GPUs are wired (agents.node.protocol's ``gpu_topology``: each pair's link as
``nvidia-smi topo -m`` prints it, each GPU's NUMA node). Links rank NV > PIX > PXB > PHB > NODE > SYS:
NVLink first, then PCIe paths ever further apart, SYS crossing the sockets. A tensor-parallel replica
runs at the pace of its slowest link, so the pick grows a set from each free GPU — adding, each time,
the GPU whose worst link to the set is best (one of the seed's NUMA node breaking ties, then the lowest
index) — and keeps the set whose worst link is best, then the one on the fewest NUMA nodes, then the
lowest indices, so the same node gives the same pick.

A node that reports no topology has unknown links: its shards take the lowest free indices, as they
did before nodes reported one.

Pure: no Django; the planner, the index and explain read it alike.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Links, best first; NV<n> is NVLink however many links. A link nobody could read ranks after them all.
LINK_NAMES = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
NVLINK = 0
UNKNOWN_LINK = len(LINK_NAMES)
_RANKS = {name: rank for rank, name in enumerate(LINK_NAMES)}
_NVLINK_RE = re.compile(r"NV[0-9]+")


@dataclass(frozen=True, slots=True)
class GpuTopology:
    """How a node's GPUs are wired, as the pick reads it: ``links[i][j]`` ranks the link between GPUs i and
    j (an index of LINK_NAMES, UNKNOWN_LINK where unread), ``numa[i]`` is GPU i's NUMA node (None where
    unread; -1 where the platform has one)."""

    links: tuple[tuple[int, ...], ...]
    numa: tuple[int | None, ...]

    def link(self, a: int, b: int) -> int:
        """The rank of the link between GPUs ``a`` and ``b`` (UNKNOWN_LINK for a GPU the matrix lacks)."""
        links = self.links
        if 0 <= a < len(links) and 0 <= b < len(links):
            return links[a][b]
        return UNKNOWN_LINK

    def numa_of(self, gpu: int) -> int | None:
        """GPU ``gpu``'s NUMA node, None when unknown."""
        return self.numa[gpu] if 0 <= gpu < len(self.numa) else None


def _rank(value: Any) -> int:
    if isinstance(value, str):
        if _NVLINK_RE.fullmatch(value):
            return NVLINK
        return _RANKS.get(value, UNKNOWN_LINK)
    return UNKNOWN_LINK


def topology_of(document: Any) -> GpuTopology | None:
    """The node's reported ``gpu_topology`` (``{"links": [[…]], "numa": […]}``) as the pick reads it; None
    when it reported none (``{}``). What does not read as a link or a node is unknown."""
    if not isinstance(document, Mapping) or not isinstance(document.get("links"), list):
        return None
    rows = document["links"]
    if not rows:
        return None
    links = tuple(
        tuple(NVLINK if i == j else _rank(value) for j, value in enumerate(row)) if isinstance(row, list) else ()
        for i, row in enumerate(rows)
    )
    size = len(links)
    if any(len(row) != size for row in links):
        return None
    nodes = document.get("numa")
    nodes = nodes if isinstance(nodes, list) else []
    numa = tuple(
        nodes[i] if i < len(nodes) and type(nodes[i]) is int else None  # not bool: JSON's true is no node
        for i in range(size)
    )
    return GpuTopology(links=links, numa=numa)


def numa_count(topology: GpuTopology, gpus: Iterable[int]) -> int:
    """How many NUMA nodes the GPUs are on; a GPU of unknown node counts as one of its own."""
    nodes = [topology.numa_of(g) for g in gpus]
    return len({n for n in nodes if n is not None}) + nodes.count(None)


def worst_link(topology: GpuTopology, gpus: Iterable[int]) -> int:
    """The rank of the worst link between any two of the GPUs (NVLINK for one GPU)."""
    members = list(gpus)
    return max(
        (topology.link(a, b) for i, a in enumerate(members) for b in members[i + 1 :]),
        default=NVLINK,
    )


@functools.lru_cache(maxsize=4096)  # a fleet has a few wirings and a few free sets on each
def gpus_pick(free: tuple[int, ...], count: int, topology: GpuTopology | None) -> tuple[int, ...]:
    """The ``count`` GPUs of ``free`` a shard takes, in index order (see the module's docstring): the
    lowest free indices where the topology is unknown. ``free`` holds at least ``count``."""
    ordered = tuple(sorted(free))
    if topology is None or count <= 1 or count >= len(ordered):
        return ordered[:count]
    best: tuple[int, int, tuple[int, ...]] | None = None
    for seed in ordered:
        home = topology.numa_of(seed)
        members = [seed]
        pool = [g for g in ordered if g != seed]
        worst = NVLINK
        while len(members) < count:
            pick = min(
                (max(topology.link(g, m) for m in members), topology.numa_of(g) != home, g) for g in pool
            )
            members.append(pick[2])
            pool.remove(pick[2])
            worst = max(worst, pick[0])
        chosen = tuple(sorted(members))
        key = (worst, numa_count(topology, chosen), chosen)
        if best is None or key < best:
            best = key
    assert best is not None
    return best[2]


def gpus_text(indices: Iterable[int], *, run: int = 2) -> str:
    """``[0, 1, 2, 3, 6]`` → ``0-3,6``: each run of at least ``run`` consecutive indices as a range
    (``run=3``: ``[0, 1, 4, 5]`` → ``0,1,4,5``, as the pick's words write a set)."""
    parts: list[str] = []
    group: list[int] = []
    for i in [*sorted(indices), None]:
        if group and i == group[-1] + 1:
            group.append(i)
            continue
        if group:
            parts.append(f"{group[0]}-{group[-1]}" if len(group) >= max(run, 2) else ",".join(map(str, group)))
        group = [] if i is None else [i]
    return ",".join(parts)


def pick_words(topology: GpuTopology | None, gpus: tuple[int, ...]) -> str | None:
    """Which GPUs and why, for explain's ``why:`` (``GPUs 0-3, NVLink-complete``, ``GPUs 0,1,4,5, one NUMA
    node``, ``GPUs 0,4, worst link SYS``); None for one GPU or a node that reports no topology."""
    if topology is None or len(gpus) < 2:
        return None
    worst = worst_link(topology, gpus)
    nodes = [topology.numa_of(g) for g in gpus]
    if worst == NVLINK:
        why = "NVLink-complete"
    elif None not in nodes and len(set(nodes)) == 1:
        why = "one NUMA node"
    elif worst == UNKNOWN_LINK:
        why = "links unknown"
    else:
        why = f"worst link {LINK_NAMES[worst]}"
    return f"GPUs {gpus_text(gpus, run=3)}, {why}"
