"""Draining: replicas move off held (draining) domains and drained nodes, the replacement up first.

For each model, one replica at a time: a replacement (``Replica.replaces``) is placed outside every
held domain; once it has been ready for the model's ``min_ready_seconds`` the old replica is stopped
and its room freed. A model never drops below the ready replicas it had because of a drain. If no
replacement fits, the old replica stays and the replacement waits, pending with the reason, and is
tried again as room appears. Releasing the hold (or uncordoning the node) stops the drain: a
replacement not yet done is removed, replicas already moved stay where they are.

A multi-node replica whose nodes are no longer in one fabric, or one domain of its model's
``keep_within`` (a node of it re-cabled, or moved rack by a relabel or a NetBox import, after it was
placed) moves by the same steps: its replacement is placed within one, then it stops.

All of it is rows (replicas, shards, holds, nodes), never a task's memory, so any reconcile — after a
restart, in another worker — resumes where the last one stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Q
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone

from agents.models import Node, NodeDomain, heartbeat_is_fresh
from facility.domains import LABEL_PREFIX
from facility.models import Hold
from llmgw.sqlin import any_of
from placement.decisions.drain import Original, Replacement, drain_starts, drain_stops, spans
from placement.minimums import ready_count
from placement.models import Model, Replica, ReplicaState, Shard
from placement.services import replicas_free

log = logging.getLogger(__name__)
# The states of a replica that serves, or is about to: one of them may span what it must not.
SERVING = frozenset((ReplicaState.PLACED, ReplicaState.STARTING, ReplicaState.READY))


def draining_nodes() -> dict[int, str]:
    """Node id → why it drains: in a domain held with drain (`rack:r12-07`), drained itself (`node`), or
    silent for LLMGW_EVICT_AFTER_SECONDS with replicas on it (`not ready`: they are replaced elsewhere,
    by the same one-at-a-time, replacement-first steps; if the node comes back first, nothing moves)."""
    holds = dict(Hold.objects.filter(drain=True).values_list("domain", "reason"))
    out: dict[int, str] = {}
    if holds:
        for node_id, domain in NodeDomain.objects.filter(domain__in=holds).values_list("node_id", "domain"):
            out.setdefault(node_id, domain)
    for node_id in Node.objects.filter(draining=True).values_list("id", flat=True):
        out.setdefault(node_id, "node")
    evict_after = settings.LLMGW_EVICT_AFTER_SECONDS
    if evict_after:
        cutoff = timezone.now() - timedelta(seconds=evict_after)
        silent = Node.objects.filter(last_heartbeat_at__lt=cutoff, shards__isnull=False).distinct()
        for node_id in silent.values_list("id", flat=True):
            out.setdefault(node_id, "not ready")
    return out


def _replicas_on(node_ids: set[int], model: Model | None = None) -> set[int]:
    shards = Shard.objects.filter(node_id__in=any_of(node_ids))  # a lost room's 2,500 nodes: one array
    if model is not None:
        shards = shards.filter(replica__model=model)
    return set(shards.values_list("replica_id", flat=True))


def replicas_split(model: Model) -> dict[int, str]:
    """The model's multi-node replicas (none a replacement) no longer within one fabric, or one domain of
    its ``keep_within`` level, as the planner keeps them: by id, what they span in words
    (:func:`placement.decisions.drain.spans`), read off their nodes now."""
    if model.nodes < 2:
        return {}
    shards = Shard.objects.filter(replica__model=model, replica__replaces__isnull=True).order_by()
    counted = {"fabrics": Count("node__fabric", distinct=True, filter=~Q(node__fabric=""))}
    wide = Q(fabrics__gt=1)
    if model.keep_within:
        shards = shards.annotate(value=KeyTextTransform(f"{LABEL_PREFIX}{model.keep_within}", "node__labels"))
        counted["domains"] = Count("value", distinct=True)  # (a missing label is NULL: not counted)
        wide |= Q(domains__gt=1)
    # The few that may span, found in the database; their words from their nodes, as listings say them.
    maybe = list(shards.values("replica_id").annotate(**counted).filter(wide).values_list("replica_id", flat=True))
    return _spanning(maybe, {pk: model.keep_within for pk in maybe}) if maybe else {}


def _spanning(replica_ids: list[int], keep_within: dict[int, str]) -> dict[int, str]:
    """Of these multi-node replicas (``keep_within``: each one's model's level), those whose nodes span
    what the planner keeps one within, with the words of :func:`spans`."""
    nodes: dict[int, list[tuple[str, dict]]] = defaultdict(list)
    for replica_id, fabric, labels in (
        Shard.objects.filter(replica_id__in=replica_ids).order_by().values_list("replica_id", "node__fabric", "node__labels")
    ):
        nodes[replica_id].append((fabric, labels or {}))
    found = {pk: spans(nodes[pk], keep_within=keep_within[pk]) for pk in nodes}
    return {pk: words for pk, words in found.items() if words}


def moving_reasons(replicas: Iterable[Replica], models: Mapping[int, Model]) -> dict[int, str]:
    """Why each of these replicas (``models``: theirs, by id) that serves (placed, starting, ready) is to
    move, by id, for listings: a node of it drains (itself, in a domain held with drain, or silent),
    shedding moves it, or it spans what its model keeps one within. Each is replaced first."""
    replicas = [r for r in replicas if r.replaces_id is None and r.state in SERVING]
    out: dict[int, str] = {r.pk: f"shed ({r.shed_reason}): to be replaced" for r in replicas if r.shed_reason}
    draining = draining_nodes() if replicas else {}
    if draining:
        on = Shard.objects.filter(replica_id__in=[r.pk for r in replicas], node_id__in=any_of(set(draining)))
        for replica_id, node_id, node in on.order_by("node__name").values_list("replica_id", "node_id", "node__name"):
            why = draining[node_id]
            if why == "node":
                text = f"{node} drains"
            elif why == "not ready":
                text = f"{node} is not ready (no heartbeat)"
            else:
                text = f"{why.replace(':', ' ', 1)} is held with drain"
            out.setdefault(replica_id, f"{text}: to be replaced, the replacement up first")
    kept = {
        r.pk: models[r.model_id].keep_within for r in replicas if models[r.model_id].nodes > 1 and r.pk not in out
    }
    if kept:
        out.update({pk: f"spans {words}: to be replaced within one" for pk, words in _spanning(list(kept), kept).items()})
    return out


def replicas_drain(*, model: Model, run, draining: dict[int, str] | None = None) -> None:
    """One step of the model's drain: finish the replacements that are ready, make the next ones.

    Reads the rows, asks :mod:`placement.decisions.drain` what stops and what gets a replacement, and
    writes that. The replacements it makes are pending replicas: the reconcile places them next, with the
    rest.

    ``run`` is the :class:`placement.reconcile.ReconcileRun` this step belongs to.
    """
    draining = draining_nodes() if draining is None else draining
    moving = _replicas_on(set(draining), model) if draining else set()
    # Replicas shedding marked move by the same steps (placement.shedding placed their replacement).
    moving |= set(Replica.objects.filter(model=model).exclude(shed_reason="").values_list("id", flat=True))
    # Multi-node replicas a relabel (or a re-cabled fabric) split across their keep_within domain or
    # fabric, or placed before keep_within was set: replaced within one, while nothing else of the model
    # moves. A drain or shedding goes first: the replacements of split ones give their room back
    # (drain_stops: no longer moving), and one whose replacement cannot be placed never holds it back.
    split = {} if moving else replicas_split(model)
    moving |= set(split)
    stops = drain_stops(
        replacements=_replacements(model, run.now), moving=moving, ready=ready_count(model),
        min_ready=model.min_ready, min_ready_seconds=model.min_ready_seconds,
        surge=settings.LLMGW_DRAIN_SURGE, now=run.now,
    )
    # Everything this step stops is freed at once: one lock of all their nodes, in the global order.
    freed = set(Shard.objects.filter(replica_id__in=stops.stop).values_list("node__name", flat=True)) if stops.stop else set()
    run.removed += replicas_free(replica_ids=list(stops.stop))
    run.refresh(freed)
    # Nothing to move, or no room (as many replacements in flight as the surge allows): no read of the
    # model's replicas. This runs for every model on every reconcile.
    if stops.room <= 0 or not stops.waiting:
        return
    # The model's replicas in order, picked by the decision: as `pk IN (thousands on the drained room)` with
    # `NOT EXISTS (a replacement)` the database may nest the anti join over the whole table whenever its
    # statistics lag a bulk change (a lost room), for each model of each reconcile.
    originals = drain_starts(
        originals=(
            Original(pk, state)
            for pk, state in Replica.objects.filter(model=model, replaces__isnull=True)
            .order_by("ordinal")
            .values_list("pk", "state")
        ),
        waiting=stops.waiting,
        room=stops.room,
    )
    if not originals:
        return
    for original in originals:
        if original in split:
            log.warning("model %s: replica %s spans %s: a replacement within one first, then it stops",
                        model.name, original, split[original])
    start = _next_ordinal(model)
    created = Replica.objects.bulk_create(
        [
            Replica(model=model, ordinal=start + i, state=ReplicaState.PENDING, replaces_id=original)
            for i, original in enumerate(originals)
        ]
    )
    if created[0].pk is None:  # a backend that gives no ids back from bulk_create: read them
        created = list(Replica.objects.filter(model=model, ordinal__gte=start).order_by("ordinal"))
    run.created += len(created)
    # Placed by the reconcile's next step with the model's other pending replicas, after the model's
    # lock is given back: a surge of hundreds then holds no budget or node locks for the whole step.


def _replacements(model: Model, now: datetime) -> list[Replacement]:
    """The model's replacements as the drain step reads them: whom each replaces, its state and since when
    it is ready, and whether the nodes of its shards are heartbeating now."""
    # Only these columns (not the explains, a JSON document each): a lost room's thousands.
    rows = list(
        Replica.objects.filter(model=model, replaces__isnull=False).values_list(
            "pk", "replaces_id", "replaces__state", "state", "ready_since"
        )
    )
    if not rows:
        return []
    quiet = {
        replica_id
        for replica_id, last, interval in Node.objects.filter(shards__replica_id__in=[row[0] for row in rows])
        .values_list("shards__replica_id", "last_heartbeat_at", "heartbeat_interval_seconds")
        if not heartbeat_is_fresh(last, interval, now)
    }
    return [
        Replacement(pk, replaces, replaces_state, state, ready_since, nodes_ready=pk not in quiet)
        for pk, replaces, replaces_state, state, ready_since in rows
    ]


def _next_ordinal(model: Model) -> int:
    last = Replica.objects.filter(model=model).order_by("-ordinal").values_list("ordinal", flat=True).first()
    return (last or 0) + 1


@dataclasses.dataclass
class DrainProgress:
    """How a draining hold (or node) is doing: replicas still on it, moving, and blocked with the reason."""

    left: int = 0
    moving: int = 0
    blocked: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"left": self.left, "moving": self.moving, "blocked": self.blocked}

    @property
    def text(self) -> str:
        if not self.left:
            return "drained"
        parts = [f"{self.left} left", f"{self.moving} moving"]
        if self.blocked:
            parts.append(f"{len(self.blocked)} blocked: {self.blocked[0]['reason']}")
        return ", ".join(parts)


def drain_progress(holds: list[Hold] | None = None) -> dict[str, DrainProgress]:
    """Per draining hold's domain (and `node:<name>` for drained nodes): left, moving, blocked and why.

    `holds`: every hold, when the caller has read them already.
    """
    if holds is None:
        holds = list(Hold.objects.filter(drain=True))
    holds = {h.domain for h in holds if h.drain}
    drained_nodes = dict(Node.objects.filter(draining=True).values_list("id", "name"))
    if not holds and not drained_nodes:
        return {}
    where: dict[int, set[str]] = defaultdict(set)
    for node_id, domain in NodeDomain.objects.filter(domain__in=holds).values_list("node_id", "domain"):
        where[node_id].add(domain)
    for node_id, name in drained_nodes.items():
        where[node_id].add(f"node:{name}")
    progress = {key: DrainProgress() for key in holds | {f"node:{n}" for n in drained_nodes.values()}}
    shards = Shard.objects.filter(Q(node_id__in=any_of(where)), replica__replaces__isnull=True).values_list(
        "node_id", "replica_id", "replica__model__name", "replica__ordinal"
    )
    replica_keys: dict[int, set[str]] = defaultdict(set)
    names: dict[int, str] = {}
    for node_id, replica_id, model_name, ordinal in shards:
        replica_keys[replica_id] |= where[node_id]
        names[replica_id] = f"{model_name}#{ordinal}"
    replacement_of = {
        r.replaces_id: r for r in Replica.objects.filter(replaces_id__in=any_of(replica_keys)).only("replaces_id", "state", "reason")
    }
    for replica_id, keys in replica_keys.items():
        replacement = replacement_of.get(replica_id)
        for key in keys:
            p = progress[key]
            p.left += 1
            if replacement is None:
                continue
            if replacement.state == ReplicaState.PENDING:
                p.blocked.append({"replica": names[replica_id], "reason": replacement.reason})
            else:
                p.moving += 1
    return progress
