"""The re-check of plans against the locked rows, through the planner's own functions: each chosen node as
its locked row has it now (gone, moved, and then every ``rechecked`` filter: readiness, cordon, holds, the
selector and fabric, every filter registered beside them: placement.planner.recheck_rejection) and
every budgeted domain's power (placement.planner.power_rejection_in). Cards, cores and memory are the guarded writes'.

The filters read the locked row's own readiness, cordon, effective labels (the store's over the agent's,
as the row keeps them) and fabric, and the holds read under the locks: a node relabelled between the plan
and the commit is judged on its labels now, as a fresh plan would judge it."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from django.utils import timezone

from agents.models import heartbeat_is_fresh
from facility.domains import domains_of as domains_of_labels
from facility.power import Budget as BudgetFigures
from facility.power import node_use_added_watts
from placement import snapshot
from placement.commit.outcomes import LostRace
from placement.planner import (
    FacilityView,
    NodeView,
    Placing,
    ReplicaRequest,
    power_rejection_in,
    recheck_rejection,
)
from placement.snapshot import GPU_DERIVED_KEYS

# The planner's words for a node's state, said of a change since the plan.
_SINCE = {"not ready": "not ready any more", "cordoned": "cordoned meanwhile"}


class _Locked:
    """What _locked_state read under the locks, and what the plans checked so far take from it.

    The plans of one batch are checked in turn: each one's shards count against the domains and nodes
    with what the plans before it took (``taken`` per domain, ``extra`` placed watts per node).
    """

    def __init__(self, nodes, budget_rows, held, use, draws) -> None:
        self.nodes, self.held, self.use, self.draws = nodes, held, use, draws
        self.budgets = {
            d: BudgetFigures(snapshot.domain_of(d), cap, other) for d, (cap, other) in budget_rows.items()
        }
        self.taken: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.extra: dict[str, float] = defaultdict(float)
        self.holds = {snapshot.domain_of(d): reason for d, reason in held.items()}
        self.recheck_facility = FacilityView(holds=self.holds)
        self.refusals: dict[tuple, str | None] = {}
        self.budgeted: dict[str, list[str]] = {}  # each node's budgeted domains, in level order

    def _node_refusal(
        self, name: str, domains: list[str], view: NodeView, request: ReplicaRequest, now: datetime
    ) -> str | None:
        """Why the locked row of a chosen node refuses the replica (gone, moved, then the planner's
        rechecked filters on the node as the row has it: not ready, cordoned, held, a plugin's no)."""
        row = self.nodes.get(name)
        if row is None:
            return f"{name}: the node is gone"
        if _location_of(row[5] or "{}") != tuple(sorted(domains)):  # the labels as text (CAST in the SQL)
            return f"{name}: its location changed meanwhile"
        locked = dataclasses.replace(
            view, ready=_is_ready(row[3], row[4], now), cordoned=bool(row[2]),
            labels=_labels_now(row[5] or "{}", view.labels), fabric=row[6] or None,
        )
        # The registry's rechecked filters, asked as a plan asks them, with the holds read under the locks.
        reason = recheck_rejection(locked, Placing(request, self.recheck_facility))
        return None if reason is None else f"{name}: {_SINCE.get(reason, reason)}"

    def check(
        self, shards, domains_of: dict[str, list[str]], facility: FacilityView, now: datetime, *,
        views: dict[str, NodeView], request: ReplicaRequest,
    ) -> None:
        """Re-check one plan against the locked rows; raises LostRace. Once it passes, it is counted.
        ``views``: the index's view of each chosen node (what the plan was made on); ``request``: the
        replica's, whose profile the rechecked filters read."""
        for shard in shards:
            name = shard.node
            # The node's own verdict, once per node, model and profile for all the plans of a batch (the rows
            # do not move; a registered filter may answer each model and profile otherwise).
            verdict = (name, request.model, request.profile)
            if verdict not in self.refusals:
                self.refusals[verdict] = self._node_refusal(name, domains_of[name], views[name], request, now)
            if self.refusals[verdict] is not None:
                raise LostRace(name, self.refusals[verdict])
        if not self.budgets:
            return
        # This plan's own shards count with one another (a replica over two nodes of one rack), and
        # with what the plans checked before it in this transaction took.
        # Counted into self.taken and self.extra only once every shard passed.
        taken = self.taken
        mine_taken: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        mine_extra: dict[str, float] = defaultdict(float)
        for shard in shards:
            mine = self.budgeted.get(shard.node)
            if mine is None:
                mine = self.budgeted[shard.node] = _level_sorted(
                    tuple(d for d in domains_of[shard.node] if d in self.budgets)
                )
            placed, drawn = self.draws.get(shard.node, (0.0, 0.0))
            # The SQL gives max(placed, measured): a measurement counts where it passes the placed.
            measured = drawn if drawn > placed else None
            before = placed + self.extra.get(shard.node, 0.0) + mine_extra[shard.node]
            added = node_use_added_watts(before, measured, shard.draw_watts, facility.settings)
            reason = power_rejection_in(
                [
                    (self.budgets[d], self.use[d] + (taken[d][0] if d in taken else 0.0), *mine_taken[d])
                    for d in mine
                ],
                shard.draw_watts,
                added,
                facility.settings.margin,
            )
            if reason is not None:
                raise LostRace(shard.node, f"{shard.node}: {reason}", refresh=snapshot.members_of(mine))
            for d in mine:
                mine_taken[d][0] += added
                mine_taken[d][1] += shard.draw_watts or 0
            mine_extra[shard.node] += shard.draw_watts or 0
        for d, (added, draw) in mine_taken.items():
            self.taken[d][0] += added
            self.taken[d][1] += draw
        for name, watts in mine_extra.items():
            self.extra[name] += watts


# A fleet's locked rows repeat from batch to batch: each stored labels text (and each node's set of
# budgeted domains) is worked out once, not once a batch (a tenth of a batch's check at 1,000 nodes).
# Both are kept within bounds: a labels text may be ~130 KB (256 labels), so only the short ones are
# kept, 16,384 of them (16 MiB at most); a set of budgeted domains is a rack's and its PDUs'.
_LABELS_TEXT_KEPT = 1024


def _location_parsed(labels_text: str) -> tuple[str, ...]:
    """The domains a node's stored labels (its row's JSON text) put it in, as sorted texts."""
    return tuple(sorted(str(d) for d in domains_of_labels(json.loads(labels_text))))


_location_kept = functools.lru_cache(maxsize=16384)(_location_parsed)


def _location_of(labels_text: str) -> tuple[str, ...]:
    """_location_parsed, kept for the texts of a usual size."""
    if len(labels_text) > _LABELS_TEXT_KEPT:
        return _location_parsed(labels_text)
    return _location_kept(labels_text)


def _labels_parsed(labels_text: str) -> Mapping[str, str]:
    """A node's stored effective labels (its row's JSON text), read-only: one parse is shared by the nodes
    that have the same labels, and a plugin's filter must not change another node's."""
    return MappingProxyType(json.loads(labels_text))


_labels_kept = functools.lru_cache(maxsize=16384)(_labels_parsed)


def _labels_now(labels_text: str, planned: Mapping[str, str]) -> Mapping[str, str]:
    """The labels the filters read of a locked row: its effective labels now, with the GPU attributes the
    plan's view derived from its cards (snapshot.derived_labels) where the row has no such label; the
    cards themselves are the guarded writes' to check."""
    stored = _labels_parsed(labels_text) if len(labels_text) > _LABELS_TEXT_KEPT else _labels_kept(labels_text)
    derived = {key: planned[key] for key in GPU_DERIVED_KEYS if key in planned and key not in stored}
    return MappingProxyType({**stored, **derived}) if derived else stored


@functools.lru_cache(maxsize=4096)
def _level_sorted(domains: tuple[str, ...]) -> tuple[str, ...]:
    """snapshot.level_sorted, kept."""
    return tuple(snapshot.level_sorted(domains))


def _is_ready(last_heartbeat_at: datetime | str | None, interval: float, now: datetime) -> bool:
    """Node.is_ready on the locked row's columns (raw SQL: SQLite answers with naive text)."""
    if isinstance(last_heartbeat_at, str):
        last_heartbeat_at = datetime.fromisoformat(last_heartbeat_at)
    if last_heartbeat_at is not None and timezone.is_naive(last_heartbeat_at):
        last_heartbeat_at = timezone.make_aware(last_heartbeat_at, UTC)
    return heartbeat_is_fresh(last_heartbeat_at, interval, now)
