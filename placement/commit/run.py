"""A placement run over lanes: batches in turn, the models' stops written together at the end."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from placement.commit.batches import _commit_batch, _InFlight, _lanes_one_by_one, _settle_batch, _take_back
from placement.commit.gc_pause import collector_paused
from placement.commit.lanes import BATCH, Lane, Planned
from placement.commit.outcomes import Pending, Placement
from placement.explain import pending_explain, placed_explain, plugin_counts_sent
from placement.index import PlacementIndex
from placement.models import Replica, ReplicaState
from placement.planner import NoFit, ReplicaRequest

log = logging.getLogger(__name__)


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
    re-checked, then the guarded writes). A plan that loses is left out and planned again (at most
    MAX_ATTEMPTS times, as one at a time); the others commit. On SQLite, one at a time.

    While a batch's write and COMMIT are on their way (pipeline mode, see _InFlight), the next batch —
    the same lane's, or the next lane's: a reconcile's models follow one another without a wait — is
    planned on the index with the sent plans applied. If the sent batch did not all commit, the next
    batch's plans are taken back and planned again after its outcome, as if they had waited. A lane
    whose next replica finds that nothing fits behind a batch in flight stops there only once that
    batch committed whole, and the next lane plans meanwhile.

    An error is raised as it came, with the lane it came from marked (``Lane.error``); the lanes before
    it are settled, the ones after it untouched, the index to be built afresh.
    """
    now = now or timezone.now()
    if connection.vendor != "postgresql" or batch <= 1:
        _lanes_one_by_one(lanes, index, now, max_tries)
        return
    # Outside a transaction, a batch with more to plan after it has its write and COMMIT sent in
    # pipeline mode, and the next batch is planned while PostgreSQL works on them (the planner's CPU
    # and the database's overlap). The last batch commits waiting, as there is nothing to overlap.
    overlap = settings.LLMGW_COMMIT_PIPELINE and not connection.in_atomic_block
    in_flight: tuple[Lane, list[Planned], _InFlight] | None = None
    # The stops' reasons, written together once nothing is in flight at the end (a reconcile's models
    # each stop once: a statement and a commit each, a tenth of a run of twenty models' turns).
    marks: list[tuple[Lane, Pending, str, dict[str, Any]]] = []
    started = 0
    blame = lanes[0] if lanes else None
    failing = False

    def can_go(lane: Lane) -> bool:
        if not lane.queue or lane.stopped is not None or lane.nofit_behind_flight is not None:
            return False
        return lane.queue[0].tried or max_tries is None or started < max_tries

    def stop_at(lane: Lane, nofit: NoFit) -> None:
        """The replica first in the lane's queue waits, with why; the ones after it are not tried."""
        item = lane.queue.pop(0)
        explain = pending_explain(nofit)
        if item.conflicts:
            explain |= {"conflicts": item.conflicts}
        replica = item.replica
        if replica.reason != nofit.summary or replica.explain != explain:
            marks.append((lane, replica, nofit.summary, explain))
            replica.reason, replica.explain = nofit.summary, explain
        lane.outcomes[replica.pk] = Placement(reason=nofit.summary)
        lane.stopped = replica

    def plan_batch(lane: Lane, planned: list[Planned]) -> NoFit | None:
        """Plan up to ``batch`` of the lane's replicas into ``planned``; the no-fit of its first, if it
        met one (one met later is planned again after the batch: what the batch takes may not commit)."""
        nonlocal started
        while lane.queue and len(planned) < batch:
            item = lane.queue[0]
            if not item.tried:
                if max_tries is not None and started >= max_tries:
                    break
                item.tried = True
                started += 1
            result = index.plan(
                dataclasses.replace(lane.request, existing=tuple(lane.existing)), exclude=frozenset(item.exclude)
            )
            if isinstance(result, NoFit):
                return None if planned else result
            lane.queue.pop(0)
            item.plan = result
            item.explain = placed_explain(result, attempts=item.attempt, conflicts=item.conflicts)
            item.before = tuple(index.node(name) for name in sorted(result.nodes))
            index.apply(result)
            lane.existing.append(result.nodes)
            planned.append(item)
        return None

    try:
        while True:
            planned: list[Planned] = []
            lane: Lane | None = None
            while not planned:
                lane = next((candidate for candidate in lanes if can_go(candidate)), None)
                if lane is None:
                    break
                blame = lane
                nofit = plan_batch(lane, planned)
                if nofit is None:
                    continue
                if in_flight is None:
                    stop_at(lane, nofit)
                else:
                    # Nothing fits behind a batch in flight: that stands if the batch commits whole, as
                    # it was planned on; meanwhile the next lane plans (a reconcile's models each end so).
                    lane.nofit_behind_flight = nofit
            if not planned and in_flight is None:
                break
            if in_flight is not None:
                sent_lane, sent, flight = in_flight
                in_flight = None
                blame = sent_lane
                committed = flight.finish()
                clean = committed is not None and committed.clean
                if planned and not clean:
                    # Not all of it committed: what was planned on top of it is taken back first (the
                    # index as it was before those plans), to be planned again after the sent batch is
                    # settled, on the index the waiting way would have had.
                    _take_back(planned, index, lane)
                    lane.queue[:0] = planned
                    planned = []
                if committed is None:
                    # The write met a lost race and the database rolled the batch back: committed again
                    # the waiting way, which finds out which plans lost and plans them again.
                    again = _commit_batch(sent, index, now, sent_lane)
                else:
                    again = _settle_batch(sent, committed, index, now, sent_lane)
                sent_lane.queue[:0] = again
                for waiting in lanes:
                    nofit, waiting.nofit_behind_flight = waiting.nofit_behind_flight, None
                    if nofit is not None and clean:
                        stop_at(waiting, nofit)  # the index was as it was planned on: the same answer
            if not planned:
                continue
            blame = lane
            if overlap and any(can_go(candidate) for candidate in lanes):  # a next batch to plan meanwhile
                flight = _InFlight.send(planned, index, now, lane.request)
                if flight.committed is None:
                    in_flight = (lane, planned, flight)
                else:  # every plan lost at the check: nothing went out
                    lane.queue[:0] = _settle_batch(planned, flight.committed, index, now, lane)
            else:
                lane.queue[:0] = _commit_batch(planned, index, now, lane)
    except Exception as exc:
        failing = True
        if blame is not None and blame.error is None:
            blame.error = exc
        raise
    finally:
        try:
            if in_flight is not None:
                # Whatever stopped the run, a batch on its way is waited for, and what it committed recorded.
                sent_lane, sent, flight = in_flight
                try:
                    committed = flight.finish()
                    if committed is not None:
                        _settle_batch(sent, committed, index, now, sent_lane)
                except Exception as exc:
                    failing = True
                    if sent_lane.error is None:
                        sent_lane.error = exc
                    raise
        finally:
            try:
                _marks_write([(replica, reason, explain) for _, replica, reason, explain in marks])
            except DatabaseError as exc:
                if not failing:
                    if marks[0][0].error is None:
                        marks[0][0].error = exc  # the first of the lanes whose stops it was writing
                    raise
                log.warning(
                    "the reasons of %d stopped replicas were not written; the next reconcile writes them", len(marks)
                )
    for lane in lanes:
        lane.cut = bool(lane.queue) and lane.stopped is None


def _marks_write(marks: list[tuple[Pending, str, dict[str, Any]]]) -> None:
    """Each replica's reason to wait, in one transaction (only pending replicas take it)."""
    if not marks:
        return
    with transaction.atomic():
        for replica, reason, explain in marks:
            Replica.objects.filter(pk=replica.pk, state=ReplicaState.PENDING).update(reason=reason, explain=explain)
