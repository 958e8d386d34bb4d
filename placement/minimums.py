"""Minimums: the ready replicas a model keeps whatever llmgw does on its own (drain, shedding, capping).

A model's document sets ``min_ready`` (default 1) and ``class``; a stop that llmgw decides by itself —
a drain's old replica, a shed, a dropped batch replica — is made only while the model keeps at least
``min_ready`` ready replicas after it. A person's own change (fewer ``replicas``, a delete) is not held
back: they asked for it. The rule is :func:`placement.decisions.minimums.stops_allowed`; this reads
the model's ready count for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from placement.decisions import minimums
from placement.models import Model, Replica, ReplicaState


def ready_count(model: Model) -> int:
    """The model's replicas that are ready now (a replacement that is up counts)."""
    return Replica.objects.filter(model=model, state=ReplicaState.READY).count()


def stops_allowed(*, model: Model, replicas: Iterable[Replica]) -> list[Replica]:
    """Of the replicas llmgw would stop on its own, those it may: in the order given, while the model
    keeps at least ``min_ready`` ready replicas once they are gone."""
    return minimums.stops_allowed(ready=ready_count(model), min_ready=model.min_ready, replicas=replicas)
