"""A placement run's lanes: each model's pending replicas, what became of them, and the run's counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from placement.commit.outcomes import Pending, Placement
from placement.commit.single import replicas_pending_mark
from placement.planner import Plan, ReplicaRequest

# Plans committed together in one transaction by replicas_place (PostgreSQL): the commit, not the
# plan, is what one placement at a time waits on. A batch locks the members of the budgeted domains it
# touches (most of a small cluster's nodes, whatever its size), so a larger batch spreads that lock and
# its commit over more placements, while each transaction stays short (bench/placements.py).
BATCH = 128


@dataclass
class Planned:
    """A replica of a batch: its tries so far, what it lost, the nodes excluded since."""

    replica: Pending
    attempt: int = 1
    conflicts: list[str] = field(default_factory=list)
    exclude: set[str] = field(default_factory=set)
    plan: Plan | None = None
    explain: dict[str, Any] | None = None
    tried: bool = False  # planned once at least: counted against a run's bound on tries


@dataclass
class Lane:
    """One model's pending replicas in a placement run (:func:`lanes_place`), and what became of them.

    ``outcomes`` has each replica tried, by id; ``stopped`` is the replica nothing fitted (the ones after
    it were not tried: they ask the same and get the same); ``cut`` says the run's bound on tries came
    first; ``error`` is what its placement raised (the run stops there: the caller decides the rest).
    """

    replicas: list[Pending]
    request: ReplicaRequest
    outcomes: dict[int, Placement] = field(default_factory=dict)
    stopped: Pending | None = None
    cut: bool = False
    error: Exception | None = None
    queue: list[Planned] = field(init=False, repr=False)
    existing: list[frozenset[str]] = field(init=False, repr=False)  # the model's replicas, as planned

    def __post_init__(self) -> None:
        self.queue = [Planned(r) for r in self.replicas]
        self.existing = list(self.request.existing)

    def tried(self) -> list[tuple[Pending, Placement]]:
        """Each replica tried with its outcome, in order."""
        return [(r, self.outcomes[r.pk]) for r in self.replicas if r.pk in self.outcomes]

    def counts(self) -> Placed:
        """The replicas tried, placed, and left pending so far."""
        counts = Placed(tried=len(self.outcomes))
        for outcome in self.outcomes.values():
            if outcome.plan is not None:
                counts.placed += 1
            elif not outcome.gone:
                counts.pending += 1
        return counts

    def untried(self) -> list[Pending]:
        """The replicas with no outcome, in order: after the stop, past the bound, or left by an error."""
        return [r for r in self.replicas if r.pk not in self.outcomes]


@dataclass
class Placed:
    """What placing a lane did: replicas tried, placed, and left pending (with their reasons)."""

    tried: int = 0
    placed: int = 0
    pending: int = 0


def lane_rest_mark(lane: Lane) -> Placed:
    """The replicas after the lane's stop marked with its reason (they ask the same and get the same
    answer), in a few statements rather than one per replica (thousands); what the lane did, counted."""
    counts = lane.counts()
    if lane.stopped is not None:
        later = lane.untried()
        replicas_pending_mark(later, lane.stopped.reason, lane.stopped.explain)
        counts.pending += len(later)
    return counts
