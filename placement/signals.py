"""What placement tells the interface layer: sent by placement's services once their writes commit.

Sent explicitly by the services (bulk_create and raw SQL send no post_save), connected in
placement.apps.PlacementConfig.ready.
"""

from django.dispatch import Signal

# Shards or replicas were written (placed, freed, stopping, reported, a model changed): what the nodes
# must run may differ. Sent on commit. No arguments beyond ``sender``.
placement_changed = Signal()


def placement_changed_on_commit() -> None:
    """Send :data:`placement_changed` once the current transaction commits (at once outside one)."""
    from django.db import transaction

    transaction.on_commit(lambda: placement_changed.send(sender=placement_changed))
