"""The re-check of plans against the locked rows: a node that moved, went, was cordoned or held, and every
budgeted domain's power through the planner's own power rule (placement.planner.power_rejection_in)."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from datetime import UTC, datetime

from django.utils import timezone

from agents.models import heartbeat_is_fresh
from facility.domains import domains_of as domains_of_labels
from facility.power import Budget as BudgetFigures
from facility.power import node_use_added_watts
from placement import snapshot
from placement.commit.outcomes import LostRace
from placement.planner import FacilityView, power_rejection_in


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
        self.refusals: dict[str, str | None] = {}
        self.budgeted: dict[str, list[str]] = {}  # each node's budgeted domains, in level order

    def _node_refusal(self, name: str, domains: list[str], now: datetime) -> str | None:
        """Why the locked row of a chosen node refuses any shard (gone, cordoned, not ready, moved, held)."""
        row = self.nodes.get(name)
        if row is None:
            return f"{name}: the node is gone"
        if row[2]:
            return f"{name}: cordoned meanwhile"
        if not _is_ready(row[3], row[4], now):
            return f"{name}: not ready any more"
        if _location_of(row[5] or "{}") != tuple(sorted(domains)):  # the labels as text (CAST in the SQL)
            return f"{name}: its location changed meanwhile"
        for domain in domains:
            if domain in self.held:
                return f"{name}: {domain.replace(':', ' ', 1)} is held: {self.held[domain]}"
        return None

    def check(self, shards, domains_of: dict[str, list[str]], facility: FacilityView, now: datetime) -> None:
        """Re-check one plan against the locked rows; raises LostRace. Once it passes, it is counted."""
        for shard in shards:
            name = shard.node
            # The node's own verdict, once per node for all the plans of a batch (the rows do not move).
            if name not in self.refusals:
                self.refusals[name] = self._node_refusal(name, domains_of[name], now)
            if self.refusals[name] is not None:
                raise LostRace(name, self.refusals[name])
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
