"""Writes of placement: models, replicas and shards; reconcile."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from placement.models import ReplicaState, Shard

SHARD_STATES = {s.value for s in (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.STOPPING, ReplicaState.FAILED)}


def shard_states_report(*, node, states: Iterable[Mapping[str, Any]], now) -> None:
    """Record what a node's agent says of the replicas it runs; ids of other nodes' replicas are ignored."""
    by_id = {int(s["id"]): s for s in states}
    if not by_id:
        return
    for shard in Shard.objects.filter(node=node, replica_id__in=by_id):
        report = by_id[shard.replica_id]
        shard.state = report["state"]
        shard.port = report.get("port")
        shard.restarts = report.get("restarts", 0)
        shard.message = report.get("message", "")[:1000]
        shard.save(update_fields=["state", "port", "restarts", "message"])


def reconcile_all() -> None:
    """Every model to its desired replicas. Filled in by placement."""
