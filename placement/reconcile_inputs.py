"""What a model's reconcile reads, as one digest per model: a round works only on the models whose
inputs moved since their last clean reconcile.

A model's inputs are its own row, its replicas (state, replacement, shedding mark, ready since) and
their shards (node, state), and — while it has replicas waiting for a node, or spans several nodes per
replica (a relabel may split one) — the cluster as the planner sees it: every node's view (readiness,
cordon, labels, domains, free cards, cores and memory, draws) and the facility's (settings, budgets,
holds, conditions). Nothing of the cluster moves a model whose replicas are all placed, so a thousand
placed models cost a few reads a round whatever else happens, and one changed model is worked on at once.

Some models are always worked on: one marked with an error (it is tried again), one with a replica in
motion (a drain's replacement, a shedding mark, a shard on a draining or silent node: the drain's steps
depend on time), and each model once every SWEEP_SECONDS, staggered (a net under the digest).

All sets read in a few queries whatever the number of models (no query per model).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from placement.models import Model, ModelEfficiency, Replica, ReplicaState, Shard

# Each model is reconciled at least this often, whatever its digest says: the digest's inputs are what
# the planner and drain read today; a rule that reads something else is still taken up within this.
SWEEP_SECONDS = 600

# The model's fields a reconcile reads (all but its error and the bookkeeping).
_MODEL_FIELDS = (
    "id", "name", "replicas", "service_class", "min_ready", "gpus", "nodes", "cpu_cores", "memory_gib",
    "power_watts", "keep_within", "node_selector", "topology", "command", "health_path", "min_ready_seconds",
)


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """One model's inputs: its digest, and whether it must be worked on whatever the digest (``why``)."""

    digest: str
    why: str = ""  # "" when only the digest decides


def _hash(parts: Iterable[object]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\x1f")
    return h.hexdigest()


def fleet_digest(views: list, facility) -> str:
    """The cluster as the planner sees it (snapshot.node_views and facility_view), as one digest."""

    def plain(value):
        if isinstance(value, dict):
            return sorted((repr(k), plain(v)) for k, v in value.items())
        return value

    return _hash([views, sorted((name, plain(getattr(facility, name))) for name in facility.__dataclass_fields__)])


def labels_digest(views: list) -> str:
    """What of the nodes splits a multi-node replica (placement.drain.replicas_split): labels and fabric."""
    return _hash((v.name, sorted(v.labels.items()), v.fabric) for v in views)


def models_inputs(
    models: list[Model],
    *,
    draining: dict[int, str],
    fleet: Callable[[], str],
    labels: Callable[[], str],
    now: datetime,
) -> dict[int, ModelInputs]:
    """Each model's inputs, by id. ``fleet()`` and ``labels()`` give the cluster's digests
    (:func:`fleet_digest`, :func:`labels_digest`), asked only when a model needs them; ``draining`` is
    node id → why it drains (placement.drain.draining_nodes)."""
    ids = [m.pk for m in models]
    rows = {row[0]: row for row in Model.objects.filter(pk__in=ids).values_list(*_MODEL_FIELDS)}
    replicas: dict[int, list[tuple]] = defaultdict(list)
    waiting: set[int] = set()
    moving: dict[int, str] = {}
    for model_id, pk, state, replaces, shed, ready_since in (
        Replica.objects.filter(model_id__in=ids)
        .order_by("model_id", "id")
        .values_list("model_id", "id", "state", "replaces_id", "shed_reason", "ready_since")
    ):
        replicas[model_id].append((pk, state, replaces, ready_since))
        if state == ReplicaState.PENDING:
            waiting.add(model_id)
        if replaces is not None:
            moving.setdefault(model_id, "a replacement in flight")
        elif shed:
            moving.setdefault(model_id, "a replica marked to shed")
    shards: dict[int, list[tuple]] = defaultdict(list)
    for model_id, replica_id, node_id, state in (
        Shard.objects.filter(replica__model_id__in=ids)
        .order_by("replica__model_id", "replica_id", "node_id")
        .values_list("replica__model_id", "replica_id", "node_id", "state")
    ):
        shards[model_id].append((replica_id, node_id, state))
        if node_id in draining:
            moving.setdefault(model_id, "a replica on a draining node")
    efficiency: dict[int, list[tuple]] = defaultdict(list)
    # Tokens per joule ranks nodes for the replicas that wait (placement.snapshot.profile_of).
    for model_id, *figures in (
        ModelEfficiency.objects.filter(model_id__in=sorted(waiting))
        .order_by("model_id", "gpu_model")
        .values_list("model_id", "gpu_model", "tokens_per_joule")
    ):
        efficiency[model_id].append(tuple(figures))
    epoch = now.timestamp()
    out: dict[int, ModelInputs] = {}
    for model in models:
        row = rows.get(model.pk)
        if row is None:
            continue
        wide = row[_MODEL_FIELDS.index("nodes")] > 1
        # Staggered by id: a few models a round, never all of them in one.
        sweep = int((epoch + (model.pk * 7919) % SWEEP_SECONDS) // SWEEP_SECONDS)
        parts: list[object] = [row, replicas.get(model.pk, ()), shards.get(model.pk, ()), sweep]
        if model.pk in waiting:
            parts += [efficiency.get(model.pk, ()), fleet()]
        elif wide:
            parts.append(labels())
        why = "its last reconcile failed" if model.error else moving.get(model.pk, "")
        out[model.pk] = ModelInputs(_hash(parts), why)
    return out
