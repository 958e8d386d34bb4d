"""Shedding: load moves off a domain that has been hot (enforce mode) or past its power limit too long.

Off unless server.yaml sets ``facility.shedding.enabled`` (for all domains or some). A domain in trouble
for longer than ``shed_after`` loses one replica per ``interval``: the lowest class first (batch, then
standard; a critical model is never shed), a model above its ``min_ready`` before one at it. Each move
is the drain's: a replacement placed by the planner (which refuses hot-under-enforce, held and full
domains), and the old replica stopped by the drain step once the replacement has been ready for the
model's ``min_ready_seconds`` (:mod:`placement.drain` treats a replica marked ``shed_reason`` as on a
draining node). Where no replacement fits the replica stays and the shed says why; a batch replica
above its minimum is then stopped without one only when ``drop_batch`` is set.

One planner, :func:`shed_plan`, answers both the dry run (``llmgw ctl facility shed --dry-run``: the
next intervals) and the real thing (:func:`shed_run`, the due moves now), so they say the same. Every
action is a :class:`facility.models.ConditionEvent` in the domain's timeline (``readings.shed`` holds
the move), which ``llmgw_shed_moves_total`` counts.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents.models import NodeDomain
from facility.evaluation import effective_conditions
from facility.models import ConditionEvent, FacilitySettings
from facility.response import SheddingConfig, parse_shedding_config
from facility.selectors import facility_overview
from llmgw.lock_order import rows_locked
from placement import snapshot
from placement.commit import replica_place
from placement.decisions.domain_state import DomainState
from placement.decisions.shedding import (
    Fits,
    NoRoom,
    ShedCandidate,
    ShedRecord,
    Trouble,
    domain_troubles,
    shed_moves,
    shed_steps,
)
from placement.index import PlacementIndex
from placement.minimums import stops_allowed
from placement.models import Model, Replica, ReplicaState, Shard, ShedDomain
from placement.planner import NoFit
from placement.services import replicas_free
from placement.signals import placement_changed_on_commit


def shedding_config() -> SheddingConfig:
    """The stored facility.shedding (validated when applied)."""
    return parse_shedding_config(FacilitySettings.load().shedding or None)


def domain_states(*, now: datetime) -> list[DomainState]:
    """Every domain's figures and effective condition now, as shedding and capping judge them."""
    conditions = effective_conditions(now=now)
    found = []
    for domain in facility_overview()["domains"]:
        condition = conditions.get(domain["domain"]) or {}
        found.append(DomainState(
            domain["domain"], use_watts=domain["use_watts"], limit_watts=domain["limit_watts"],
            over_limit=bool(domain["over_limit"]), condition=condition.get("condition"),
            enforce=bool(condition.get("enforce")), detail=condition.get("detail"),
            condition_since=condition.get("since"),
        ))
    return found


def troubles(*, now: datetime, remember: bool = False) -> list[Trouble]:
    """Every domain hot under enforce mode or past its power limit now, with since when (kept in
    ShedDomain rows when ``remember``: the periodic run does, the dry run only reads)."""
    rows = {r.domain: r for r in ShedDomain.objects.all()}
    found = domain_troubles(
        domains=domain_states(now=now),
        records={domain: ShedRecord(row.trouble_since, row.last_move_at) for domain, row in rows.items()},
        now=now,
    )
    if remember:
        for trouble in found:
            row = rows.get(trouble.domain)
            if row is None:
                ShedDomain.objects.create(domain=trouble.domain, trouble_since=trouble.since)
            elif row.trouble_since != trouble.since:
                row.trouble_since = trouble.since
                row.save(update_fields=["trouble_since"])
        # Out of trouble: the clock starts again next time (the last move's time is kept: the rate).
        in_trouble = [trouble.domain for trouble in found]
        ShedDomain.objects.exclude(domain__in=in_trouble).exclude(trouble_since=None).update(trouble_since=None)
    return found


def _candidates(domain: str) -> tuple[list[ShedCandidate], dict[int, Model]]:
    """The domain's replicas that no move concerns yet (no replacement, none of their own, not shed), with
    their models' ready counts; and those models."""
    node_ids = list(NodeDomain.objects.filter(domain=domain).values_list("node_id", flat=True))
    ids = set(Shard.objects.filter(node_id__in=node_ids).values_list("replica_id", flat=True))
    replicas = list(
        Replica.objects.filter(pk__in=ids, replaces__isnull=True, shed_reason="")
        .filter(replaced_by__isnull=True)
        .select_related("model")
    )
    models = {r.model_id: r.model for r in replicas}
    ready = {
        model_id: Replica.objects.filter(model_id=model_id, state=ReplicaState.READY).count() for model_id in models
    }
    return [
        ShedCandidate(r.pk, r.ordinal, r.state, r.model_id, r.model.name, r.model.service_class, r.model.min_ready,
                      ready[r.model_id])
        for r in replicas
    ], models


def _index() -> PlacementIndex:
    """The cluster as placement sees it at this moment: node readiness is judged now, whatever moment
    the shed is planned for (a dry run looks ahead; the nodes it plans on are the ones up now)."""
    return PlacementIndex(snapshot.node_views(), snapshot.facility_view())


