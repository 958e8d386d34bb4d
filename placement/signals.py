"""What placement tells the interface layer: sent by placement's services once their writes commit.

Sent explicitly by the services (bulk_create and raw SQL send no post_save), connected in
placement.apps.PlacementConfig.ready.
"""

from collections.abc import Iterable

from django.dispatch import Signal

# Shards or replicas were written (placed, freed, stopping, reported, a model changed): what the nodes
# must run may differ. Sent on commit, with ``nodes``: the names of the nodes whose assignments changed
# where the sender knows them cheaply, else None (any node may have). An empty list: no node's assignments
# changed, only what the console shows of placement (capping's would-cap rows).
placement_changed = Signal()


def placement_changed_on_commit(nodes: Iterable[str] | None = None) -> None:
    """Send :data:`placement_changed` once the current transaction commits (at once outside one).

    `nodes`: the nodes whose assignments changed, when known: the heartbeat's map reads only those again.
    """
    from django.db import transaction

    named = None if nodes is None else sorted(set(nodes))
    transaction.on_commit(lambda: placement_changed.send(sender=placement_changed, nodes=named))


# A reconcile is wanted (once the current transaction commits; ``after``: in that many seconds, as when a
# drain's replacement has been ready long enough). Sent by the services and reports, which never import
# the task layer; placement.receivers sends the task.
reconcile_requested = Signal()


def reconcile_request(after: float | None = None) -> None:
    """Ask for a reconcile: :data:`reconcile_requested`, handled by placement.receivers."""
    reconcile_requested.send(sender=reconcile_requested, after=after)
