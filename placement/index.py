"""An in-memory index of node state, kept between placements, for planning fast.

:func:`placement.planner.plan_replica` checks every node on every call: simple, and the reference.
A reconcile run places many replicas in a row, so this index keeps what the plain path recomputes:

- nodes grouped by location (their tuple of domains), each group's nodes bucketed by free GPUs and by
  replicas, with the group's condition verdict (refusal, rank, notes) worked out once;
- each budgeted domain's use, updated by the change of one node's term when a shard is applied;
- for each model and profile planned, every candidate node in order (:class:`_Ranking`), kept between
  plans: a placement moves the chosen node, the steps of its rack's nodes (the rack's use moved) and
  the spread of the nodes in its rack and PDU, so only those are ranked again.

:meth:`PlacementIndex.plan` walks the kept order and stops at the first candidate that passes every
filter, so a fit costs the changes since the last plan and a handful of checks, whatever the cluster's
size. The candidates it passed over are kept with their reasons (:class:`_Walk`): the next plan starts
where this one stopped while none of them moved and their budgeted domains' use did not change (a lost
room's held nodes and the full racks were walked again by each of its replacements). It gives the
same plan as ``plan_replica`` (property tests hold the two together, through heartbeats, label moves
and new facility figures): the same filters and keys, shared with the planner module, and the same
kept rejections (candidates ranked ahead of the chosen one). A no-fit reports
every node, as the plain path words it; a multi-node replica goes through ``plan_replica`` on the
indexed views.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from facility.domains import Domain
from facility.power import Budget, node_use_watts
from placement.planner import (
    FULL_HEADROOM,
    SPREAD_LEVELS,
    FacilityView,
    NodeView,
    NoFit,
    Plan,
    Profile,
    ReplicaRequest,
    ShardPlan,
    added_of,
    apply_shard,
    base_rejection,
    blocked_reason,
    condition_verdict,
    draw_of,
    nofit_summary,
    order_key,
    plan_replica,
    power_rejection_in,
    shard_for,
    spread_counts,
    spread_of,
    step_left,
    unavailable_reason,
    why_text,
)
from placement.plugins import REGISTRY

# Rankings kept (one per model and profile, the least recently planned dropped first), and the changes
# kept for them to catch up on (a ranking further behind is made afresh).
_RANKINGS_KEPT = 64
_CHANGES_KEPT = 65536


class _Cell:
    """A budgeted domain, its running use, and its refusals at that use (kept until the use changes)."""

    __slots__ = ("budget", "margin", "limit", "_use", "_refusals", "version")

    def __init__(self, budget: Budget, margin: float) -> None:
        self.budget = budget
        self.margin = margin
        self.limit = budget.limit_watts(margin)
        self._use = budget.other_watts
        self._refusals: dict[tuple[float | None, float], str | None] = {}
        # Counts the changes of use: a group's ranked candidates read their rack's use (headroom step).
        self.version = 0

    @property
    def use(self) -> float:
        return self._use

    def add(self, watts: float) -> None:
        if watts:
            self._use += watts
            self._refusals.clear()
            self.version += 1

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

    __slots__ = ("domains", "spread", "cells", "step_cell", "by_free", "by_replicas", "rank", "notes")

    def __init__(self, domains: tuple[Domain, ...]) -> None:
        self.domains = domains
        self.spread = tuple(d for d in domains if d.level in SPREAD_LEVELS)
        self.cells: tuple[_Cell, ...] = ()
        self.step_cell: _Cell | None = None  # the rack's: the headroom step reads its use
        self.by_free: dict[int, list[str]] = {}
        self.by_replicas: dict[int, list[str]] = {}
        self.rank = 0
        self.notes: tuple[str, ...] = ()

    def set_cells(self, cells: dict[Domain, _Cell]) -> None:
        """The group's budgeted domains' cells, in level order."""
        self.cells = tuple(cells[d] for d in self.domains if d in cells)
        self.step_cell = next((c for c in self.cells if c.budget.domain.level == "rack"), None)

    def set_conditions(self, facility: FacilityView) -> None:
        _, self.rank, self.notes = condition_verdict(self.domains, facility.conditions)

    def names(self) -> Iterable[str]:
        """The group's nodes' names."""
        for names in self.by_replicas.values():
            yield from names


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
    """The indexed nodes by name, as spread_counts reads them (no copy of the whole map)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: dict[str, _Entry]) -> None:
        self._entries = entries

    def get(self, name: str) -> NodeView | None:
        entry = self._entries.get(name)
        return None if entry is None else entry.node


