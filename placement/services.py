"""Writes of placement: models (apply, delete) and freeing a replica's shards.

Every interface (ctl, API, console, admin, the reconcile) calls these. Parsing of model documents is
in :mod:`placement.documents`, the guarded commit in :mod:`placement.commit`, the reconcile in
:mod:`placement.reconcile`, what agents report in :mod:`placement.reports`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.db.models import F

from agents.models import GPU, Node
from llmgw.errors import NotFound
from llmgw.yamldoc import read_text
from placement import documents
from placement.commit import placeholders
from placement.models import Model, Replica, Shard
from placement.signals import placement_changed_on_commit


@dataclass
class Applied:
    """What applying one model document did: ``created``, ``updated`` or ``unchanged``."""

    name: str
    action: str


def _models_save(documents: list[dict[str, Any]]) -> list[Applied]:
    results = []
    for values in documents:
        name = values["name"]
        fields = {k: v for k, v in values.items() if k != "name"}
        model = Model.objects.select_for_update().filter(name=name).first()
        if model is None:
            Model.objects.create(name=name, **fields)
            results.append(Applied(name, "created"))
            continue
        changed = [k for k, v in fields.items() if getattr(model, k) != v]
        if changed:
            for key in changed:
                setattr(model, key, fields[key])
            model.save(update_fields=[*changed, "updated_at"])
        results.append(Applied(name, "updated" if changed else "unchanged"))
    _request_reconcile()
    return results


@transaction.atomic
def models_apply(*, text: str, filename: str = "models.yaml") -> list[Applied]:
    """Create or update the models of a multi-document YAML file: all of them, or none with the reason.

    A changed profile applies to replicas placed from now on; placed ones keep their shards.
    """
    return _models_save(documents.models_parse(text=text, filename=filename))


def models_apply_file(*, path: str | Path) -> list[Applied]:
    """``llmgw ctl apply -f models.yaml``."""
    return models_apply(text=read_text(path), filename=str(path))


@transaction.atomic
def model_apply(*, data: Any) -> Applied:
    """Create or update one model from a document given as data (the API's JSON body)."""
    return _models_save([documents.model_parse(data=data)])[0]


@transaction.atomic
def model_delete(*, name: str) -> int:
    """Delete a model: its replicas' shards are freed first (GPUs, cores, memory, placed watts).

    Returns how many replicas went with it.
    """
    model = Model.objects.select_for_update().filter(name=name).first()
    if model is None:
        raise NotFound(f"model {name!r} is not known", field="name")
    replicas = list(Replica.objects.filter(model=model).order_by("-ordinal"))
    for replica in replicas:
        replica_free(replica=replica)
    model.delete()
    _request_reconcile()
    return len(replicas)


def _request_reconcile() -> None:
    from placement.tasks import request_reconcile

    request_reconcile()
    placement_changed_on_commit()


# -- freeing ----------------------------------------------------------------------------------------------


@transaction.atomic
def replica_free(*, replica: Replica) -> bool:
    """Remove a replica and give back what its shards booked, in one transaction; False if already gone.

    Safe to call twice at once (two reconciles finishing one drain): the replica row is locked, and
    only the shards this call deletes are given back.
    """
    # Nodes first, by name, as a placement locks them (after budgets: freeing only lowers use).
    node_ids = list(Shard.objects.filter(replica=replica).values_list("node_id", flat=True))
    locked = set(nodes_lock(node_ids))
    if not Replica.objects.select_for_update().filter(pk=replica.pk).exists():
        return False  # freed meanwhile
    shard_ids = list(Shard.objects.filter(replica=replica).values_list("id", flat=True))
    if shard_ids:
        GPU.objects.filter(shard_id__in=shard_ids).update(shard=None)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {Shard._meta.db_table} WHERE id IN ({placeholders(shard_ids)}) "
                f"RETURNING node_id, cpu_cores, memory_gib, draw_watts",
                shard_ids,
            )
            deleted = cursor.fetchall()
        nodes_lock([row[0] for row in deleted if row[0] not in locked])  # placed between the two reads
        for node_id, cores, memory, draw in deleted:
            Node.objects.filter(pk=node_id).update(
                cpu_cores_allocated=F("cpu_cores_allocated") - cores,
                memory_gib_allocated=F("memory_gib_allocated") - memory,
                placed_watts=F("placed_watts") - (draw or 0),
            )
    Replica.objects.filter(pk=replica.pk).delete()
    placement_changed_on_commit()
    return True


def nodes_lock(node_ids: Iterable[int]) -> list[int]:
    """Lock the nodes by name (the order every placement locks them in); their ids."""
    ids = sorted(set(node_ids))
    if not ids:
        return []
    return list(Node.objects.select_for_update().filter(pk__in=ids).order_by("name").values_list("id", flat=True))
