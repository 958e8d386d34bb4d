"""Shedding's decisions alone (placement.decisions.shedding): no database, no Django. Which domains are in
trouble and when each may act, then which replica moves, is dropped or stays, with the words people read;
properties: a critical model is never shed and no drop takes a model below its min_ready (invariant 10)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from facility.response import SheddingConfig, ShedRule
from placement.decisions.domain_state import DomainState
from placement.decisions.shedding import (
    Fits,
    NoRoom,
    ShedCandidate,
    ShedRecord,
    Trouble,
    domain_troubles,
    shed_due,
    shed_moves,
    shed_order,
    shed_steps,
)
from tests.examples import examples

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ON = SheddingConfig(ShedRule(enabled=True, shed_after=600, interval=300))
DROP = SheddingConfig(ShedRule(enabled=True, shed_after=600, interval=300, drop_batch=True))
FAST = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOT = Trouble("rack:r1", "rack r1 is hot (set by hand: CRAC down)", NOW, None)


def replica(model: str, ordinal: int, service_class: str, *, ready: int = 1, min_ready: int = 1,
            state: str = "ready") -> ShedCandidate:
    model_id = sum(map(ord, model))
    return ShedCandidate(model_id * 100 + ordinal, ordinal, state, model_id, model, service_class, min_ready, ready)


def fits_nowhere(_: ShedCandidate) -> NoRoom:
    return NoRoom("no node fits (1 node): 1 × gpu: 2 requested, 0 free")


def test_a_domain_hot_under_enforce_or_past_its_limit_is_in_trouble_the_widest_level_first():
    since = NOW - timedelta(minutes=3)
    domains = [
        DomainState("pdu:p1", use_watts=9000, limit_watts=8000, over_limit=True),
        DomainState("rack:r1", condition="hot", enforce=True, detail="inlet 33.0 °C for 6 min", condition_since=since),
        DomainState("rack:r2", condition="hot", enforce=False),  # observe mode: only shown
        DomainState("rack:r3", condition="warm", enforce=True),
        DomainState("row:a", condition="hot", enforce=True),
    ]
    found = domain_troubles(domains=domains, records={"row:a": ShedRecord(NOW - timedelta(hours=1), NOW)}, now=NOW)
    assert found == [
        Trouble("row:a", "row a is hot (set by hand)", NOW - timedelta(hours=1), NOW),
        Trouble("rack:r1", "rack r1 is hot (inlet 33.0 °C for 6 min)", since, None),
        Trouble("pdu:p1", "pdu p1 is past its power limit (use 9.0 kW, limit 8.0 kW)", NOW, None),
    ]


def test_a_kept_start_of_trouble_gives_way_to_an_earlier_condition_start():
    earlier = NOW - timedelta(hours=2)
    [trouble] = domain_troubles(
        domains=[DomainState("rack:r1", condition="hot", enforce=True, condition_since=earlier)],
        records={"rack:r1": ShedRecord(NOW - timedelta(hours=1))}, now=NOW,
    )
    assert trouble.since == earlier


def test_shedding_acts_shed_after_into_the_trouble_then_once_per_interval():
    rule = ON.rule("rack:r1")
    assert shed_due(HOT, rule, NOW) == NOW + timedelta(minutes=10)
    assert shed_due(Trouble("rack:r1", "", NOW - timedelta(hours=1), NOW - timedelta(minutes=1)), rule, NOW) == (
        NOW + timedelta(minutes=4)
    )
    assert shed_due(Trouble("rack:r1", "", NOW - timedelta(hours=1), None), rule, NOW) == NOW
    steps = shed_steps(troubles=[HOT], config=ON, now=NOW, intervals=3)
    assert [at - NOW for at, _ in steps] == [timedelta(minutes=m) for m in (10, 15, 20)]
    assert shed_steps(troubles=[HOT], config=ON, now=NOW, intervals=3, until=NOW) == []
    assert shed_steps(troubles=[HOT], config=SheddingConfig(), now=NOW, intervals=3) == []


def test_lowest_class_first_above_its_minimum_first_never_critical():
    ordered = shed_order([
        replica("crit", 1, "critical"),
        replica("std", 1, "standard"),
        replica("bat", 1, "batch"),
        replica("big", 1, "batch", ready=3),
        replica("big", 2, "batch", ready=3),
        replica("gone", 1, "batch", state="stopping"),
    ])
    assert [c.name for c in ordered] == ["big#2", "big#1", "bat#1", "std#1"]


def test_the_first_replica_that_fits_moves_with_its_reason():
    moved = []

    def place(candidate):
        moved.append(candidate.name)
        return Fits(("n-r2-1",)) if candidate.model == "std" else fits_nowhere(candidate)

    [move] = shed_moves(steps=[(NOW, HOT)], candidates={"rack:r1": [replica("std", 1, "standard"),
                                                                     replica("bat", 1, "batch")]},
                        config=ON, place=place)
    assert moved == ["bat#1", "std#1"]
    assert (move.action, move.candidate.name, move.to) == ("move", "std#1", ("n-r2-1",))
    assert move.reason == ("move std#1 (standard, at its minimum: 1 ready, min 1) to n-r2-1: "
                           "rack r1 is hot (set by hand: CRAC down)")
    assert move.as_dict() == {
        "at": NOW.isoformat(), "domain": "rack:r1", "replica": "std#1", "replica_id": move.candidate.replica_id,
        "model": "std", "class": "standard", "action": "move", "to": ["n-r2-1"], "reason": move.reason,
    }


def test_with_no_room_a_replica_stays_and_says_why_once_unless_drop_batch_stops_one_above_its_minimum():
    candidates = {"rack:r1": [replica("bat", 1, "batch", ready=2), replica("bat", 2, "batch", ready=2)]}
    steps = shed_steps(troubles=[HOT], config=ON, now=NOW, intervals=3)
    [stays] = shed_moves(steps=steps, candidates=candidates, config=ON, place=fits_nowhere)
    assert (stays.action, stays.candidate.name) == ("stays", "bat#2")
    assert stays.reason == ("bat#2 stays (batch, above its minimum: 2 ready, min 1): no replacement fits: "
                            "no node fits (1 node): 1 × gpu: 2 requested, 0 free")
    drop, *_ = shed_moves(steps=steps, candidates=candidates, config=DROP, place=fits_nowhere)
    assert (drop.action, drop.candidate.name, drop.to) == ("drop", "bat#2", ())
    assert drop.reason == (
        "stop bat#2 without a replacement (batch, above its minimum: 2 ready, min 1; drop_batch; no replacement "
        "fits: no node fits (1 node): 1 × gpu: 2 requested, 0 free): rack r1 is hot (set by hand: CRAC down)"
    )


def test_drops_in_later_intervals_count_the_ones_before():
    """The dry run's next intervals say what the real runs will: three ready, min_ready 1, no room — two go."""
    candidates = {"rack:r1": [replica("bat", i, "batch", ready=3) for i in (1, 2, 3)]}
    steps = shed_steps(troubles=[HOT], config=DROP, now=NOW, intervals=4)
    moves = shed_moves(steps=steps, candidates=candidates, config=DROP, place=fits_nowhere)
    assert [(m.action, m.candidate.name) for m in moves] == [("drop", "bat#3"), ("drop", "bat#2"), ("stays", "bat#1")]
    assert moves[1].reason.startswith("stop bat#2 without a replacement (batch, above its minimum: 2 ready, min 1;")
    assert moves[2].reason == ("bat#1 stays (batch, at its minimum: 1 ready, min 1): no replacement fits: "
                               "no node fits (1 node): 1 × gpu: 2 requested, 0 free")


