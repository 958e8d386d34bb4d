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

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator

from facility.domains import Domain
from facility.power import node_use_watts
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
    domain_uses,
    draw_of,
    existing_spread_domains,
    has_cards_for,
    pack_value,
    plan_replica,
    power_rejection,
    shard_for,
    why_text,
)


class _Group:
    """Nodes with the same domains: one rack's (and PDUs') worth, typically."""

    __slots__ = ("domains", "spread", "by_free", "by_replicas")

    def __init__(self, domains: tuple[Domain, ...]) -> None:
        self.domains = domains
        self.spread = tuple(d for d in domains if d.level in SPREAD_LEVELS)
        self.by_free: dict[int, list[str]] = {}
        self.by_replicas: dict[int, list[str]] = {}


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
        self._nodes: dict[str, NodeView] = {}
        self._groups: dict[tuple[Domain, ...], _Group] = {}
        self._groups_by_domain: dict[Domain, list[_Group]] = {}
        self._by_free: dict[int, list[str]] = {}
        self._by_replicas: dict[int, list[str]] = {}
        self._weights: dict[str, set[str]] = {}
        self._use: dict[Domain, float] = {}
        for node in nodes:
            if node.name in self._nodes:
                raise ValueError(f"node {node.name!r} is listed twice")
            self._add(node)
        self._use = domain_uses(self._nodes.values(), facility)

    # --- reading --------------------------------------------------------------------------------

    @property
    def facility(self) -> FacilityView:
        """The facility figures plans are made against."""
        return self._facility

    def node(self, name: str) -> NodeView:
        """The indexed view of one node (KeyError when unknown)."""
        return self._nodes[name]

    def nodes(self) -> tuple[NodeView, ...]:
        """Every indexed node, by name."""
        return tuple(self._nodes[name] for name in sorted(self._nodes))

    def use_watts(self, domain: Domain) -> float | None:
        """A budgeted domain's use as the index counts it; None for a domain without a budget."""
        return self._use.get(domain)

    # --- keeping it current ---------------------------------------------------------------------

    def update_node(self, node: NodeView) -> None:
        """Add a node, or replace its view (a heartbeat, a label change, a refresh after a lost race)."""
        old = self._nodes.get(node.name)
        if old is not None:
            self._drop(old)
        self._add(node)

    def remove_node(self, name: str) -> None:
        """Forget a node (deleted); unknown names are ignored."""
        old = self._nodes.get(name)
        if old is not None:
            self._drop(old)

    def set_facility(self, facility: FacilityView) -> None:
        """New settings, budgets or holds: domain use is recounted from the nodes."""
        self._facility = facility
        self._use = domain_uses(self._nodes.values(), facility)

    def apply(self, plan: Plan) -> None:
        """Record a committed (or dry-run) plan: free cards, cores, memory, placed watts, replicas."""
        for shard in plan.shards:
            self.apply_shard(shard)

    def apply_shard(self, shard: ShardPlan) -> None:
        """Record one committed shard."""
        self.update_node(apply_shard(self._nodes[shard.node], shard))

    def _term(self, node: NodeView) -> float:
        return node_use_watts(node.placed_watts, node.measured_watts, self._facility.settings)

    def _add(self, node: NodeView) -> None:
        self._nodes[node.name] = node
        group = self._groups.get(node.domains)
        if group is None:
            group = self._groups[node.domains] = _Group(node.domains)
            for domain in group.spread:
                self._groups_by_domain.setdefault(domain, []).append(group)
        _insert(group.by_free, len(node.free_gpus), node.name)
        _insert(group.by_replicas, node.replicas, node.name)
        _insert(self._by_free, len(node.free_gpus), node.name)
        _insert(self._by_replicas, node.replicas, node.name)
        for model in node.weights:
            self._weights.setdefault(model, set()).add(node.name)
        if self._use:
            term = self._term(node)
            for domain in node.domains:
                if domain in self._use:
                    self._use[domain] += term

    def _drop(self, node: NodeView) -> None:
        del self._nodes[node.name]
        group = self._groups[node.domains]
        _remove(group.by_free, len(node.free_gpus), node.name)
        _remove(group.by_replicas, node.replicas, node.name)
        _remove(self._by_free, len(node.free_gpus), node.name)
        _remove(self._by_replicas, node.replicas, node.name)
        for model in node.weights:
            holders = self._weights[model]
            holders.discard(node.name)
            if not holders:
                del self._weights[model]
        if self._use:
            term = self._term(node)
            for domain in node.domains:
                if domain in self._use:
                    self._use[domain] -= term

    # --- planning -------------------------------------------------------------------------------

    def plan(self, request: ReplicaRequest, *, exclude: frozenset[str] = frozenset()) -> Plan | NoFit:
        """Plan one replica on the indexed state; the same answer as ``plan_replica`` would give."""
        profile = request.profile
        if profile.nodes > 1 or not self._nodes:
            return plan_replica(request, self.nodes(), self._facility, exclude=exclude)
        facility = self._facility
        spread = existing_spread_domains(request.existing, self._nodes)
        shared_count: dict[int, int] = {}  # id(group) -> racks and PDUs it shares with the replicas
        for domain in spread:
            for group in self._groups_by_domain.get(domain, ()):
                shared_count[id(group)] = shared_count.get(id(group), 0) + 1
        levels = sorted(set(shared_count.values()))
        if len(shared_count) < len(self._groups):
            levels.insert(0, 0)
        holders = self._weights.get(request.model, set())
        use_gpus = profile.gpus > 0
        lowest = profile.gpus if use_gpus else 0
        weighted = sorted(
            (shared_count.get(id(self._groups[node.domains]), 0), pack_value(node, profile), node.name)
            for node in (self._nodes[name] for name in holders)
            if has_cards_for(node, profile)
        )
        rejections: dict[str, str] = {}
        for level in levels:
            # Holders of the weights first, within the level; then everyone else by bin packing.
            candidates: list[Iterator[str]] = [iter([name for s, _, name in weighted if s == level])]
            candidates.append(self._others(level, shared_count, use_gpus, lowest, holders))
            for names in candidates:
                for name in names:
                    node = self._nodes[name]
                    draw = draw_of(node, profile, facility.settings)
                    reason = base_rejection(node, profile, facility.holds, exclude) or power_rejection(
                        node, draw, facility, self._use
                    )
                    if reason is not None:
                        rejections[name] = reason
                        continue
                    return Plan(
                        shards=(shard_for(node, profile, draw),),
                        why=why_text(node, request, spread),
                        rejections=rejections,
                    )
        # Nothing fits: the plain path reports every node, as a no-fit must.
        return plan_replica(request, self.nodes(), facility, exclude=exclude)

    def _others(
        self,
        level: int,
        shared_count: dict[int, int],
        use_gpus: bool,
        lowest: int,
        holders: set[str],
    ) -> Iterator[str]:
        """Non-holders sharing ``level`` racks/PDUs with the replicas, best bin packing first, by name."""
        total = len(self._groups)
        if level == 0:
            size = total - len(shared_count)
        else:
            size = sum(1 for count in shared_count.values() if count == level)
        buckets = self._by_free if use_gpus else self._by_replicas
        for bucket in sorted(b for b in buckets if b >= lowest):
            if size * 4 >= total:
                # Most groups are at this level: walk the cluster-wide list, skipping the others.
                groups = self._groups
                for name in buckets[bucket]:
                    if name in holders:
                        continue
                    node = self._nodes[name]
                    if shared_count.get(id(groups[node.domains]), 0) == level:
                        yield name
            else:
                # Few groups at this level: merge their own sorted lists.
                lists = [
                    names
                    for group in self._groups.values()
                    if shared_count.get(id(group), 0) == level
                    and (names := (group.by_free if use_gpus else group.by_replicas).get(bucket))
                ]
                merged = lists[0] if len(lists) == 1 else heapq.merge(*lists)
                for name in merged:
                    if name not in holders:
                        yield name
