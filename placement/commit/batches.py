"""Batches of plans committed together (PostgreSQL), and one replica at a time (SQLite), each waited for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from placement import snapshot
from placement.commit.lanes import Lane, Planned
from placement.commit.locks import Scope, _locked_state, scope_of
from placement.commit.outcomes import LostRace, Placement
from placement.commit.recheck import _Locked
from placement.commit.single import MAX_ATTEMPTS, replica_pending, replica_place
from placement.commit.writes import _write_postgresql_batch, generic_plans
from placement.index import PlacementIndex
from placement.models import ReplicaState
from placement.planner import FacilityView, ReplicaRequest
from placement.signals import placement_changed_on_commit


def _lanes_one_by_one(lanes: list[Lane], index: PlacementIndex, now: datetime, max_tries: int | None) -> None:
    """lanes_place one replica per transaction (SQLite, whose writers are serialised anyway)."""
    started = 0
    placed: set[str] = set()
    try:
        for lane in lanes:
            try:
                while lane.queue:
                    if max_tries is not None and started >= max_tries:
                        lane.cut = True
                        break
                    started += 1
                    replica = lane.queue.pop(0).replica
                    request = dataclasses.replace(lane.request, existing=tuple(lane.existing))
                    outcome = lane.outcomes[replica.pk] = replica_place(
                        replica=replica, request=request, index=index, now=now, announce=False
                    )
                    if outcome.plan is not None:
                        lane.existing.append(outcome.plan.nodes)
                        placed |= outcome.plan.nodes
                    elif not outcome.gone and not outcome.reason.startswith("Unschedulable"):
                        lane.stopped = replica
                        break
            except Exception as exc:
                lane.error = exc
                raise
    finally:
        if placed:  # one placement_changed for the run, its placements committed one by one
            placement_changed_on_commit(nodes=placed)


class _BatchLost(Exception):
    """The batch statement found lost races: roll it all back; these are the plans that lost."""

    def __init__(self, lost: dict[int, LostRace]):
        super().__init__(f"{len(lost)} lost")
        self.lost = lost


def _commit_batch(planned: list[Planned], index: PlacementIndex, now: datetime, lane: Lane) -> list[Planned]:
    """Commit the planned replicas together, waiting for it; record the outcomes; the ones to plan
    again, in order."""
    scope = scope_of((s.node for item in planned for s in item.plan.shards), index)
    names, touched = scope.names, scope.touched
    facility = index.facility
    lost: dict[int, LostRace] = {}
    gone: set[int] = set()
    own = not connection.in_atomic_block
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            generic_plans(cursor, own)
            locked = _Locked(*_locked_state(cursor, names, touched, facility, now))
            lost, writes = _checked(planned, locked, scope, index.facility, lane.request, now)
            if writes:
                ids = {name: row[1] for name, row in locked.nodes.items()}
                gone, raced = _write_postgresql_batch(cursor, writes, ids, now, touched)
                if raced:
                    by_node = {race.node: race for race in raced}
                    for item in planned:
                        race = next((by_node[n] for n in sorted(item.plan.nodes) if n in by_node), None)
                        if race is not None:
                            lost[item.replica.pk] = race
                    raise _BatchLost(lost)
    except _BatchLost:
        return _settle_batch(planned, _Committed(lost, set(), True), index, now, lane)
    return _settle_batch(planned, _Committed(lost, gone, False), index, now, lane)


def _checked(
    planned: list[Planned], locked: _Locked, scope: Scope, facility: FacilityView, request: ReplicaRequest,
    now: datetime,
) -> tuple[dict[int, LostRace], list[tuple[int, list, dict]]]:
    """The plans checked in turn against the locked rows: the ones that lost, and the writes of the rest."""
    lost: dict[int, LostRace] = {}
    writes = []
    for item in planned:
        shards = sorted(item.plan.shards, key=lambda s: s.node)
        try:
            locked.check(shards, scope.domains_of, facility, now, views=scope.views, request=request)
        except LostRace as race:
            lost[item.replica.pk] = race
            continue
        writes.append((item.replica.pk, shards, item.explain))
    return lost, writes


@dataclass
class _Committed:
    """What a batch's transaction did: the plans that lost (with the race), the replicas gone, and
    whether it rolled back as a whole (a lost race found by the write)."""

    lost: dict[int, LostRace]
    gone: set[int]
    rolled_back: bool


def _settle_batch(
    planned: list[Planned], result: _Committed, index: PlacementIndex, now: datetime, lane: Lane
) -> list[Planned]:
    """Record a batch's outcomes in its lane and tell the index what did not happen; the ones to plan
    again, in order."""
    lost, gone, rolled_back = result.lost, result.gone, result.rolled_back
    outcomes, existing = lane.outcomes, lane.existing
    again: list[Planned] = []
    refresh: set[str] = set()
    for item in planned:
        pk = item.replica.pk
        race = lost.get(pk)
        if rolled_back or race is not None or pk in gone:
            # Its plan is not in the database: the index forgets it, and so does the model's spread.
            refresh |= item.plan.nodes
            existing.remove(item.plan.nodes)
        if pk in gone:
            outcomes[pk] = Placement(gone=True)
        elif race is not None:
            refresh |= race.refresh
            item.conflicts.append(race.reason)
            item.exclude.add(race.node)
            if item.attempt >= MAX_ATTEMPTS:
                reason = f"Unschedulable after {MAX_ATTEMPTS} conflicting attempts: {'; '.join(item.conflicts)}"
                explain = {"summary": reason, "conflicts": item.conflicts, "rejections": []}
                outcomes[pk] = replica_pending(item.replica, reason, explain)
            else:
                item.attempt += 1
                again.append(item)
        elif rolled_back:
            again.append(item)  # it lost nothing: planned again as it was, with the others' news
        else:
            item.replica.state = ReplicaState.PLACED
            item.replica.reason, item.replica.explain = "", item.explain
            outcomes[pk] = Placement(plan=item.plan)
    # Only the nodes given shards have new assignments: the heartbeats' map reads just their entries
    # again (a lost room's thousands of replacements would otherwise send it all to the database, and
    # every heartbeat of a served process down the full path meanwhile, once per batch).
    placed = {
        name for item in planned if outcomes.get(item.replica.pk, Placement()).plan is not None
        for name in item.plan.nodes
    }
    if placed:
        placement_changed_on_commit(nodes=placed)
    if refresh:
        for view in snapshot.node_views(names=refresh, now=now):
            index.update_node(view)
    return again