def test_a_domain_with_nothing_shedding_may_move_says_so():
    [stays] = shed_moves(steps=[(NOW, HOT)], candidates={"rack:r1": [replica("crit", 1, "critical")]},
                         config=ON, place=fits_nowhere)
    assert stays.as_dict() == {
        "at": NOW.isoformat(), "domain": "rack:r1", "action": "stays", "replica": None, "replica_id": None,
        "model": None, "class": None, "to": [],
        "reason": "nothing to move: no replica there that shedding may move (rack r1 is hot (set by hand: CRAC down))",
    }


CLASSES = ("batch", "standard", "critical")
STATES = ("placed", "starting", "ready", "stopping", "failed")


@st.composite
def troubled(draw):
    """Models with replicas on one to three troubled domains, steps over a few intervals, and which replicas
    a replacement fits for."""
    domains = [f"rack:r{d}" for d in range(draw(st.integers(1, 2)))]
    candidates: dict[str, list[ShedCandidate]] = {d: [] for d in domains}
    ready_of: dict[int, int] = {}
    for model_id in range(draw(st.integers(1, 3))):
        service_class = draw(st.sampled_from(("batch", *CLASSES)))  # batch most: drops to judge
        placed = [(draw(st.sampled_from(domains)), ordinal, draw(st.sampled_from(("ready", "ready", *STATES))))
                  for ordinal in range(1, draw(st.integers(1, 6)) + 1)]
        # Ready now: those of its replicas here that are, and maybe some elsewhere; the minimum near it.
        ready = sum(state == "ready" for *_, state in placed) + draw(st.integers(0, 2))
        min_ready = draw(st.integers(max(0, ready - 2), ready))
        ready_of[model_id] = ready
        for domain, ordinal, state in placed:
            candidates[domain].append(ShedCandidate(model_id * 100 + ordinal, ordinal, state, model_id, f"m{model_id}",
                                                    service_class, min_ready, ready))
    troubles = [Trouble(d, f"{d} is hot", NOW - timedelta(minutes=draw(st.integers(0, 30))), None) for d in domains]
    drop_batch = draw(st.integers(0, 3)) > 0  # mostly on: drops to judge
    config = SheddingConfig(ShedRule(enabled=True, shed_after=600, interval=300, drop_batch=drop_batch))
    steps = shed_steps(troubles=troubles, config=config, now=NOW, intervals=draw(st.integers(1, 6)))
    # A replacement fits for some (a quarter): most find no room, where drops and stays are decided.
    fits = {c.replica_id for cs in candidates.values() for c in cs if draw(st.integers(0, 3)) == 0}
    return steps, candidates, config, fits, ready_of


