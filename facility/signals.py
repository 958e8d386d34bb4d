"""What the facility tells the layers above it: sent by facility.services, connected in their AppConfig.ready.

The facility never imports placement; placement listens here instead (placement.apps).
"""

from django.dispatch import Signal

# A budget, a hold or the facility settings changed (sent inside the writing transaction; a receiver that
# acts defers to its commit). Arguments: ``sender`` (the model class written).
facility_changed = Signal()

# A round of the periodic evaluation finished (conditions judged): placement sheds and caps from it.
# Arguments: ``sender``, ``now`` (the round's time).
conditions_evaluated = Signal()

# Domains renamed where they are recorded (a NetBox rack renamed): placement moves its own rows keyed by
# domain. Arguments: ``sender``, ``renames`` ({old: new}, ``rack:R-B01`` → ``rack:R-B01-NEW``).
domains_renamed = Signal()
