"""What the node layer tells the layers above it: sent by agents.services, connected in their
AppConfig.ready. The node layer never imports placement or the facility's models; they listen here.
"""

from django.dispatch import Signal

# A node's agent reported the replicas it runs (sent inside the heartbeat's transaction, the node row
# locked). Arguments: ``node`` (agents.models.Node), ``states`` (the heartbeat's replica reports),
# ``now`` (the heartbeat's time). Placement records the shard and replica states.
node_reported = Signal()

# Something placement depends on changed on nodes: a node appeared or came back, its labels, inventory,
# cordon or drain changed (sent inside the writing transaction). Arguments: ``node_names``.
nodes_changed = Signal()
