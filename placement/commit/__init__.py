"""The guarded commit of one replica's plan, with its two SQL backends (PostgreSQL, portable).

The shape of a placement:

1. plan on plain reads (a :class:`placement.index.PlacementIndex` built once per reconcile run);
2. in one transaction (a savepoint when nested): lock the Budget rows of every domain its shards count
   against in sorted order, then the chosen nodes sorted by name (llmgw.lock_order); re-check
   against the locked rows (node ready, not cordoned, not held; domain power from the locked
   figures; GPUs through the unique (node, card) of GpuBooking, cores and memory through the guarded
   write of NodeBooking); write shards, GPU bookings, node bookings;
3. a failed re-check is a lost race: the transaction (savepoint) rolls back, the node is excluded, the
   index takes the fresh view of what changed, and the replica is planned again, at most
   :data:`MAX_ATTEMPTS` times.

Locking budgets, not just nodes, is what keeps two shards on two nodes of one rack from both taking
its last kilowatt. On SQLite (the embedded default) ``select_for_update`` is a no-op and the
IMMEDIATE transaction mode serialises writers instead.

The package, by concern: ``locks`` (what a commit locks and reads), ``recheck`` (plans against the
locked rows), ``writes`` (shards and bookings), ``single`` (one replica at a time), ``lanes``, ``batches``
and ``run`` (a run of many models' replicas, model after model, in batches), ``outcomes``, ``gc_pause``.
"""

from placement.commit.gc_pause import COLLECT_EVERY_SECONDS, collector_paused
from placement.commit.lanes import BATCH, Lane, Placed, Planned, lane_rest_mark
from placement.commit.locks import _locked_state
from placement.commit.outcomes import LostRace, Pending, Placement, ReplicaGone
from placement.commit.run import lanes_place, replicas_place
from placement.commit.single import MAX_ATTEMPTS, replica_pending, replica_place, replicas_pending_mark

__all__ = [
    "BATCH", "COLLECT_EVERY_SECONDS", "MAX_ATTEMPTS", "Lane", "LostRace", "Pending", "Placed", "Placement",
    "Planned", "ReplicaGone", "_locked_state", "collector_paused", "lane_rest_mark", "lanes_place",
    "replica_pending", "replica_place", "replicas_pending_mark", "replicas_place",
]
