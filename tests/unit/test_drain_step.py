"""The drain step alone (placement.decisions.drain): no database, no Django. Examples of each rule, then
properties over any model's replicas: the replacement is up first, and no stop takes the model below
min_ready (DESIGN.md invariants 5 and 10)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.decisions.drain import (
    DrainStops,
    Original,
    Replacement,
    drain_starts,
    drain_step,
    drain_stops,
    is_taken_over,
    spans,
)
from tests.examples import examples

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
STATES = ("pending", "placed", "starting", "ready", "stopping", "failed")
FAST = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def up(replica_id: int, replaces: int, *, seconds: float = 60, replaces_state: str = "ready", nodes_ready: bool = True):
    """A replacement ready for `seconds`."""
    return Replacement(replica_id, replaces, replaces_state, "ready", NOW - timedelta(seconds=seconds), nodes_ready)


def stops(replacements, moving, *, ready, min_ready=1, min_ready_seconds=10, surge=1) -> DrainStops:
    return drain_stops(replacements=replacements, moving=set(moving), ready=ready, min_ready=min_ready,
                       min_ready_seconds=min_ready_seconds, surge=surge, now=NOW)


def test_the_decisions_import_no_django():
    code = ("import sys, placement.decisions.drain, placement.decisions.shedding, placement.decisions.capping; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'channels')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nothing_moves_nothing_stops_and_the_surge_is_room():
    assert stops([], [], ready=3) == DrainStops((), 0, frozenset(), 1)


def test_a_replica_that_moves_gets_a_replacement_in_ordinal_order_up_to_the_surge():
    step, starts = drain_step(
        replacements=[], originals=[Original(1, "ready"), Original(2, "ready"), Original(3, "ready")],
        moving={3, 2}, ready=3, min_ready=1, min_ready_seconds=10, surge=1, now=NOW,
    )
    assert (step.waiting, step.room, starts) == (frozenset({2, 3}), 1, [2])
    assert drain_starts(originals=[Original(1, "ready"), Original(2, "ready"), Original(3, "ready")],
                        waiting={2, 3}, room=5) == [2, 3]


def test_pending_and_stopping_replicas_get_no_replacement():
    originals = [Original(1, "pending"), Original(2, "stopping"), Original(3, "failed")]
    assert drain_starts(originals=originals, waiting={1, 2, 3}, room=3) == [3]


def test_the_old_replica_stops_once_its_replacement_has_been_ready_for_min_ready_seconds():
    assert stops([up(9, 1, seconds=10)], [1], ready=2).stop == (1,)
    waiting = stops([up(9, 1, seconds=9)], [1], ready=2)
    assert (waiting.stop, waiting.in_flight, waiting.room, waiting.waiting) == ((), 1, 0, frozenset())


def test_a_replacement_on_a_quiet_node_or_not_ready_has_not_taken_over():
    assert not is_taken_over(up(9, 1, nodes_ready=False), min_ready_seconds=0, now=NOW)
    assert not is_taken_over(Replacement(9, 1, "ready", "starting", None), min_ready_seconds=0, now=NOW)
    assert not is_taken_over(Replacement(9, 1, "ready", "ready", None), min_ready_seconds=0, now=NOW)
    assert is_taken_over(up(9, 1, seconds=0), min_ready_seconds=0, now=NOW)


def test_the_old_replica_serves_on_while_the_model_would_drop_below_min_ready():
    # Replacement up, but another replica failed: 2 ready (the old one and its replacement), min_ready 2.
    held = stops([up(9, 1)], [1], ready=2, min_ready=2)
    assert (held.stop, held.in_flight, held.room) == ((), 1, 0)  # counted in flight: no next replacement
    assert stops([up(9, 1)], [1], ready=3, min_ready=2).stop == (1,)


def test_a_replacement_whose_original_no_longer_moves_is_stopped():
    # The hold was released: the replacement goes, the original stays; replicas already moved stay.
    step = stops([up(9, 1), Replacement(8, 2, "ready", "placed")], [2], ready=3)
    assert (step.stop, step.in_flight, step.room) == ((9,), 1, 0)


@st.composite
def models(draw):
    """A model's replicas mid-drain: originals (some moving), replacements for some, consistent ready count."""
    count = draw(st.integers(0, 7))
    originals = [Original(i, draw(st.sampled_from(STATES))) for i in range(1, count + 1)]
    moving = {o.id for o in originals if draw(st.booleans())}
    replaced = [o.id for o in originals if draw(st.integers(0, 2))]  # most have a replacement
    state_of = {o.id: o.state for o in originals}
    replacements = []
    for n, original in enumerate(replaced):
        state = draw(st.one_of(st.just("ready"), st.sampled_from(STATES)))  # mostly up: stops to judge
        ready_since = None
        if state == "ready" and draw(st.integers(0, 3)):
            ready_since = NOW - timedelta(seconds=draw(st.integers(0, 60)))
        replacements.append(Replacement(100 + n, original, state_of[original], state, ready_since,
                                        draw(st.integers(0, 3)) > 0))
    ready = sum(o.state == "ready" for o in originals) + sum(r.state == "ready" for r in replacements)
    return dict(
        replacements=replacements, originals=originals, moving=moving, ready=ready,
        # Near the ready count, where a stop too many shows.
        min_ready=draw(st.integers(max(0, ready - 2), ready + 1)), min_ready_seconds=draw(st.sampled_from([0, 10, 90])),
        surge=draw(st.integers(1, 3)), now=NOW,
    )