def _fits(fits):
    return lambda c: Fits(("n-elsewhere",)) if c.replica_id in fits else NoRoom("no node fits")


@FAST
@given(troubled())
def test_a_critical_model_is_never_shed_and_only_a_batch_replica_above_its_minimum_is_dropped(scenario):
    steps, candidates, config, fits, _ = scenario
    for move in shed_moves(steps=steps, candidates=candidates, config=config, place=_fits(fits)):
        if move.action == "stays":
            continue
        assert move.candidate.service_class != "critical"
        assert move.candidate.state in ("placed", "starting", "ready")
        if move.action == "drop":
            assert config.default.drop_batch and move.candidate.service_class == "batch"
            assert move.candidate.ready > move.candidate.min_ready
            assert move.candidate.replica_id not in fits
        else:
            assert move.candidate.replica_id in fits


@FAST
@given(troubled())
def test_the_drops_of_every_interval_together_leave_each_model_its_min_ready(scenario):
    steps, candidates, config, fits, ready_of = scenario
    moves = shed_moves(steps=steps, candidates=candidates, config=config, place=_fits(fits))
    dropped = Counter(m.candidate.model_id for m in moves if m.action == "drop" and m.candidate.state == "ready")
    min_ready = {c.model_id: c.min_ready for found in candidates.values() for c in found}
    for model_id, count in dropped.items():
        assert ready_of[model_id] - count >= min_ready[model_id]


@FAST
@given(troubled())
def test_each_replica_is_acted_on_once_and_each_domain_once_per_interval(scenario):
    steps, candidates, config, fits, _ = scenario
    moves = shed_moves(steps=steps, candidates=candidates, config=config, place=_fits(fits))
    acted = [m.candidate.replica_id for m in moves if m.action != "stays"]
    assert len(acted) == len(set(acted))
    assert len({(m.at, m.domain) for m in moves}) == len(moves)
    stays = Counter(m.domain for m in moves if m.action == "stays")
    assert all(count == 1 for count in stays.values())  # a domain that cannot act is listed once