class _Ranking:
    """One model and profile's candidates, best first, kept between its plans.

    ``entries`` are ``(order key, draw, added, step, out)``, sorted; a key ends with the node's name, so
    no two are equal. ``out`` is the node's ``unavailable_reason`` (not ready, cordoned, held), or None.
    ``bases`` keeps what of each candidate's key only the node decides (``(key after the step, draw,
    added)``) and ``current`` each one's entry. ``existing`` and
    ``counts`` are the model's replicas as last asked and their spread counts; ``seen`` is how far
    into the index's change log this ranking has caught up, ``epoch`` the index's epoch it was made in.

    ``walk`` is what the last plan found ahead of its choice (:class:`_Walk`), and ``moved`` the first
    position of ``entries`` changed since (an entry taken out or put in): a walk whose prefix nothing
    moved in, and whose cells kept their use, is taken up where it stopped.
    """

    __slots__ = ("entries", "current", "bases", "existing", "counts", "seen", "epoch", "walk", "moved")

    def __init__(self, existing: tuple[frozenset[str], ...], counts: dict[Domain, int], seen: int, epoch: int):
        self.entries: list[tuple] = []
        self.current: dict[str, tuple] = {}
        self.bases: dict[str, tuple | None] = {}
        self.existing = existing
        self.counts = counts
        self.seen = seen
        self.epoch = epoch
        self.walk: _Walk | None = None
        self.moved = 0

    def take_out(self, entry: tuple) -> None:
        at = bisect_left(self.entries, entry)
        del self.entries[at]
        self.moved = min(self.moved, at)

    def put_in(self, entry: tuple) -> None:
        at = bisect_right(self.entries, entry)
        self.entries.insert(at, entry)
        self.moved = min(self.moved, at)


