"""Live updates: what changed, sent to the channel layer for the console's open pages."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

NODES_GROUP = "nodes"


def node_group(name: str) -> str:
    return f"node.{name}"


def _send(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # a console update never fails the write that caused it
        log.warning("live update to %s not sent", group, exc_info=True)


def node_changed(name: str) -> None:
    """A node's sensors, labels, state or replicas changed."""
    _send(NODES_GROUP, {"type": "node.changed", "node": name})
    _send(node_group(name), {"type": "node.changed", "node": name})


def nodes_changed() -> None:
    """Something that touches many nodes changed (a hold, a budget)."""
    _send(NODES_GROUP, {"type": "nodes.changed"})
