"""The ready replicas a model keeps whatever llmgw does on its own (DESIGN.md, invariant 10).

A stop llmgw decides by itself — a drain's old replica, a shed, a dropped batch replica — is made only
while the model keeps at least ``min_ready`` ready replicas after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

# placement.models.ReplicaState's values (a TextChoices: its members equal these texts).
PENDING = "pending"
PLACED = "placed"
STARTING = "starting"
READY = "ready"
STOPPING = "stopping"

# Lowest first: what shedding moves before anything else. A critical model is never shed.
CLASS_ORDER = {"batch": 0, "standard": 1, "critical": 2}


class HasState(Protocol):
    """A replica as far as its minimum goes: its state (an ORM replica is one too)."""

    @property
    def state(self) -> str: ...


R = TypeVar("R", bound=HasState)


def stops_allowed(*, ready: int, min_ready: int, replicas: Iterable[R]) -> list[R]:
    """Of the replicas llmgw would stop on its own, those it may: in the order given, while the model
    keeps at least ``min_ready`` of its ``ready`` replicas once they are gone."""
    allowed = []
    for replica in replicas:
        after = ready - (1 if replica.state == READY else 0)
        if after < min_ready:
            continue
        ready = after
        allowed.append(replica)
    return allowed
