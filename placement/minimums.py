"""Minimums: the ready replicas a model keeps whatever llmgw does on its own (drain, shedding, capping).

A model's document sets ``min_ready`` (default 1) and ``class``; a stop that llmgw decides by itself —
a drain's old replica, a shed, a dropped batch replica — is made only while the model keeps at least
``min_ready`` ready replicas after it. A person's own change (fewer ``replicas``, a delete) is not held
back: they asked for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from placement.models import Model, Replica, ReplicaState

# Lowest first: what shedding moves before anything else. A critical model is never shed.
CLASS_ORDER = {"batch": 0, "standard": 1, "critical": 2}


def ready_count(model: Model) -> int:
    """The model's replicas that are ready now (a replacement that is up counts)."""
    return Replica.objects.filter(model=model, state=ReplicaState.READY).count()


def stops_allowed(*, model: Model, replicas: Iterable[Replica]) -> list[Replica]:
    """Of the replicas llmgw would stop on its own, those it may: in the order given, while the model
    keeps at least ``min_ready`` ready replicas once they are gone."""
    ready = ready_count(model)
    allowed = []
    for replica in replicas:
        after = ready - (1 if replica.state == ReplicaState.READY else 0)
        if after < model.min_ready:
            continue
        ready = after
        allowed.append(replica)
    return allowed
