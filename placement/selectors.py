"""Reads of placement: what a node must run, replicas, explain."""

from __future__ import annotations

from placement.models import ReplicaState, Shard


def node_assignments(node) -> list[dict]:
    """The replicas a node's agent must run now (its shards not being stopped), as the heartbeat answers."""
    shards = (
        Shard.objects.filter(node=node)
        .exclude(replica__state=ReplicaState.STOPPING)
        .select_related("replica__model")
        .order_by("replica_id")
    )
    out = []
    for shard in shards:
        model = shard.replica.model
        out.append(
            {
                "id": shard.replica_id,
                "model": model.name,
                "command": model.command,
                "health_path": model.health_path,
                "gpus": shard.gpu_indices,
                "cpu_cores": shard.cpu_cores,
                "memory_gib": shard.memory_gib,
            }
        )
    return out
