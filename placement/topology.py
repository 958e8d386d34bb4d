"""Which of a node's free GPUs a shard takes: the set best joined, as the node's topology says.

A node reports how its GPUs are wired (agents.node.protocol's ``gpu_topology``: each pair's link as
``nvidia-smi topo -m`` prints it, each GPU's NUMA node). Links rank NV > PIX > PXB > PHB > NODE > SYS:
NVLink first, more links before fewer (NV18 before NV12 before NV2 before NV1: the bandwidth between the
two cards grows with the links), then PCIe paths ever further apart, SYS crossing the sockets. A
NUMA node of -1 (a VM, a BIOS that tells the kernel none) is unknown, as is one the agent could not
read. A tensor-parallel replica
runs at the pace of its slowest link, so the pick grows a set from each free GPU — adding, each time,
the GPU whose worst link to the set is best (one of the seed's NUMA node breaking ties, then the lowest
index) — and keeps the set whose worst link is best, then the one on the fewest NUMA nodes, then the
one whose links are best in sum, then the lowest indices, so the same node gives the same pick.

A profile may insist (``topology:`` in models.yaml): ``nvlink-all`` takes only a set whose every pair
is joined by NVLink, ``same-numa`` only one on a single known NUMA node; the best such set, grown the
same way from each free GPU. A node without one is turned down in words (:func:`refusal`). ``any``, the default,
takes the best set there is and never turns a node down.

A node that reports no topology has unknown links: its shards take the lowest free indices, as they
did before nodes reported one, and ``nvlink-all`` or ``same-numa`` turn it down (nothing says its
GPUs are joined).

Pure: no Django; the planner, the index and explain read it alike.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# A link's rank, best (lowest) first: NV<n> ranks NVLINKS_MAX - n (NV64 0 … NV1 63), then the PCIe paths
# (PIX 64 … SYS 68); a link nobody could read ranks after them all. A GPU's link to itself is 0.
NVLINKS_MAX = 64  # links between two GPUs the heartbeat takes (agents.node.protocol)
PCIE_NAMES = ("PIX", "PXB", "PHB", "NODE", "SYS")
NVLINK = 0  # the best rank there is: a GPU to itself, or NV64
PCIE_FIRST = NVLINKS_MAX
UNKNOWN_LINK = PCIE_FIRST + len(PCIE_NAMES)
_RANKS = {name: PCIE_FIRST + rank for rank, name in enumerate(PCIE_NAMES)}
_NVLINK_RE = re.compile(r"NV([0-9]+)")

# A profile's ``topology:``, the default first.
ANY = "any"
NVLINK_ALL = "nvlink-all"
SAME_NUMA = "same-numa"
TOPOLOGY_CHOICES = (ANY, NVLINK_ALL, SAME_NUMA)
# The steps the search for a set all joined by NVLink may take where growing one from each GPU found
# none: enough for any real wiring (an NVSwitch board, bridged pairs, a hybrid cube-mesh) many times
# over; a matrix built to defeat it costs this, then the node is turned down.
NVLINK_SEARCH_STEPS = 10_000


@dataclass(frozen=True, slots=True)
class GpuTopology:
    """How a node's GPUs are wired, as the pick reads it: ``links[i][j]`` ranks the link between GPUs i and
    j (see NVLINKS_MAX; UNKNOWN_LINK where unread), ``numa[i]`` is GPU i's NUMA node (None where unknown:
    unread, or -1)."""

    links: tuple[tuple[int, ...], ...]
    numa: tuple[int | None, ...]
    # GPUs whose NUMA node the agent sent as -1, which says nothing of where they are: their numa is None
    # like an unread one; kept so a refusal can say why.
    numa_minus_one: frozenset[int] = frozenset()

    def link(self, a: int, b: int) -> int:
        """The rank of the link between GPUs ``a`` and ``b`` (UNKNOWN_LINK for a GPU the matrix lacks)."""
        links = self.links
        if 0 <= a < len(links) and 0 <= b < len(links):
            return links[a][b]
        return UNKNOWN_LINK

    def numa_of(self, gpu: int) -> int | None:
        """GPU ``gpu``'s NUMA node, None when unknown."""
        return self.numa[gpu] if 0 <= gpu < len(self.numa) else None


def is_nvlink(rank: int) -> bool:
    """Whether a link of this rank is NVLink (a GPU's link to itself counts)."""
    return rank < PCIE_FIRST


def link_name(rank: int) -> str:
    """A rank in nvidia-smi's words: ``NV18``, ``PIX``, … ``unknown``."""
    if rank == NVLINK:
        return "X"
    if is_nvlink(rank):
        return f"NV{NVLINKS_MAX - rank}"
    return PCIE_NAMES[rank - PCIE_FIRST] if rank < UNKNOWN_LINK else "unknown"


