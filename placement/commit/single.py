"""One replica at a time: plan, commit under the locks, and on a lost race exclude the node and plan again."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from placement import snapshot
from placement.commit.outcomes import LostRace, Pending, Placement, ReplicaGone
from placement.commit.writes import _commit, _commit_pipelined
from placement.explain import pending_explain, placed_explain, plugin_counts_sent
from placement.index import PlacementIndex
from placement.models import Replica, ReplicaState
from placement.planner import NoFit, ReplicaRequest
from placement.signals import placement_changed_on_commit

MAX_ATTEMPTS = 3


@plugin_counts_sent
def replica_place(
    *,
    replica: Pending,
    request: ReplicaRequest,
    index: PlacementIndex,
    now: datetime | None = None,
    announce: bool = True,
) -> Placement:
    """Plan and commit one pending replica through the guarded commit; record why when it cannot go.

    ``announce``: send placement_changed for its node once it committed; a caller placing many one by
    one passes False and sends one for all of them (each send reaches every live page)."""
    now = now or timezone.now()
    exclude: set[str] = set()
    conflicts: list[str] = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = index.plan(request, exclude=frozenset(exclude))
        if isinstance(result, NoFit):
            if conflicts:
                # The nodes it lost races for are excluded: say so, rather than a bare no-fit.
                return replica_pending(replica, result.summary, pending_explain(result) | {"conflicts": conflicts})
            return replica_pending(replica, result.summary, pending_explain(result))
        explain = placed_explain(result, attempts=attempt, conflicts=conflicts)
        try:
            committed = None
            if _pipelined():
                committed = _commit_pipelined(replica.pk, result, index, explain, now, request)
            if committed is None:  # no pipeline here, or its strict write found a race: the plain way
                own = not connection.in_atomic_block
                with transaction.atomic():
                    committed = _commit(replica.pk, result, index, explain, now, request, own=own)
        except ReplicaGone:
            committed = False
        except LostRace as race:
            conflicts.append(race.reason)
            exclude.add(race.node)
            for view in snapshot.node_views(names=race.refresh, now=now):
                index.update_node(view)
            continue
        if not committed:
            return Placement(gone=True)
        index.apply(result)
        replica.state = ReplicaState.PLACED
        if announce:
            placement_changed_on_commit(nodes=result.nodes)
        return Placement(plan=result)
    reason = f"Unschedulable after {MAX_ATTEMPTS} conflicting attempts: {'; '.join(conflicts)}"
    return replica_pending(replica, reason, {"summary": reason, "conflicts": conflicts, "rejections": []})


def _pipelined() -> bool:
    """Whether a commit may go out in pipeline mode (PostgreSQL, outside any transaction of the caller's)."""
    return settings.LLMGW_COMMIT_PIPELINE and connection.vendor == "postgresql" and not connection.in_atomic_block


def replicas_pending_mark(replicas: list[Pending], reason: str, explain: dict | None) -> None:
    """Record why these pending replicas wait, where that changed (what replica_pending does, in bulk)."""
    changed = [r.pk for r in replicas if r.reason != reason or r.explain != explain]
    for start in range(0, len(changed), 500):  # SQLite takes a bounded number of parameters
        Replica.objects.filter(pk__in=changed[start : start + 500], state=ReplicaState.PENDING).update(
            reason=reason, explain=explain
        )
    for replica in replicas:
        replica.reason, replica.explain = reason, explain


def replica_pending(replica: Pending, reason: str, explain: dict[str, Any]) -> Placement:
    """Record why a replica waits (only when that changed); the pending outcome."""
    if replica.reason != reason or replica.explain != explain:
        Replica.objects.filter(pk=replica.pk, state=ReplicaState.PENDING).update(
            reason=reason, explain=explain
        )
        replica.reason, replica.explain = reason, explain
    return Placement(reason=reason)
