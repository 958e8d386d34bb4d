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
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents.models import NodeDomain
from facility.evaluation import effective_conditions
from facility.models import ConditionEvent, FacilitySettings
from facility.response import SheddingConfig, parse_shedding_config
from facility.selectors import facility_overview
from placement import snapshot
from placement.commit import replica_place
from placement.index import PlacementIndex
from placement.minimums import CLASS_ORDER, stops_allowed
from placement.models import Model, Replica, ReplicaState, Shard, ShedDomain
from placement.planner import NoFit
from placement.services import replicas_free
from placement.signals import placement_changed_on_commit

MOVABLE_STATES = (ReplicaState.PLACED, ReplicaState.STARTING, ReplicaState.READY)
LEVEL_ORDER = {"site": 0, "room": 1, "row": 2, "rack": 3, "pdu": 4}


def shedding_config() -> SheddingConfig:
    """The stored facility.shedding (validated when applied)."""
    return parse_shedding_config(FacilitySettings.load().shedding or None)


@dataclasses.dataclass(frozen=True)
class Trouble:
    """A domain shedding may act on: why (hot, past its limit), since when, and when it may act next."""

    domain: str
    why: str
    since: datetime
    last_move_at: datetime | None


def _domain_words(text: str) -> str:
    return text.replace(":", " ", 1)


def troubles(*, now: datetime, remember: bool = False) -> list[Trouble]:
    """Every domain hot under enforce mode or past its power limit now, with since when (kept in
    ShedDomain rows when ``remember``: the periodic run does, the dry run only reads)."""
    conditions = effective_conditions(now=now)
    rows = {r.domain: r for r in ShedDomain.objects.all()}
    found: list[Trouble] = []
    in_trouble: set[str] = set()
    for domain in facility_overview()["domains"]:
        text = domain["domain"]
        condition = conditions.get(text) or {}
        hot = condition.get("condition") == "hot" and condition.get("enforce")
        if not (hot or domain["over_limit"]):
            continue
        in_trouble.add(text)
        if hot:
            why = f"{_domain_words(text)} is hot ({condition.get('detail') or 'set by hand'})"
        else:
            why = (
                f"{_domain_words(text)} is past its power limit "
                f"(use {domain['use_watts'] / 1000:.1f} kW, limit {domain['limit_watts'] / 1000:.1f} kW)"
            )
        row = rows.get(text)
        since = row.trouble_since if row is not None and row.trouble_since is not None else None
        if hot and condition.get("since") is not None:
            since = min(since, condition["since"]) if since is not None else condition["since"]
        since = since or now
        if remember:
            if row is None:
                row = ShedDomain.objects.create(domain=text, trouble_since=since)
            elif row.trouble_since != since:
                row.trouble_since = since
                row.save(update_fields=["trouble_since"])
        found.append(Trouble(text, why, since, row.last_move_at if row is not None else None))
    if remember:
        # Out of trouble: the clock starts again next time (the last move's time is kept: the rate).
        ShedDomain.objects.exclude(domain__in=in_trouble).exclude(trouble_since=None).update(trouble_since=None)
    order = lambda t: (LEVEL_ORDER.get(t.domain.split(":")[0], 9), t.domain)  # noqa: E731
    return sorted(found, key=order)


def _candidates(domain: str) -> list[tuple[Replica, Model, int]]:
    """The domain's replicas shedding may move, lowest class first, those above their minimum first."""
    node_ids = list(NodeDomain.objects.filter(domain=domain).values_list("node_id", flat=True))
    ids = set(Shard.objects.filter(node_id__in=node_ids).values_list("replica_id", flat=True))
    replicas = list(
        Replica.objects.filter(pk__in=ids, replaces__isnull=True, shed_reason="", state__in=MOVABLE_STATES)
        .filter(replaced_by__isnull=True)
        .select_related("model")
    )
    ready: dict[int, int] = {}
    for model_id in {r.model_id for r in replicas}:
        ready[model_id] = Replica.objects.filter(model_id=model_id, state=ReplicaState.READY).count()
    found = [
        (r, r.model, ready[r.model_id]) for r in replicas if r.model.service_class != "critical"
    ]
    found.sort(
        key=lambda c: (CLASS_ORDER.get(c[1].service_class, 1), c[2] <= c[1].min_ready, c[1].name, -c[0].ordinal)
    )
    return found


def _standing(model: Model, ready: int) -> str:
    where = "above" if ready > model.min_ready else "at"
    return f"{model.service_class}, {where} its minimum: {ready} ready, min {model.min_ready}"


def _index() -> PlacementIndex:
    """The cluster as placement sees it at this moment: node readiness is judged now, whatever moment
    the shed is planned for (a dry run looks ahead; the nodes it plans on are the ones up now)."""
    return PlacementIndex(snapshot.node_views(), snapshot.facility_view())


