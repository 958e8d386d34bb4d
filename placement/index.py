"""An in-memory index of node state, kept between placements, for planning fast.

:func:`placement.planner.plan_replica` checks every node on every call: simple, and the reference.
A reconcile run places many replicas in a row, so this index keeps what the plain path recomputes:

- nodes grouped by location (their tuple of domains), each group's nodes bucketed by free GPUs and by
  replicas, names sorted, so candidates come out in the planner's order without sorting the cluster;
- each budgeted domain's use, updated by the change of one node's term when a shard is applied.

:meth:`PlacementIndex.plan` walks candidates best first and stops at the first that passes every
filter, so a fit costs a handful of checks. It gives the same plan as ``plan_replica`` (a property
test holds the two together): the same filters and keys, shared with the planner module, and the same
kept rejections (candidates ranked ahead of the chosen one). A multi-node replica, and a no-fit (which
reports every node), go through ``plan_replica`` on the indexed views.
"""

from __future__ import annotations

import dataclasses
import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from facility.domains import Domain
from facility.power import Budget, node_use_added_watts, node_use_watts
from placement.planner import (
    SPREAD_LEVELS,
    FacilityView,
    NodeView,
    NoFit,
    Plan,
    ReplicaRequest,
    ShardPlan,
    apply_shard,
    base_rejection,
    draw_of,
    has_cards_for,
    held_reason,
    pack_value,
    plan_replica,
    power_rejection_in,
    shard_for,
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

    __slots__ = ("domains", "spread", "cells", "by_free", "by_replicas")

    def __init__(self, domains: tuple[Domain, ...]) -> None:
        self.domains = domains
        self.spread = tuple(d for d in domains if d.level in SPREAD_LEVELS)
        self.cells: tuple[_Cell, ...] = ()
        self.by_free: dict[int, list[str]] = {}
        self.by_replicas: dict[int, list[str]] = {}


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


class PlacementIndex:
    """Node state and domain use for a run of placements; plan with :meth:`plan`, commit with :meth:`apply`.

    Not thread-safe: one reconcile owns one index. Feed it what changed (``update_node``,
    ``remove_node``, ``set_facility``); a lost race at commit means the Django side refreshes
    the node from the store with ``update_node`` and plans again.
    """

    def __init__(self, nodes: Iterable[NodeView], facility: FacilityView) -> None:
        self._facility = facility
        self._cells: dict[Domain, _Cell] = {}
        self._nodes: dict[str, _Entry] = {}
        self._groups: dict[tuple[Domain, ...], _Group] = {}
        self._groups_by_domain: dict[Domain, list[_Group]] = {}
        self._by_free: dict[int, list[str]] = {}
        self._by_replicas: dict[int, list[str]] = {}
        self._weights: dict[str, set[str]] = {}
        # model -> (existing replicas, their racks and PDUs, groups -> how many of those they share)
        self._spread_cache: dict[str, tuple[tuple[frozenset[str], ...], set[Domain], dict[_Group, int]]] = {}
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
        if old is None or old.node.domains != node.domains:
            self._spread_cache.clear()
        if old is not None:
            self._drop(old)
        self._add(node)

    def remove_node(self, name: str) -> None:
        """Forget a node (deleted); unknown names are ignored."""
        old = self._nodes.get(name)
        if old is not None:
            self._spread_cache.clear()
            self._drop(old)

    def set_facility(self, facility: FacilityView) -> None:
        """New settings, budgets or holds: holds and domain use are worked out again from the nodes."""
        self._facility = facility
        margin = facility.settings.margin
        self._cells = {domain: _Cell(budget, margin) for domain, budget in facility.budgets.items()}
        for group in self._groups.values():
            group.cells = tuple(self._cells[d] for d in group.domains if d in self._cells)
        for entry in self._nodes.values():
            entry.held = held_reason(entry.node, facility.holds)
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
            for domain in group.spread:
                self._groups_by_domain.setdefault(domain, []).append(group)
        self._nodes[node.name] = _Entry(node, group, held_reason(node, self._facility.holds))
        _insert(group.by_free, len(node.free_gpus), node.name)
        _insert(group.by_replicas, node.replicas, node.name)
        _insert(self._by_free, len(node.free_gpus), node.name)
        _insert(self._by_replicas, node.replicas, node.name)
        for model in node.weights:
            self._weights.setdefault(model, set()).add(node.name)
        if group.cells:
            term = self._term(node)
            for cell in group.cells:
                cell.add(term)

    def _drop(self, entry: _Entry) -> None:
        node, group = entry.node, entry.group
        del self._nodes[node.name]
        _remove(group.by_free, len(node.free_gpus), node.name)
        _remove(group.by_replicas, node.replicas, node.name)
        _remove(self._by_free, len(node.free_gpus), node.name)
        _remove(self._by_replicas, node.replicas, node.name)
        for model in node.weights:
            holders = self._weights[model]
            holders.discard(node.name)
            if not holders:
                del self._weights[model]
        if group.cells:
            term = self._term(node)
            for cell in group.cells:
                cell.add(-term)

    # --- planning -------------------------------------------------------------------------------

    def _spread(self, request: ReplicaRequest) -> tuple[set[Domain], dict[_Group, int]]:
        """The model's racks and PDUs, and how many each group shares; extended, not redone, per replica."""
        existing = request.existing
        cached = self._spread_cache.get(request.model)
        if cached is not None and existing[: len(cached[0])] == cached[0]:
            known, spread, shared = cached
            added = existing[len(known) :]
        else:
            spread, shared, added = set(), {}, existing
        for replica in added:
            for name in replica:
                entry = self._nodes.get(name)
                if entry is None:
                    continue
                for domain in entry.group.spread:
                    if domain not in spread:
                        spread.add(domain)
                        for group in self._groups_by_domain.get(domain, ()):
                            shared[group] = shared.get(group, 0) + 1
        self._spread_cache[request.model] = (existing, spread, shared)
        return spread, shared

    def plan(self, request: ReplicaRequest, *, exclude: frozenset[str] = frozenset()) -> Plan | NoFit:
        """Plan one replica on the indexed state; the same answer as ``plan_replica`` would give."""
        profile = request.profile
        if profile.nodes > 1 or not self._nodes:
            return plan_replica(request, self.nodes(), self._facility, exclude=exclude)
        settings = self._facility.settings
        spread, shared = self._spread(request)
        levels = sorted(set(shared.values()))
        if len(shared) < len(self._groups):
            levels.insert(0, 0)
        holders = self._weights.get(request.model, set())
        weighted = sorted(
            (shared.get(entry.group, 0), pack_value(entry.node, profile), name)
            for name, entry in ((name, self._nodes[name]) for name in holders)
            if has_cards_for(entry.node, profile)
        )
        rejections: dict[str, str] = {}
        for level in levels:
            # Holders of the weights first, within the level; then everyone else by bin packing.
            first = [self._nodes[name] for s, _, name in weighted if s == level]
            for entries in (first, self._others(level, shared, profile.gpus, holders)):
                for entry in entries:
                    node = entry.node
                    draw = draw_of(node, profile, settings)
                    reason = base_rejection(node, profile, entry.held, exclude)
                    if reason is None:
                        # The first budgeted domain in level order that refuses, as plan_replica says it.
                        added = node_use_added_watts(node.placed_watts, node.measured_watts, draw, settings)
                        for cell in entry.group.cells:
                            reason = cell.refusal(draw, added)
                            if reason is not None:
                                break
                    if reason is not None:
                        rejections[node.name] = reason
                        continue
                    return Plan(
                        shards=(shard_for(node, profile, draw),),
                        why=why_text(node, request, frozenset(spread)),
                        rejections=rejections,
                    )
        # Nothing fits: the plain path reports every node, as a no-fit must.
        return plan_replica(request, self.nodes(), self._facility, exclude=exclude)

    def _others(
        self, level: int, shared: dict[_Group, int], gpus: int, holders: set[str]
    ) -> Iterator[_Entry]:
        """Non-holders sharing ``level`` racks/PDUs with the replicas, best bin packing first, by name."""
        total = len(self._groups)
        if level == 0:
            size = total - len(shared)
        else:
            size = sum(1 for count in shared.values() if count == level)
        nodes = self._nodes
        buckets = self._by_free if gpus > 0 else self._by_replicas
        walk_all = size * 4 >= total
        if not walk_all:
            if level == 0:
                groups = [group for group in self._groups.values() if group not in shared]
            else:
                groups = [group for group, count in shared.items() if count == level]
        for bucket in sorted(b for b in buckets if b >= gpus):
            if walk_all:
                # Most groups are at this level: walk the cluster-wide list, skipping the others.
                for name in buckets[bucket]:
                    if name in holders:
                        continue
                    entry = nodes[name]
                    if shared.get(entry.group, 0) == level:
                        yield entry
            else:
                # Few groups at this level: merge their own sorted lists.
                lists = [
                    names
                    for group in groups
                    if (names := (group.by_free if gpus > 0 else group.by_replicas).get(bucket))
                ]
                if not lists:
                    continue
                merged = lists[0] if len(lists) == 1 else heapq.merge(*lists)
                for name in merged:
                    if name not in holders:
                        yield nodes[name]


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
