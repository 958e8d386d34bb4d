"""An in-memory index of node state, kept between placements, for planning fast.

:func:`placement.planner.plan_replica` checks every node on every call: simple, and the reference.
A reconcile run places many replicas in a row, so this index keeps what the plain path recomputes:

- nodes grouped by location (their tuple of domains), each group's nodes bucketed by free GPUs and by
  replicas, with the group's condition verdict (refusal, rank, notes) worked out once;
- each budgeted domain's use, updated by the change of one node's term when a shard is applied.

:meth:`PlacementIndex.plan` takes groups by their part of the order (spreading, condition), sorts only
the candidates of the best such tier, and stops at the first that passes every filter, so a fit costs
one tier's sort and a handful of checks. It gives the same plan as ``plan_replica`` (a property
test holds the two together): the same filters and keys, shared with the planner module, and the same
kept rejections (candidates ranked ahead of the chosen one). A multi-node replica, and a no-fit (which
reports every node), go through ``plan_replica`` on the indexed views.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from facility.domains import Domain
from facility.power import Budget, node_use_watts
from placement.planner import (
    SPREAD_LEVELS,
    FacilityView,
    NodeView,
    NoFit,
    Plan,
    ReplicaRequest,
    ShardPlan,
    added_of,
    apply_shard,
    base_rejection,
    blocked_reason,
    condition_verdict,
    draw_of,
    headroom_step,
    order_key,
    plan_replica,
    power_rejection_in,
    shard_for,
    spread_counts,
    spread_of,
    why_text,
)


class _Cell:
    """A budgeted domain, its running use, and its refusals at that use (kept until the use changes)."""

    __slots__ = ("budget", "margin", "_use", "_refusals")

    def __init__(self, budget: Budget, margin: float) -> None:
        self.budget = budget
        self.margin = margin
        self._use = budget.other_watts
        self._refusals: dict[tuple[float | None, float], str | None] = {}

    @property
    def use(self) -> float:
        return self._use

    def add(self, watts: float) -> None:
        if watts:
            self._use += watts
            self._refusals.clear()

    def refusal(self, draw: float | None, added: float) -> str | None:
        """Why a shard of this draw, adding ``added`` to the use, may not come in; None when it fits."""
        key = (draw, added)
        if key in self._refusals:
            return self._refusals[key]
        reason = self._refusals[key] = power_rejection_in(
            [(self.budget, self._use, 0.0, 0.0)], draw, added, self.margin
        )
        return reason


class _Group:
    """Nodes with the same domains: one rack's (and PDU's) worth, typically."""

    __slots__ = ("domains", "spread", "cells", "by_free", "by_replicas", "rank", "notes")

    def __init__(self, domains: tuple[Domain, ...]) -> None:
        self.domains = domains
        self.spread = tuple(d for d in domains if d.level in SPREAD_LEVELS)
        self.cells: tuple[_Cell, ...] = ()
        self.by_free: dict[int, list[str]] = {}
        self.by_replicas: dict[int, list[str]] = {}
        self.rank = 0
        self.notes: tuple[str, ...] = ()

    def set_conditions(self, facility: FacilityView) -> None:
        _, self.rank, self.notes = condition_verdict(self.domains, facility.conditions)


class _Entry:
    """One indexed node: its view, its group, and its hold reason under the current facility."""

    __slots__ = ("node", "group", "held")

    def __init__(self, node: NodeView, group: _Group, held: str | None) -> None:
        self.node = node
        self.group = group
        self.held = held


def _insert(buckets: dict[int, list[str]], bucket: int, name: str) -> None:
    insort(buckets.setdefault(bucket, []), name)


def _remove(buckets: dict[int, list[str]], bucket: int, name: str) -> None:
    names = buckets[bucket]
    del names[bisect_left(names, name)]
    if not names:
        del buckets[bucket]


class _NodesOf:
    """The indexed nodes by name, as spread_counts reads them (no copy of the whole map per plan)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: dict[str, _Entry]) -> None:
        self._entries = entries

    def get(self, name: str) -> NodeView | None:
        entry = self._entries.get(name)
        return None if entry is None else entry.node