def _ready_stopped(model, stopped_ids) -> int:
    states = {o.id: o.state for o in model["originals"]} | {r.id: r.state for r in model["replacements"]}
    return sum(states[i] == "ready" for i in stopped_ids)


@FAST
@given(models())
def test_an_original_stops_only_once_its_replacement_has_taken_over(model):
    step, _ = drain_step(**model)
    originals = {o.id for o in model["originals"]}
    by_original = {r.replaces: r for r in model["replacements"]}
    for replica_id in step.stop:
        if replica_id in originals:
            assert replica_id in model["moving"]
            replacement = by_original[replica_id]
            # Up, for min_ready_seconds, on nodes that still heartbeat (said here again, not asked of the code).
            assert replacement.state == "ready" and replacement.nodes_ready
            assert NOW - replacement.ready_since >= timedelta(seconds=model["min_ready_seconds"])


def test_an_original_is_judged_without_the_replacements_that_go_in_the_same_step():
    # Replica 2's hold was released while 1's replacement took over: 4 ready, min_ready 3. Replacement 8
    # goes (no longer needed); stopping 1 as well would leave 2 ready.
    step = stops([up(9, 1), up(8, 2)], [1], ready=4, min_ready=3)
    assert (step.stop, step.in_flight) == ((8,), 1)
    assert stops([up(9, 1), up(8, 2)], [1], ready=5, min_ready=3).stop == (8, 1)


@FAST
@given(models())
def test_the_originals_a_drain_stops_never_take_the_model_below_min_ready(model):
    step, _ = drain_step(**model)
    originals = {o.id for o in model["originals"]}
    if any(i in originals for i in step.stop):
        # Counting everything the step stops: the replacements no longer needed go at the same time.
        assert model["ready"] - _ready_stopped(model, step.stop) >= model["min_ready"]


@FAST
@given(models())
def test_a_replica_gets_one_replacement_at_a_time_within_the_surge(model):
    step, starts = drain_step(**model)
    replaced = {r.replaces for r in model["replacements"]}
    state_of = {o.id: o.state for o in model["originals"]}
    assert set(starts) <= set(model["moving"]) - replaced
    assert len(starts) == len(set(starts)) <= max(0, model["surge"] - step.in_flight)
    assert all(state_of[i] not in ("pending", "stopping") for i in starts)
    # A replacement goes unless its original still moves (then it stays until it takes over).
    obsolete = {r.id for r in model["replacements"] if r.replaces not in model["moving"]}
    assert obsolete <= set(step.stop)


@pytest.mark.parametrize(
    ("nodes", "keep_within", "words"),
    [
        ([("ib-a", {"llmgw.io/rack": "r1"}), ("ib-a", {"llmgw.io/rack": "r1"})], "rack", None),
        ([("ib-a", {"llmgw.io/rack": "r2"}), ("ib-a", {"llmgw.io/rack": "r1"})], "rack", "rack r1, r2 (keep_within rack)"),
        ([("ib-a", {}), ("ib-b", {})], "", "fabric ib-a, ib-b"),
        ([("ib-a", {"llmgw.io/rack": "r2"}), ("ib-b", {"llmgw.io/rack": "r1"})], "rack", "rack r1, r2 (keep_within rack)"),
        # A node without the fabric or the label is left out (the label may be on no node at all).
        ([("ib-a", {"llmgw.io/rack": "r1"}), ("", {})], "rack", None),
        ([("ib-a", {"llmgw.io/rack": "r1"}), ("ib-a", {"llmgw.io/row": "2"})], "row", None),
        ([("ib-a", {"llmgw.io/rack": "r1"}), ("ib-a", {"llmgw.io/rack": "r2"})], "", None),
    ],
)
def test_what_a_multi_node_replica_spans(nodes, keep_within, words):
    assert spans(nodes, keep_within=keep_within) == words
