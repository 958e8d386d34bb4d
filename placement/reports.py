"""What agents report of the replicas they run: shard states, and the replica states that follow.

Connected to :data:`agents.signals.node_reported` in placement.apps: the node layer never calls it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from agents.models import Node
from placement.models import Replica, ReplicaState, Shard
from placement.signals import placement_changed_on_commit


def replica_state_from_shards(current: str, shard_states: list[str]) -> str:
    """A replica's state from its shards': any failed → failed; all ready → ready; else starting."""
    if current in (ReplicaState.PENDING, ReplicaState.STOPPING) or not shard_states:
        return current
    if ReplicaState.FAILED in shard_states:
        return ReplicaState.FAILED
    if all(s == ReplicaState.READY for s in shard_states):
        return ReplicaState.READY
    if all(s == ReplicaState.PLACED for s in shard_states):
        return ReplicaState.PLACED
    return ReplicaState.STARTING


def shard_states_report(*, node, states: Iterable[Mapping[str, Any]], now) -> None:
    """Record what a node's agent says of the replicas it runs; ids of other nodes' replicas are ignored.

    A replica's state follows its shards' (:func:`replica_state_from_shards`); it keeps ``ready_since``
    while it stays ready.
    """
    by_id = {int(s["id"]): s for s in states}
    if not by_id:
        return
    touched: set[int] = set()
    for shard in Shard.objects.filter(node=node, replica_id__in=by_id):
        report = by_id[shard.replica_id]
        values = {
            "state": report["state"],
            "port": report.get("port"),
            "restarts": report.get("restarts", 0),
            "message": (report.get("message") or "")[:1000],
        }
        changed = [k for k, v in values.items() if getattr(shard, k) != v]
        if changed:
            for key in changed:
                setattr(shard, key, values[key])
            shard.save(update_fields=changed)
            touched.add(shard.replica_id)
    if not touched:
        return
    # What a node must run never follows its shards' states, but the replicas it reported on are its:
    # the heartbeat's map reads this node's entry again, not every node's.
    placement_changed_on_commit(nodes=[node.name])
    shard_states: dict[int, list[str]] = defaultdict(list)
    for replica_id, state in Shard.objects.filter(replica_id__in=touched).values_list("replica_id", "state"):
        shard_states[replica_id].append(state)
    replacement_ready_after: list[int] = []
    for replica in Replica.objects.filter(pk__in=touched).select_related("model").only(
        "id", "state", "ready_since", "replaces_id", "model__min_ready_seconds", "model__name"
    ):
        state = replica_state_from_shards(replica.state, shard_states[replica.pk])
        if state == replica.state:
            continue
        ready_since = (replica.ready_since or now) if state == ReplicaState.READY else None
        Replica.objects.filter(pk=replica.pk).update(state=state, ready_since=ready_since)
        if replica.replaces_id and state == ReplicaState.READY:
            replacement_ready_after.append(replica.model.min_ready_seconds)
        if state == ReplicaState.READY and replica.model.name not in (node.weights or []):
            # It ran here, so the node holds the weights: placement prefers such nodes next time.
            node.weights = [*(node.weights or []), replica.model.name]
            Node.objects.filter(pk=node.pk).update(weights=node.weights)
    if replacement_ready_after:
        # A drain's replacement is up: the old replica stops once it has been ready long enough.
        from placement.signals import reconcile_request

        reconcile_request(after=max(replacement_ready_after) + 1)
