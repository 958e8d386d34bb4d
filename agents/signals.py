"""What the node layer tells the layers above it: sent by agents.services, connected in their
AppConfig.ready. The node layer never imports placement or the facility's models; they listen here.
"""

from django.dispatch import Signal

# A node's agent reported the replicas it runs (sent inside the heartbeat's transaction, the node row
# locked). Arguments: ``node`` (agents.models.Node), ``states`` (the heartbeat's replica reports),
# ``now`` (the heartbeat's time). Placement records the shard and replica states.
node_reported = Signal()

# Something placement depends on changed on nodes: a node appeared or came back, its labels, inventory,
# cordon or drain changed (sent inside the writing transaction). Arguments: ``node_names``, ``heartbeat``
# (a heartbeat found it: a join or comeback), ``domains_moved`` (a node's domains may have changed; a
# sender that does not say leaves it to the receiver to assume so, but for a heartbeat's comeback).
nodes_changed = Signal()

# A node's labels are about to put it in domains it is not in yet (sent inside the writing transaction,
# before the node's row is locked). Arguments: ``domains`` (sorted texts). The facility locks their
# budgets, so a relabel takes its locks in a placement commit's order (budgets, then nodes) and waits
# for the commits into those domains (facility.feed_services.budgets_joined_lock).
domains_joining = Signal()