class PlacementIndex:
    """Node state and domain use for a run of placements; plan with :meth:`plan`, commit with :meth:`apply`.

    Not thread-safe: one reconcile owns one index. Feed it what changed (``update_node``,
    ``remove_node``, ``set_facility``); a lost race at commit means the Django side refreshes
    the node from the store with ``update_node`` and plans again.
    """

    def __init__(self, nodes: Iterable[NodeView], facility: FacilityView) -> None:
        self._facility = facility
        # The last plan's existing replicas and their spread counts (see _spread_counts).
        self._spread: tuple[tuple[frozenset[str], ...], dict[Domain, int]] | None = None
        self._cells: dict[Domain, _Cell] = {}
        self._nodes: dict[str, _Entry] = {}
        self._groups: dict[tuple[Domain, ...], _Group] = {}
        for node in nodes:
            if node.name in self._nodes:
                raise ValueError(f"node {node.name!r} is listed twice")
            self._add(node)
        self.set_facility(facility)

    # --- reading --------------------------------------------------------------------------------

    @property
    def facility(self) -> FacilityView:
        """The facility figures plans are made against."""
        return self._facility

    def node(self, name: str) -> NodeView:
        """The indexed view of one node (KeyError when unknown)."""
        return self._nodes[name].node

    def nodes(self) -> tuple[NodeView, ...]:
        """Every indexed node, by name."""
        return tuple(self._nodes[name].node for name in sorted(self._nodes))

    def use_watts(self, domain: Domain) -> float | None:
        """A budgeted domain's use as the index counts it; None for a domain without a budget."""
        cell = self._cells.get(domain)
        return None if cell is None else cell.use

    # --- keeping it current ---------------------------------------------------------------------

    def update_node(self, node: NodeView) -> None:
        """Add a node, or replace its view (a heartbeat, a label change, a refresh after a lost race)."""
        old = self._nodes.get(node.name)
        if old is not None:
            self._drop(old)
        if old is None or old.node.domains != node.domains:
            self._spread = None  # a node came, or moved: the kept spread counts may be wrong
        self._add(node)

    def remove_node(self, name: str) -> None:
        """Forget a node (deleted); unknown names are ignored."""
        old = self._nodes.get(name)
        if old is not None:
            self._drop(old)
            self._spread = None

    def set_facility(self, facility: FacilityView) -> None:
        """New settings, budgets, holds or conditions: holds, verdicts and domain use are worked out again."""
        self._facility = facility
        margin = facility.settings.margin
        self._cells = {domain: _Cell(budget, margin) for domain, budget in facility.budgets.items()}
        for group in self._groups.values():
            group.cells = tuple(self._cells[d] for d in group.domains if d in self._cells)
            group.set_conditions(facility)
        for entry in self._nodes.values():
            entry.held = blocked_reason(entry.node, facility)
            if entry.group.cells:
                term = self._term(entry.node)
                for cell in entry.group.cells:
                    cell.add(term)

    def apply(self, plan: Plan) -> None:
        """Record a committed (or dry-run) plan: free cards, cores, memory, placed watts, replicas."""
        for shard in plan.shards:
            self.apply_shard(shard)

    def apply_shard(self, shard: ShardPlan) -> None:
        """Record one committed shard."""
        self.update_node(apply_shard(self._nodes[shard.node].node, shard))

    def _term(self, node: NodeView) -> float:
        return node_use_watts(node.placed_watts, node.measured_watts, self._facility.settings)

    def _add(self, node: NodeView) -> None:
        group = self._groups.get(node.domains)
        if group is None:
            group = self._groups[node.domains] = _Group(node.domains)
            group.cells = tuple(self._cells[d] for d in node.domains if d in self._cells)
            group.set_conditions(self._facility)
        self._nodes[node.name] = _Entry(node, group, blocked_reason(node, self._facility))
        _insert(group.by_free, len(node.free_gpus), node.name)
        _insert(group.by_replicas, node.replicas, node.name)
        if group.cells:
            term = self._term(node)
            for cell in group.cells:
                cell.add(term)

    def _drop(self, entry: _Entry) -> None:
        node, group = entry.node, entry.group
        del self._nodes[node.name]
        _remove(group.by_free, len(node.free_gpus), node.name)
        _remove(group.by_replicas, node.replicas, node.name)
        if group.cells:
            term = self._term(node)
            for cell in group.cells:
                cell.add(-term)

    # --- planning -------------------------------------------------------------------------------

    def _spread_counts(self, existing: tuple[frozenset[str], ...]) -> dict[Domain, int]:
        """spread_counts(existing), kept between plans: the replicas of one model are planned in turn,
        each request's existing replicas the last one's plus what was placed since, so only those are
        counted; anything else (another model, a replica forgotten) counts afresh."""
        kept = self._spread
        nodes = _NodesOf(self._nodes)
        if kept is not None and len(existing) >= len(kept[0]) and existing[: len(kept[0])] == kept[0]:
            counts = dict(kept[1])
            for domain, count in spread_counts(existing[len(kept[0]) :], nodes).items():
                counts[domain] = counts.get(domain, 0) + count
        else:
            counts = spread_counts(existing, nodes)
        self._spread = (existing, counts)
        return counts

    def _tiers(self, request: ReplicaRequest) -> tuple[dict[Domain, int], list[list[tuple[_Group, int]]]]:
        """Groups (with their spread) by their part of the order, best first: replicas in their racks and
        PDUs, then condition."""
        counts = self._spread_counts(request.existing)
        tiers: dict[tuple[int, int], list[tuple[_Group, int]]] = {}
        for group in self._groups.values():
            spread = spread_of(group.spread, counts)
            tiers.setdefault((spread, group.rank), []).append((group, spread))
        return counts, [tiers[key] for key in sorted(tiers)]

    def plan(self, request: ReplicaRequest, *, exclude: frozenset[str] = frozenset()) -> Plan | NoFit:
        """Plan one replica on the indexed state; the same answer as ``plan_replica`` would give."""
        profile = request.profile
        if profile.nodes > 1 or not self._nodes:
            return plan_replica(request, self.nodes(), self._facility, exclude=exclude)
        facility = self._facility
        settings = facility.settings
        use = {domain: cell.use for domain, cell in self._cells.items()}
        gpus = profile.gpus
        rejections: dict[str, str] = {}
        counts, tiers = self._tiers(request)
        # Nodes alike in what these depend on get the same answer: asked once per plan, not per node
        # (the planner's pieces are pure; thousands of nodes share a handful of figures).
        draws: dict[float | None, float | None] = {}
        addeds: dict[tuple, float | None] = {}
        for tier in tiers:
            candidates = []
            for group, spread in tier:
                buckets = group.by_free if gpus > 0 else group.by_replicas
                steps: dict[float | None, int] = {}
                for bucket, names in buckets.items():
                    if gpus > 0 and bucket < gpus:
                        continue
                    for name in names:
                        node = self._nodes[name].node
                        limit = node.gpu_power_limit_watts
                        if limit in draws:
                            draw = draws[limit]
                        else:
                            draw = draws[limit] = draw_of(node, profile, settings)
                        alike = (node.placed_watts, node.measured_watts, draw)
                        if alike in addeds:
                            added = addeds[alike]
                        else:
                            added = addeds[alike] = added_of(node, draw, settings)
                        if added in steps:
                            step = steps[added]
                        else:
                            step = steps[added] = headroom_step(group.domains, added, facility, use)
                        key = order_key(node, profile, request.model, spread, group.rank, step)
                        candidates.append((key, name, draw, added, step))
            candidates.sort()
            for _, name, draw, added, step in candidates:
                entry = self._nodes[name]
                node = entry.node
                reason = base_rejection(node, profile, entry.held, exclude)
                if reason is None:
                    # The first budgeted domain in level order that refuses, as plan_replica says it.
                    for cell in entry.group.cells:
                        reason = cell.refusal(draw, added or 0.0)
                        if reason is not None:
                            break
                if reason is not None:
                    rejections[name] = reason
                    continue
                return Plan(
                    shards=(shard_for(node, profile, draw),),
                    why=why_text(node, request, counts, entry.group.rank, step),
                    rejections=rejections,
                    notes=entry.group.notes,
                )
        # Nothing fits: the plain path reports every node, as a no-fit must.
        return plan_replica(request, self.nodes(), self._facility, exclude=exclude)


@dataclass(frozen=True, slots=True)
class Headroom:
    """How many more replicas fit, and why the next does not (None when the count hit the limit)."""

    fits: int
    why_not: str | None


def headroom(
    request: ReplicaRequest,
    nodes: Sequence[NodeView],
    facility: FacilityView,
    *,
    limit: int = 1000,
) -> Headroom:
    """How many more replicas of the request fit: the same pipeline as a dry run on a copy."""
    index = PlacementIndex(nodes, facility)
    existing = list(request.existing)
    fits = 0
    while fits < limit:
        result = index.plan(dataclasses.replace(request, existing=tuple(existing)))
        if isinstance(result, NoFit):
            return Headroom(fits=fits, why_not=result.summary)
        index.apply(result)
        existing.append(result.nodes)
        fits += 1
    return Headroom(fits=fits, why_not=None)
