"""Shedding's decisions: which domains are in trouble and since when, when each may act, and for each due
interval which replica moves, which batch replica is dropped, or why everything stays.

Pure: the shell (:mod:`placement.shedding`) reads the domains, the replicas on them and their models'
ready counts, and gives a ``place`` callable that plans a replacement on its planning index (the pure
planner's); what is decided here is the order, the rules and the words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from facility.response import SheddingConfig, ShedRule
from placement.decisions.domain_state import DomainState, widest_first
from placement.decisions.minimums import CLASS_ORDER, PLACED, READY, STARTING

MOVABLE_STATES = (PLACED, STARTING, READY)


@dataclass(frozen=True)
class Trouble:
    """A domain shedding may act on: why (hot, past its limit), since when, and when it may act next."""

    domain: str
    why: str
    since: datetime
    last_move_at: datetime | None


@dataclass(frozen=True, slots=True)
class ShedRecord:
    """What is kept of a domain's shedding (placement.models.ShedDomain): since when it has been in
    trouble without a break, and when shedding last acted there."""

    trouble_since: datetime | None = None
    last_move_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ShedCandidate:
    """A replica on a troubled domain (no replacement, none of its own, not already shed), with its model's
    class, minimum and ready replicas now."""

    replica_id: int
    ordinal: int
    state: str
    model_id: int
    model: str
    service_class: str
    min_ready: int
    ready: int

    @property
    def name(self) -> str:
        return f"{self.model}#{self.ordinal}"


@dataclass(frozen=True, slots=True)
class Fits:
    """A replacement fits on these nodes (and the planning index now holds it)."""

    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NoRoom:
    """No replacement fits, and why (the planner's no-fit summary)."""

    why: str


Place = Callable[[ShedCandidate], "Fits | NoRoom"]


@dataclass(frozen=True, slots=True)
class ShedMove:
    """One interval's decision on a domain: ``move`` (a replacement first), ``drop`` (a batch replica
    stopped without one) or ``stays``, the replica (None: nothing there shedding may move) and why."""

    at: datetime
    domain: str
    action: str
    reason: str
    candidate: ShedCandidate | None = None
    to: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """``{at, domain, action, replica, replica_id, model, class, to, reason}``: what ctl, the API and
        the console show."""
        c = self.candidate
        if c is None:
            return {"at": self.at.isoformat(), "domain": self.domain, "action": self.action, "replica": None,
                    "replica_id": None, "model": None, "class": None, "to": [], "reason": self.reason}
        return {"at": self.at.isoformat(), "domain": self.domain, "replica": c.name, "replica_id": c.replica_id,
                "model": c.model, "class": c.service_class, "action": self.action, "to": list(self.to),
                "reason": self.reason}


def domain_troubles(
    *, domains: Iterable[DomainState], records: Mapping[str, ShedRecord], now: datetime
) -> list[Trouble]:
    """Every domain hot under enforce mode or past its power limit now, with since when (the kept start
    of its trouble, or its condition's start if earlier, else now), the widest level first."""
    found: list[Trouble] = []
    for domain in domains:
        hot = domain.condition == "hot" and domain.enforce
        if not (hot or domain.over_limit):
            continue
        if hot:
            why = f"{domain.words} is hot ({domain.detail or 'set by hand'})"
        else:
            why = (
                f"{domain.words} is past its power limit "
                f"(use {domain.use_watts / 1000:.1f} kW, limit {domain.limit_watts / 1000:.1f} kW)"
            )
        record = records.get(domain.domain)
        since = record.trouble_since if record is not None else None
        if hot and domain.condition_since is not None:
            since = min(since, domain.condition_since) if since is not None else domain.condition_since
        found.append(Trouble(domain.domain, why, since or now, record.last_move_at if record is not None else None))
    return sorted(found, key=lambda t: widest_first(t.domain))


def shed_due(trouble: Trouble, rule: ShedRule, now: datetime) -> datetime:
    """When shedding may next act on the domain: ``shed_after`` into its trouble, an ``interval`` after its
    last move, and not before now."""
    due = trouble.since + timedelta(seconds=rule.shed_after)
    if trouble.last_move_at is not None:
        due = max(due, trouble.last_move_at + timedelta(seconds=rule.interval))
    return max(due, now)


def shed_steps(
    *, troubles: Sequence[Trouble], config: SheddingConfig, now: datetime, intervals: int,
    until: datetime | None = None,
) -> list[tuple[datetime, Trouble]]:
    """The next ``intervals`` intervals of every domain whose shedding is on, in time order (the troubles'
    order among equal times); only those due by ``until`` when given."""
    steps: list[tuple[datetime, int, Trouble]] = []
    for rank, trouble in enumerate(troubles):
        rule = config.rule(trouble.domain)
        if not rule.enabled:
            continue
        first = shed_due(trouble, rule, now)
        for i in range(intervals):
            at = first + timedelta(seconds=rule.interval * i)
            if until is None or at <= until:
                steps.append((at, rank, trouble))
    steps.sort(key=lambda s: (s[0], s[1]))
    return [(at, trouble) for at, _, trouble in steps]


def shed_order(candidates: Iterable[ShedCandidate]) -> list[ShedCandidate]:
    """The replicas shedding may move (placed, starting or ready; never a critical model's), lowest class
    first, a model above its minimum before one at it, then by model and the newest replica first."""
    found = [c for c in candidates if c.state in MOVABLE_STATES and c.service_class != "critical"]
    found.sort(key=lambda c: (CLASS_ORDER.get(c.service_class, 1), c.ready <= c.min_ready, c.model, -c.ordinal))
    return found


def standing(candidate: ShedCandidate, ready: int) -> str:
    """`batch, above its minimum: 2 ready, min 1`."""
    where = "above" if ready > candidate.min_ready else "at"
    return f"{candidate.service_class}, {where} its minimum: {ready} ready, min {candidate.min_ready}"


def shed_moves(
    *, steps: Iterable[tuple[datetime, Trouble]], candidates: Mapping[str, Iterable[ShedCandidate]],
    config: SheddingConfig, place: Place,
) -> list[ShedMove]:
    """Each step's decision, in order: the first replica (:func:`shed_order`) whose replacement ``place``
    fits moves; else, under ``drop_batch``, a batch replica above its minimum is dropped; else the domain
    stays, with the first replica's reason (listed once: later intervals would say the same). A model's
    ready count is taken as it will be after the drops decided before (a move keeps it: replacement first).

    ``candidates``: each stepped domain's replicas; ``place`` plans a replacement and, when it fits, keeps
    it on the planning index, so later steps plan around it.
    """
    ordered = {domain: shed_order(found) for domain, found in candidates.items()}
    taken: set[int] = set()
    stuck: set[str] = set()
    dropped: Counter[int] = Counter()  # model → its ready replicas dropped by earlier steps
    moves: list[ShedMove] = []
    for at, trouble in steps:
        if trouble.domain in stuck:
            continue
        rule = config.rule(trouble.domain)
        blocked: list[ShedMove] = []
        acted = False
        for candidate in ordered[trouble.domain]:
            if candidate.replica_id in taken:
                continue
            name = candidate.name
            ready = candidate.ready - dropped[candidate.model_id]
            result = place(candidate)
            if isinstance(result, Fits):
                taken.add(candidate.replica_id)
                moves.append(ShedMove(
                    at, trouble.domain, "move",
                    f"move {name} ({standing(candidate, ready)}) to {', '.join(result.nodes)}: {trouble.why}",
                    candidate, result.nodes,
                ))
                acted = True
                break
            if rule.drop_batch and candidate.service_class == "batch" and ready > candidate.min_ready:
                taken.add(candidate.replica_id)
                if candidate.state == READY:
                    dropped[candidate.model_id] += 1
                moves.append(ShedMove(
                    at, trouble.domain, "drop",
                    f"stop {name} without a replacement ({standing(candidate, ready)}; drop_batch; "
                    f"no replacement fits: {result.why}): {trouble.why}",
                    candidate,
                ))
                acted = True
                break
            blocked.append(ShedMove(
                at, trouble.domain, "stays",
                f"{name} stays ({standing(candidate, ready)}): no replacement fits: {result.why}", candidate,
            ))
        if not acted:
            if blocked:
                moves.append(blocked[0])
            else:
                moves.append(ShedMove(
                    at, trouble.domain, "stays",
                    f"nothing to move: no replica there that shedding may move ({trouble.why})",
                ))
            # The same question gets the same answer in later intervals: listed once.
            stuck.add(trouble.domain)
    return moves
