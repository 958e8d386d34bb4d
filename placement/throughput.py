"""Tokens per watt: each model's measured tokens per second and tokens per joule on each GPU model.

A replica's figure is its reported generated tokens per second (agents.selectors.replica_tokens_per_second)
over the power its GPUs read in the same heartbeats (``sensors.gpus[].power_watts`` of its shards'
cards). :func:`efficiency_record` keeps the per model × GPU model means (ModelEfficiency rows), after
each evaluation of conditions; a pair with no fresh figure keeps its last one. The planner reads them
through the profile (:func:`tokens_per_joule_of`) and, among candidates otherwise equal up to the
headroom step, prefers the GPU model that serves the model with more tokens per joule.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.utils import timezone

from agents.models import GPU, Node
from agents.selectors import replica_tokens_per_second
from llmgw.sqlin import any_of
from placement.models import Model, ModelEfficiency, Replica, ReplicaState, Shard
from placement.snapshot import gpu_figures, gpu_figures_sql, gpu_model_of


def measured_efficiency() -> dict[tuple[int, str], dict[str, float]]:
    """(model id, GPU model) → {replicas, tokens_per_second, watts, tokens_per_joule}, from the last reports."""
    reported = replica_tokens_per_second()
    if not reported:
        return {}
    ready = dict(
        Replica.objects.filter(pk__in=any_of(reported), state=ReplicaState.READY).values_list("id", "model_id")
    )
    shards = list(Shard.objects.filter(replica_id__in=any_of(ready)).values_list("replica_id", "node_id", "gpu_indices"))
    # A replica's figure is what the nodes it runs on report (the largest: a replica spread over nodes is
    # served, and counted, by one of them); a node naming another node's replica is not heard.
    figures: dict[int, float] = {}
    for replica_id, node_id, _ in shards:
        figure = reported[replica_id].get(node_id)
        if figure is not None:
            figures[replica_id] = max(figures.get(replica_id, 0.0), figure)
    node_ids = {node_id for _, node_id, _ in shards}
    power: dict[tuple[int, int], float] = {}
    # Each card's power only, picked out by the database (not the ~3 KB sensors documents, each round).
    drawn = Node.objects.filter(pk__in=any_of(node_ids)).values_list("id", gpu_figures_sql("power_watts"))
    for node_id, pairs in drawn:
        for index, watts in gpu_figures(pairs).items():
            power[(node_id, index)] = watts
    products = {(n, i): p for n, i, p in GPU.objects.filter(node_id__in=any_of(node_ids)).values_list("node_id", "index", "model")}
    sums: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    per_replica: dict[int, list] = {}
    for replica_id, node_id, indices in shards:
        entry = per_replica.setdefault(replica_id, [0.0, None, True])
        for index in indices or ():
            watts = power.get((node_id, index))
            if watts is None:
                entry[2] = False  # a card without a reading: the replica's power is not known
                continue
            entry[0] += watts
            entry[1] = entry[1] or gpu_model_of(products.get((node_id, index)) or "")
    for replica_id, (watts, gpu_model, complete) in per_replica.items():
        if replica_id not in figures or not complete or not gpu_model or watts <= 0:
            continue
        total = sums[(ready[replica_id], gpu_model)]
        total[0] += 1
        total[1] += figures[replica_id]
        total[2] += watts
    return {
        key: {"replicas": n, "tokens_per_second": tps / n, "watts": w / n, "tokens_per_joule": tps / w}
        for key, (n, tps, w) in sums.items()
    }


def efficiency_record(*, now: datetime | None = None) -> int:
    """Keep the fresh figures (ModelEfficiency rows); returns how many pairs were measured."""
    now = now or timezone.now()
    found = measured_efficiency()
    for (model_id, gpu_model), values in found.items():
        ModelEfficiency.objects.update_or_create(
            model_id=model_id, gpu_model=gpu_model,
            defaults={**{k: round(v, 4) for k, v in values.items() if k != "replicas"},
                      "replicas": int(values["replicas"]), "measured_at": now},
        )
    return len(found)


def tokens_per_joule_of(model: Model) -> tuple[tuple[str, float], ...]:
    """The model's kept tokens per joule per GPU model, as the planner's profile takes them."""
    return tuple(
        (gpu_model, value)
        for gpu_model, value in ModelEfficiency.objects.filter(model=model).values_list("gpu_model", "tokens_per_joule")
    )


def efficiency_rows() -> dict[str, list[dict[str, Any]]]:
    """Model name → its figures per GPU model, for ctl models, the API and the console."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ModelEfficiency.objects.select_related("model").order_by("model__name", "-tokens_per_joule"):
        out[row.model.name].append({
            "gpu_model": row.gpu_model, "replicas": row.replicas, "tokens_per_second": row.tokens_per_second,
            "watts": row.watts, "tokens_per_joule": row.tokens_per_joule, "measured_at": row.measured_at.isoformat(),
        })
    return dict(out)