def shed_plan(
    *, now: datetime | None = None, intervals: int = 3, index: PlacementIndex | None = None,
    config: SheddingConfig | None = None, until: datetime | None = None, remember: bool = False,
) -> list[dict[str, Any]]:
    """The moves of the next ``intervals`` intervals of every domain shedding would act on, in order.

    Each is ``{at, domain, action (move|drop|stays), replica, model, class, to, reason}``; ``until``
    keeps only those due by then (the real run: now). The index is planned on, not committed. What to
    move is :func:`placement.decisions.shedding.shed_moves`'s to decide; this reads for it and plans.
    """
    now = now or timezone.now()
    config = config or shedding_config()
    if not config.any_enabled:
        return []
    index = index or _index()
    steps = shed_steps(troubles=troubles(now=now, remember=remember), config=config, now=now,
                       intervals=intervals, until=until)
    candidates: dict[str, list[ShedCandidate]] = {}
    models: dict[int, Model] = {}
    for _, trouble in steps:
        if trouble.domain not in candidates:
            candidates[trouble.domain], found = _candidates(trouble.domain)
            models.update(found)
    placed: dict[int, list[frozenset[str]]] = {}

    def place(candidate: ShedCandidate) -> Fits | NoRoom:
        """A replacement planned on the index, kept there when it fits (later steps plan around it)."""
        model = models[candidate.model_id]
        request = snapshot.replica_request(model)
        extra = tuple(placed.get(model.pk, []))
        if extra:
            request = dataclasses.replace(request, existing=(*request.existing, *extra))
        result = index.plan(request)
        if isinstance(result, NoFit):
            return NoRoom(result.summary)
        index.apply(result)
        placed.setdefault(model.pk, []).append(result.nodes)
        return Fits(tuple(sorted(result.nodes)))

    return [move.as_dict() for move in shed_moves(steps=steps, candidates=candidates, config=config, place=place)]


def shed_listing(*, intervals: int = 3) -> dict[str, Any]:
    """What ``llmgw ctl facility shed --dry-run`` and ``GET /api/v1/facility/shed`` show: whether shedding
    is on anywhere, and :func:`shed_plan`'s moves of the next ``intervals`` intervals."""
    config = shedding_config()
    return {"enabled": config.any_enabled, "moves": shed_plan(intervals=intervals, config=config)}


def _event(trouble_domain: str, condition: str, move: dict[str, Any], now: datetime) -> ConditionEvent:
    return ConditionEvent(
        domain=trouble_domain, before=condition, after=condition, reason=f"shed: {move['reason']}"[:1000],
        readings={"shed": {k: move[k] for k in ("action", "replica", "model", "class", "to")}}, at=now,
    )


def shed_run(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """Do the moves due now (the periodic evaluation runs it after judging conditions); what was done.

    With shedding off nothing moves and nothing is written.
    """
    now = now or timezone.now()
    config = shedding_config()
    if not config.any_enabled:
        return []
    index = _index()
    due = shed_plan(now=now, intervals=1, index=index, config=config, until=now, remember=True)
    if not due:
        return []
    # The plan applied its moves to this index; the commit plans on a fresh one, as the planner saw it.
    index = _index()
    conditions = effective_conditions(now=now)
    done: list[dict[str, Any]] = []
    events: list[ConditionEvent] = []
    for move in due:
        outcome = _act(move, index, now)
        done.append(outcome)
        condition = (conditions.get(move["domain"]) or {}).get("condition") or "unknown"
        events.append(_event(move["domain"], condition, outcome, now))
        ShedDomain.objects.filter(domain=move["domain"]).update(last_move_at=now)
    ConditionEvent.objects.bulk_create(events)
    placement_changed_on_commit()
    return done


def _act(move: dict[str, Any], index: PlacementIndex, now: datetime) -> dict[str, Any]:
    if move["action"] == "stays":
        return move
    replica = Replica.objects.select_related("model").filter(pk=move["replica_id"]).first()
    if replica is None:
        return move | {"action": "stays", "reason": f"{move['replica']} is gone"}
    model = replica.model
    if move["action"] == "drop":
        if not stops_allowed(model=model, replicas=[replica]):
            return move | {"action": "stays", "reason": f"{move['replica']} stays: its model is at its minimum"}
        replicas_free(replica_ids=[replica.pk])
        return move
    with transaction.atomic():
        # The model row serialises its ordinals, as reconcile's scaling and drain take it: a reconcile
        # scaling the model up meanwhile never writes the ordinal this replacement takes.
        locked = rows_locked(Model.objects.filter(pk=model.pk)).exists()
        if not locked or not Replica.objects.filter(pk=replica.pk).update(shed_reason=move["reason"][:1000]):
            return move | {"action": "stays", "reason": f"{move['replica']} is gone"}
        last = Replica.objects.filter(model=model).order_by("-ordinal").values_list("ordinal", flat=True).first()
        replacement = Replica.objects.create(
            model=model, ordinal=(last or 0) + 1, state=ReplicaState.PENDING, replaces=replica
        )
    outcome = replica_place(replica=replacement, request=snapshot.replica_request(model), index=index)
    if outcome.plan is None:
        # Lost the room between plan and commit: the replacement waits, pending with the reason, as a drain's does.
        return move | {"to": [], "reason": f"{move['reason']} (waiting: {outcome.reason})"}
    return move | {"to": sorted(outcome.plan.nodes)}