class _Walk:
    """The candidates a plan passed over before its choice: how many (``ahead``), their rejections in
    rank order, the exclusions it was made with, and the budgeted domains whose refusals it read, with
    their versions. The next plan of the ranking starts at ``ahead`` with these rejections when nothing
    moved among those candidates (a room's held nodes, the full racks), instead of walking them again.
    """

    __slots__ = ("ahead", "rejections", "reasons", "exclude", "cells")

    def __init__(
        self, ahead: int, rejections: dict[str, str], reasons: dict[str, int], exclude: frozenset[str], cells: dict
    ) -> None:
        self.ahead = ahead
        self.rejections = rejections
        self.reasons = reasons  # each rejection reason's count: the explain's summary, not counted again
        self.exclude = exclude
        self.cells = cells  # _Cell → its version when read

    def holds(self, ranking: _Ranking, exclude: frozenset[str]) -> bool:
        return (
            ranking.moved >= self.ahead
            and exclude == self.exclude
            and all(cell.version == version for cell, version in self.cells.items())
        )


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
        self._groups_in: dict[Domain, list[_Group]] = {}  # the groups in each rack and PDU
        self._rankings: dict[tuple[str, Profile], _Ranking] = {}
        # What changed, for the rankings to catch up on: (node name, its rack when the rack's use moved).
        # ``_log_start`` is the position of the log's first item; ``_epoch`` moves when every ranking
        # must be made afresh (new facility figures, a node come, gone or moved: spread counts change).
        self._log: list[tuple[str, Domain | None]] = []
        self._log_start = 0
        self._epoch = 0
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
            self._epoch += 1  # a node came, or moved: spread counts and groups change
        self._add(node)

    def remove_node(self, name: str) -> None:
        """Forget a node (deleted); unknown names are ignored."""
        old = self._nodes.get(name)
        if old is not None:
            self._drop(old)
            self._epoch += 1

    def set_facility(self, facility: FacilityView) -> None:
        """New settings, budgets, holds or conditions: holds, verdicts and domain use are worked out again."""
        self._facility = facility
        self._epoch += 1
        margin = facility.settings.margin
        self._cells = {domain: _Cell(budget, margin) for domain, budget in facility.budgets.items()}
        for group in self._groups.values():
            group.set_cells(self._cells)
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
            for domain in group.spread:
                self._groups_in.setdefault(domain, []).append(group)
            group.set_cells(self._cells)
            group.set_conditions(self._facility)
        self._nodes[node.name] = _Entry(node, group, blocked_reason(node, self._facility))
        _insert(group.by_free, len(node.free_gpus), node.name)
        _insert(group.by_replicas, node.replicas, node.name)
        self._count(node, group, 1)

    def _drop(self, entry: _Entry) -> None:
        node, group = entry.node, entry.group
        del self._nodes[node.name]
        _remove(group.by_free, len(node.free_gpus), node.name)
        _remove(group.by_replicas, node.replicas, node.name)
        self._count(node, group, -1)

    def _count(self, node: NodeView, group: _Group, sign: int) -> None:
        """Add (or take away) the node's term from its group's budgeted domains; log the change."""
        term = self._term(node) if group.cells else 0.0
        for cell in group.cells:
            cell.add(sign * term)
        rack = group.step_cell.budget.domain if group.step_cell is not None and term else None
        self._log.append((node.name, rack))

    # --- planning -------------------------------------------------------------------------------

    def _base(self, name: str, request: ReplicaRequest) -> tuple | None:
        """What of a node's key only the node decides — ``(key after the step, draw, added)`` — or None
        when it has too few free cards to be a candidate at all."""
        node = self._nodes[name].node
        profile = request.profile
        if profile.gpus > 0 and len(node.free_gpus) < profile.gpus:
            return None
        settings = self._facility.settings
        draw = draw_of(node, profile, settings)
        return order_key(node, profile, request.model, 0, 0, 0)[3:], draw, added_of(node, draw, settings)

    def _entry(self, indexed: _Entry, base: tuple, counts: dict[Domain, int]) -> tuple:
        """A candidate's ranked entry: its base with the group's spread, rank and the rack's step."""
        tail, draw, added = base
        group = indexed.group
        cell = group.step_cell
        step = FULL_HEADROOM if cell is None or added is None else step_left(cell.limit, cell.use, added)
        return ((spread_of(group.spread, counts), group.rank, -step, *tail), draw, added, step,
                unavailable_reason(indexed.node, indexed.held))

    def _ranking(self, request: ReplicaRequest) -> _Ranking:
        """The request's kept ranking, caught up with what changed since its last plan, or made afresh."""
        kind = (request.model, request.profile)
        ranking = self._rankings.pop(kind, None)
        existing = request.existing
        if (
            ranking is None
            or ranking.epoch != self._epoch
            or ranking.seen < self._log_start
            or len(existing) < len(ranking.existing)
            or existing[: len(ranking.existing)] != ranking.existing
        ):
            ranking = self._rank_afresh(request)
        else:
            self._catch_up(ranking, request)
        if len(self._rankings) >= _RANKINGS_KEPT:
            del self._rankings[next(iter(self._rankings))]
        self._rankings[kind] = ranking  # the most recent last: the oldest goes first
        if len(self._log) > _CHANGES_KEPT:
            behind = min(r.seen for r in self._rankings.values())
            keep = max(behind, self._log_start + len(self._log) - _CHANGES_KEPT // 2)
            del self._log[: keep - self._log_start]
            self._log_start = keep
        return ranking

    def _rank_afresh(self, request: ReplicaRequest) -> _Ranking:
        counts = spread_counts(request.existing, _NodesOf(self._nodes))
        ranking = _Ranking(request.existing, counts, self._log_start + len(self._log), self._epoch)
        gpus = request.profile.gpus
        for group in self._groups.values():
            buckets = group.by_free if gpus > 0 else group.by_replicas
            for bucket, names in buckets.items():
                if bucket < gpus:
                    continue
                for name in names:
                    base = ranking.bases[name] = self._base(name, request)
                    ranking.current[name] = self._entry(self._nodes[name], base, counts)
        ranking.entries = sorted(ranking.current.values())
        return ranking

    def _catch_up(self, ranking: _Ranking, request: ReplicaRequest) -> None:
        """Rank again the nodes that changed, those of racks whose use moved, and those of racks and
        PDUs the model's new replicas went to (their spread)."""
        log = self._log[ranking.seen - self._log_start :]
        changed = {name for name, _ in log}
        racks = {rack for _, rack in log if rack is not None}  # each rack's groups looked up once
        again: set[_Group] = {g for rack in racks for g in self._groups_in.get(rack, ()) if g.step_cell is not None}
        ranking.seen = self._log_start + len(self._log)
        existing = request.existing
        if len(existing) > len(ranking.existing):
            added = spread_counts(existing[len(ranking.existing) :], _NodesOf(self._nodes))
            for domain, count in added.items():
                ranking.counts[domain] = ranking.counts.get(domain, 0) + count
                again.update(self._groups_in.get(domain, ()))
        ranking.existing = existing
        current, bases, counts = ranking.current, ranking.bases, ranking.counts
        for name in changed:
            old = current.pop(name, None)
            if old is not None:
                ranking.take_out(old)
            indexed = self._nodes.get(name)
            base = bases[name] = None if indexed is None else self._base(name, request)
            if base is not None:
                entry = current[name] = self._entry(indexed, base, counts)
                ranking.put_in(entry)
        for group in again:
            spread, cell, rank = spread_of(group.spread, counts), group.step_cell, group.rank
            steps: dict[float, int] = {}  # a group's nodes mostly add alike: one step each
            for name in group.names():
                base = bases.get(name)
                if base is None or name in changed:
                    continue
                old = current[name]
                tail, draw, added = base
                if cell is None or added is None:
                    step = FULL_HEADROOM
                else:
                    step = steps.get(added)
                    if step is None:
                        step = steps[added] = step_left(cell.limit, cell.use, added)
                if old[3] == step and old[0][0] == spread:
                    continue  # the rank moves only with the facility (a new epoch)
                entry = current[name] = ((spread, rank, -step, *tail), draw, added, step, old[4])
                ranking.take_out(old)
                ranking.put_in(entry)

    def plan(self, request: ReplicaRequest, *, exclude: frozenset[str] = frozenset()) -> Plan | NoFit:
        """Plan one replica on the indexed state; the same answer as ``plan_replica`` would give."""
        profile = request.profile
        # A loaded plugin's rule has no incremental form here: the plain path, so the two stay equal.
        if profile.nodes > 1 or not self._nodes or REGISTRY.has_external:
            return plan_replica(request, self.nodes(), self._facility, exclude=exclude)
        ranking = self._ranking(request)
        walk, start = ranking.walk, 0
        if walk is not None and walk.holds(ranking, exclude):
            # Nothing moved among the candidates the last plan passed over: they are passed over again
            # for the same reasons (a lost room's 2,500 held nodes, walked by each of its replacements).
            start, rejections, reasons, read = walk.ahead, dict(walk.rejections), dict(walk.reasons), dict(walk.cells)
        else:
            rejections, reasons, read = {}, {}, {}
        entries = ranking.entries
        for at in range(start, len(entries)):
            key, draw, added, step, out = entries[at]
            name = key[-1]
            if out is not None:
                # What base_rejection would say first, kept in the entry (a lost room's held nodes were
                # two thirds of the entries a plan walked past).
                rejections[name] = out
                reasons[out] = reasons.get(out, 0) + 1
                continue
            indexed = self._nodes[name]
            node = indexed.node
            reason = base_rejection(node, profile, indexed.held, exclude)
            if reason is None:
                # The first budgeted domain in level order that refuses, as plan_replica says it.
                cells = indexed.group.cells
                for cell in cells:
                    reason = cell.refusal(draw, added or 0.0)
                    if reason is not None:
                        for read_cell in cells:  # this rejection holds while their use does
                            read[read_cell] = read_cell.version
                        break
            if reason is None:
                ranking.walk, ranking.moved = _Walk(at, rejections, reasons, exclude, read), len(entries)
                return Plan(
                    shards=(shard_for(node, profile, draw),),
                    why=why_text(node, request, ranking.counts, indexed.group.rank, step),
                    rejections=rejections,  # the walk's too: a later plan copies it before adding
                    notes=indexed.group.notes,
                    reasons=reasons,  # likewise
                )
            rejections[name] = reason
            reasons[reason] = reasons.get(reason, 0) + 1
        ranking.walk = None
        return self._nofit(request, exclude)

    def _nofit(self, request: ReplicaRequest, exclude: frozenset[str]) -> Plan | NoFit:
        """Nothing fits: every node's rejection, as ``plan_replica`` words it, read off the index."""
        profile = request.profile
        settings = self._facility.settings
        rejections: dict[str, str] = {}
        draws: dict[float | None, float | None] = {}
        for name in sorted(self._nodes):
            entry = self._nodes[name]
            node = entry.node
            reason = base_rejection(node, profile, entry.held, exclude)
            if reason is None:
                limit = node.gpu_power_limit_watts
                if limit not in draws:
                    draws[limit] = draw_of(node, profile, settings)
                added = added_of(node, draws[limit], settings)
                for cell in entry.group.cells:
                    reason = cell.refusal(draws[limit], added or 0.0)
                    if reason is not None:
                        break
            if reason is None:  # cannot happen once the candidates ran out; the plain path decides
                return plan_replica(request, self.nodes(), self._facility, exclude=exclude)
            rejections[name] = reason
        return NoFit(summary=nofit_summary(rejections), rejections=rejections)


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
