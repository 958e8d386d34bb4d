"""What placing a replica ends in: placed, left pending with the reason, gone, or a lost race to plan again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from placement import snapshot
from placement.models import Replica
from placement.planner import Plan

# A replica to place: its model instance, or what a reconcile loads of a pending one.
Pending = Replica | snapshot.PendingReplica


class ReplicaGone(Exception):
    """The replica was placed or removed by someone else while this plan was made: nothing to write."""


class LostRace(Exception):
    """A re-check against the locked rows failed: someone else took what the plan counted on."""

    def __init__(self, node: str, reason: str, refresh: Iterable[str] = ()):
        super().__init__(reason)
        self.node = node
        self.reason = reason
        # Nodes whose view the index must take afresh (the node, or a domain's members).
        self.refresh = {node, *refresh}


@dataclass
class Placement:
    """The outcome of placing one replica: the plan committed, or the reason it stays pending."""

    plan: Plan | None = None
    reason: str = ""
    gone: bool = False