def _due(trouble: Trouble, config: SheddingConfig, now: datetime) -> datetime:
    rule = config.rule(trouble.domain)
    due = trouble.since + timedelta(seconds=rule.shed_after)
    if trouble.last_move_at is not None:
        due = max(due, trouble.last_move_at + timedelta(seconds=rule.interval))
    return max(due, now)


def shed_plan(
    *, now: datetime | None = None, intervals: int = 3, index: PlacementIndex | None = None,
    config: SheddingConfig | None = None, until: datetime | None = None, remember: bool = False,
) -> list[dict[str, Any]]:
    """The moves of the next ``intervals`` intervals of every domain shedding would act on, in order.

    Each is ``{at, domain, action (move|drop|stays), replica, model, class, to, reason}``; ``until``
    keeps only those due by then (the real run: now). The index is planned on, not committed.
    """
    now = now or timezone.now()
    config = config or shedding_config()
    if not config.any_enabled:
        return []
    index = index or _index()
    steps: list[tuple[datetime, int, Trouble]] = []
    for rank, trouble in enumerate(troubles(now=now, remember=remember)):
        rule = config.rule(trouble.domain)
        if not rule.enabled:
            continue
        first = _due(trouble, config, now)
        for i in range(intervals):
            at = first + timedelta(seconds=rule.interval * i)
            if until is None or at <= until:
                steps.append((at, rank, trouble))
    steps.sort(key=lambda s: (s[0], s[1]))
    taken: set[int] = set()
    placed: dict[int, list[frozenset[str]]] = {}
    moves: list[dict[str, Any]] = []
    candidates: dict[str, list[tuple[Replica, Model, int]]] = {}
    stuck: set[str] = set()
    for at, _, trouble in steps:
        if trouble.domain in stuck:
            continue
        if trouble.domain not in candidates:
            candidates[trouble.domain] = _candidates(trouble.domain)
        rule = config.rule(trouble.domain)
        blocked: list[dict[str, Any]] = []
        acted = False
        for replica, model, ready in candidates[trouble.domain]:
            if replica.pk in taken:
                continue
            name = f"{model.name}#{replica.ordinal}"
            request = snapshot.replica_request(model)
            extra = tuple(placed.get(model.pk, []))
            if extra:
                request = dataclasses.replace(request, existing=(*request.existing, *extra))
            result = index.plan(request)
            base = {"at": at.isoformat(), "domain": trouble.domain, "replica": name, "replica_id": replica.pk,
                    "model": model.name, "class": model.service_class}
            if not isinstance(result, NoFit):
                index.apply(result)
                placed.setdefault(model.pk, []).append(result.nodes)
                taken.add(replica.pk)
                to = sorted(result.nodes)
                moves.append(base | {
                    "action": "move", "to": to,
                    "reason": f"move {name} ({_standing(model, ready)}) to {', '.join(to)}: {trouble.why}",
                })
                acted = True
                break
            why_not = result.summary
            if rule.drop_batch and model.service_class == "batch" and ready > model.min_ready:
                taken.add(replica.pk)
                moves.append(base | {
                    "action": "drop", "to": [],
                    "reason": f"stop {name} without a replacement ({_standing(model, ready)}; drop_batch; "
                    f"no replacement fits: {why_not}): {trouble.why}",
                })
                acted = True
                break
            blocked.append(base | {
                "action": "stays", "to": [],
                "reason": f"{name} stays ({_standing(model, ready)}): no replacement fits: {why_not}",
            })
        if not acted:
            if blocked:
                moves.append(blocked[0])
            else:
                moves.append({"at": at.isoformat(), "domain": trouble.domain, "action": "stays", "replica": None,
                              "replica_id": None, "model": None, "class": None, "to": [],
                              "reason": f"nothing to move: no replica there that shedding may move ({trouble.why})"})
            # The same question gets the same answer in later intervals: listed once.
            stuck.add(trouble.domain)
    return moves


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
        Replica.objects.filter(pk=replica.pk).update(shed_reason=move["reason"][:1000])
        last = Replica.objects.filter(model=model).order_by("-ordinal").values_list("ordinal", flat=True).first()
        replacement = Replica.objects.create(
            model=model, ordinal=(last or 0) + 1, state=ReplicaState.PENDING, replaces=replica
        )
    outcome = replica_place(replica=replacement, request=snapshot.replica_request(model), index=index)
    if outcome.plan is None:
        # Lost the room between plan and commit: the replacement waits, pending with the reason, as a drain's does.
        return move | {"to": [], "reason": f"{move['reason']} (waiting: {outcome.reason})"}
    return move | {"to": sorted(outcome.plan.nodes)}