def _rank(value: Any) -> int:
    if isinstance(value, str):
        nvlink = _NVLINK_RE.fullmatch(value)
        if nvlink:
            count = int(nvlink.group(1))
            return NVLINKS_MAX - min(count, NVLINKS_MAX) if count > 0 else UNKNOWN_LINK
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
    sent = [nodes[i] if i < len(nodes) and type(nodes[i]) is int else None for i in range(size)]  # not bool
    numa = tuple(node if node is not None and node >= 0 else None for node in sent)
    return GpuTopology(links=links, numa=numa, numa_minus_one=frozenset(i for i, n in enumerate(sent) if n == -1))


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


def total_link(topology: GpuTopology, gpus: Iterable[int]) -> int:
    """The sum of the ranks of every link between the GPUs: of two sets with the same worst link, the one
    with more NVLinks in all has the lower sum."""
    members = list(gpus)
    return sum(topology.link(a, b) for i, a in enumerate(members) for b in members[i + 1 :])


@functools.lru_cache(maxsize=4096)  # a fleet has a few wirings and a few free sets on each
def gpus_pick(
    free: tuple[int, ...], count: int, topology: GpuTopology | None, need: str = ANY
) -> tuple[int, ...] | None:
    """The ``count`` GPUs of ``free`` a shard takes, in index order (see the module's docstring), or None
    when ``need`` (nvlink-all, same-numa) finds no such set among them or ``free`` holds too few. One
    GPU is joined to itself, on one node: the lowest free index, whatever the need."""
    ordered = tuple(sorted(free))
    if len(ordered) < count:
        return None
    if count <= 1:
        return ordered[:count]
    if topology is None:
        return ordered[:count] if need == ANY else None
    if need == ANY and count == len(ordered):
        return ordered
    best: tuple[int, int, int, tuple[int, ...]] | None = None
    nvlink_only, one_node = need == NVLINK_ALL, need == SAME_NUMA
    for seed in ordered:
        home = topology.numa_of(seed)
        if one_node and home is None:
            continue
        pool = [g for g in ordered if g != seed and (not one_node or topology.numa_of(g) == home)]
        if len(pool) < count - 1:
            continue
        members = [seed]
        worst = NVLINK
        while len(members) < count:
            options = [(max(topology.link(g, m) for m in members), topology.numa_of(g) != home, g) for g in pool]
            if nvlink_only:
                options = [option for option in options if is_nvlink(option[0])]
            if not options:
                break
            pick = min(options)
            members.append(pick[2])
            pool.remove(pick[2])
            worst = max(worst, pick[0])
        if len(members) < count:
            continue
        chosen = tuple(sorted(members))
        key = (worst, numa_count(topology, chosen), total_link(topology, chosen), chosen)
        if best is None or key < best:
            best = key
    if best is None:
        return _nvlink_set(ordered, count, topology) if nvlink_only else None
    return best[3]


def _nvlink_set(ordered: tuple[int, ...], count: int, topology: GpuTopology) -> tuple[int, ...] | None:
    """The first set (in index order) of ``count`` GPUs all joined by NVLink, searched whole (within
    NVLINK_SEARCH_STEPS) where growing from each GPU missed one; None when there is none."""
    steps = 0

    def grow(chosen: tuple[int, ...], rest: tuple[int, ...]) -> tuple[int, ...] | None:
        nonlocal steps
        if len(chosen) == count:
            return chosen
        for at, gpu in enumerate(rest):
            steps += 1
            if steps > NVLINK_SEARCH_STEPS or len(chosen) + len(rest) - at < count:
                return None
            if all(is_nvlink(topology.link(gpu, m)) for m in chosen):
                found = grow((*chosen, gpu), rest[at + 1 :])
                if found is not None:
                    return found
        return None

    return grow((), ordered)


def refusal(need: str, count: int, free: tuple[int, ...], topology: GpuTopology | None) -> str:
    """Why a node's free GPUs hold no set the need takes: ``topology: no 4 free GPUs all joined by NVLink
    (free: 0,1,4,6)``, ``topology: no 4 free GPUs on one NUMA node (free: 0,1,4,6)``."""
    if topology is None:
        return f"topology: the node reports no GPU topology ({need} needs it)"
    joined = "all joined by NVLink" if need == NVLINK_ALL else "on one NUMA node"
    unknown = ""
    if need == SAME_NUMA:
        nodeless = [g for g in free if topology.numa_of(g) is None]
        minus_one = [g for g in nodeless if g in topology.numa_minus_one]
        if minus_one:
            unknown = f"; NUMA node unknown for {gpus_text(minus_one, run=3)}, reported as -1"
        elif nodeless:
            unknown = f"; NUMA node unknown for {gpus_text(nodeless, run=3)}"
    return f"topology: no {count} free GPUs {joined} (free: {gpus_text(free, run=3)}{unknown})"


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
    if is_nvlink(worst):
        why = "NVLink-complete"
    elif None not in nodes and len(set(nodes)) == 1:
        why = "one NUMA node"
    elif worst == UNKNOWN_LINK:
        why = "links unknown"
    else:
        why = f"worst link {link_name(worst)}"
    return f"GPUs {gpus_text(gpus, run=3)}, {why}"
