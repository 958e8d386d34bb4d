"""A placement run: model after model, each model's pending replicas planned and committed in batches."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.utils import timezone

from placement.commit.batches import _commit_batch, _lanes_one_by_one
from placement.commit.gc_pause import collector_paused
from placement.commit.lanes import BATCH, Lane, Planned
from placement.commit.outcomes import Pending, Placement
from placement.commit.single import replica_pending
from placement.explain import pending_explain, placed_explain, plugin_counts_sent
from placement.index import PlacementIndex
from placement.planner import NoFit, ReplicaRequest


def replicas_place(
    *,
    replicas: list[Pending],
    request: ReplicaRequest,
    index: PlacementIndex,
    now: datetime | None = None,
    batch: int = BATCH,
) -> tuple[list[tuple[Pending, Placement]], Pending | None]:
    """Plan and commit one model's pending replicas in order, up to ``batch`` in each transaction
    (:func:`lanes_place` with one lane). Returns each replica tried with its outcome, in order, and the
    replica it stopped at, if it did: the one nothing fits (the replicas after it were not tried)."""
    lane = Lane(replicas, request)
    lanes_place(lanes=[lane], index=index, now=now, batch=batch)
    return lane.tried(), lane.stopped


@collector_paused()
@plugin_counts_sent
def lanes_place(
    *,
    lanes: list[Lane],
    index: PlacementIndex,
    now: datetime | None = None,
    batch: int = BATCH,
    max_tries: int | None = None,
) -> None:
    """Plan and commit several models' pending replicas, lane by lane, each lane's in order, up to
    ``batch`` of one lane in each transaction; at most ``max_tries`` replicas tried in all (the lanes
    past it are ``cut``). Outcomes go into the lanes.

    Each plan is made on the index with the plans before it applied; the batch is checked against the
    locked rows in one transaction with the guards of the single commit (budgets, then nodes,
    re-checked, then the guarded writes), and committed before the next batch is planned. A plan that
    loses is left out and planned again (at most MAX_ATTEMPTS times, as one at a time); the others
    commit. On SQLite, one at a time.

    An error is raised as it came, with the lane it came from marked (``Lane.error``); the lanes before
    it are settled, the ones after it untouched, the index to be built afresh.
    """
    now = now or timezone.now()
    if connection.vendor != "postgresql" or batch <= 1:
        _lanes_one_by_one(lanes, index, now, max_tries)
        return
    tries = _Tries(max_tries)
    for lane in lanes:
        try:
            _lane_place(lane, index, now, batch, tries)
        except Exception as exc:
            lane.error = exc
            raise
    for lane in lanes:
        lane.cut = bool(lane.queue) and lane.stopped is None


@dataclass
class _Tries:
    """A run's bound on the replicas it tries (None: none), and how many it has tried."""

    bound: int | None
    started: int = 0

    def take(self, item: Planned) -> bool:
        """Whether ``item`` may be planned: tried before, or a try left (then counted)."""
        if not item.tried:
            if self.bound is not None and self.started >= self.bound:
                return False
            item.tried = True
            self.started += 1
        return True


def _lane_place(lane: Lane, index: PlacementIndex, now: datetime, batch: int, tries: _Tries) -> None:
    """The lane's replicas in batches, each committed before the next is planned, until the queue is
    empty, the run's tries are spent, or a replica finds that nothing fits (the lane stops there)."""
    while lane.queue:
        planned, nofit = _batch_planned(lane, index, batch, tries)
        if planned:
            lane.queue[:0] = _commit_batch(planned, index, now, lane)
        elif nofit is not None:
            _stop_at(lane, nofit)
            return
        else:
            return  # the run's bound on tries came first


def _batch_planned(
    lane: Lane, index: PlacementIndex, batch: int, tries: _Tries
) -> tuple[list[Planned], NoFit | None]:
    """Up to ``batch`` of the lane's replicas planned, each applied to the index before the next; and the
    no-fit of the first, when it met one. A no-fit met later is not an answer yet: the replica is planned
    again after the batch commits (what the batch takes may not commit)."""
    planned: list[Planned] = []
    while lane.queue and len(planned) < batch:
        item = lane.queue[0]
        if not tries.take(item):
            break
        result = index.plan(
            dataclasses.replace(lane.request, existing=tuple(lane.existing)), exclude=frozenset(item.exclude)
        )
        if isinstance(result, NoFit):
            return planned, None if planned else result
        lane.queue.pop(0)
        item.plan = result
        item.explain = placed_explain(result, attempts=item.attempt, conflicts=item.conflicts)
        index.apply(result)
        lane.existing.append(result.nodes)
        planned.append(item)
    return planned, None


def _stop_at(lane: Lane, nofit: NoFit) -> None:
    """The replica first in the lane's queue waits, with why (written now); the ones after it are not tried."""
    item = lane.queue.pop(0)
    explain = pending_explain(nofit)
    if item.conflicts:
        explain |= {"conflicts": item.conflicts}
    lane.outcomes[item.replica.pk] = replica_pending(item.replica, nofit.summary, explain)
    lane.stopped = item.replica
