"""Capping's step alone (placement.decisions.capping): no database, no Django. Which domains press their
nodes, each node's next share of its default limit, what is sent and what only shown; properties over
any run of pressure: never under the floor, back up only after restore_after without pressure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from facility.response import CappingConfig
from placement.decisions.capping import (
    CapChange,
    CapNode,
    NodeCapState,
    Pressure,
    cap_step,
    node_cap_next,
    pressed_domains,
)
from placement.decisions.domain_state import DomainState
from tests.examples import examples

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ON = CappingConfig(enabled=True, floor_fraction=0.7, step_fraction=0.1, restore_after=600)
WARM = {"rack:r1": Pressure("rack r1 warm", True)}
FAST = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_warm_hot_or_nearly_full_domains_press_their_nodes():
    found = pressed_domains([
        DomainState("rack:r1", condition="warm", enforce=True),
        DomainState("rack:r2", condition="hot"),
        DomainState("pdu:p1", use_watts=9500, limit_watts=10000),
        DomainState("pdu:p2", use_watts=9400, limit_watts=10000, condition="ok", enforce=True),
        DomainState("row:a", use_watts=9500, limit_watts=None),
    ])
    assert found == {
        "rack:r1": Pressure("rack r1 warm", True),
        "rack:r2": Pressure("rack r2 hot", False),
        "pdu:p1": Pressure("pdu p1 within 5% of its power limit", False),
    }


def steps(node: CapNode, pressed, minutes, config=ON) -> list[CapChange]:
    """Run the step at each minute, the node's cap carried over; every change."""
    changes = []
    for minute in minutes:
        step = cap_step(nodes=[node], pressed=pressed, config=config, now=NOW + timedelta(minutes=minute))
        node = CapNode(node.node_id, node.name, step.keep.get(node.node_id), node.domains, node.default_watts)
        changes += step.changes
    return changes


def test_a_warm_rack_steps_its_nodes_down_to_the_floor_and_says_so():
    node = CapNode(1, "gpu01", None, ("rack:r1",), 700.0)
    assert [(c.fraction, c.watts, c.sent) for c in steps(node, WARM, range(5))] == [
        (0.9, 630, True), (0.8, 560, True), (0.7, 490, True),
        (0.7, 490, False),  # 1 - 3 × 0.1 is 0.7000000000000001: its last bit, taken to the floor, is a change
    ]
    step = cap_step(nodes=[node], pressed=WARM, config=ON, now=NOW)
    assert step.keep == {1: NodeCapState(0.9, 0.9, "rack r1 warm", None)}
    assert (step.sent, step.shown, step.release) == (True, True, ())
    assert step.changes[0].as_dict() == {"node": "gpu01", "fraction": 0.9, "watts": 630, "reason": "rack r1 warm",
                                         "sent": True}


def test_observe_mode_only_says_what_it_would_cap():
    node = CapNode(1, "gpu03", None, ("rack:r12-07",), 700.0)
    pressed = {"rack:r12-07": Pressure("rack r12-07 warm", False)}
    step = cap_step(nodes=[node], pressed=pressed, config=ON, now=NOW)
    assert step.keep == {1: NodeCapState(1.0, 0.9, "rack r12-07 warm", None)}
    assert (step.sent, step.shown) == (False, True)
    assert step.changes == (CapChange("gpu03", 0.9, 630, "rack r12-07 warm", False),)


def test_the_narrowest_pressed_domain_gives_the_reason_and_the_mode():
    node = CapNode(1, "gpu01", None, ("row:a", "rack:r1", "pdu:p1"), None)
    pressed = {"row:a": Pressure("row a hot", True), "rack:r1": Pressure("rack r1 warm", True),
               "pdu:p1": Pressure("pdu p1 within 5% of its power limit", False)}
    [change] = cap_step(nodes=[node], pressed=pressed, config=ON, now=NOW).changes
    assert change == CapChange("gpu01", 0.9, None, "pdu p1 within 5% of its power limit", False)


def test_a_pressed_leg_is_narrower_than_its_pdu_and_gives_the_reason():
    node = CapNode(1, "gpu01", None, ("rack:r1", "pdu:p1", "leg:p1.A"), None)
    pressed = {"pdu:p1": Pressure("pdu p1 hot", True), "rack:r1": Pressure("rack r1 warm", True),
               "leg:p1.A": Pressure("leg p1.A within 5% of its power limit", False)}
    [change] = cap_step(nodes=[node], pressed=pressed, config=ON, now=NOW).changes
    assert change == CapChange("gpu01", 0.9, None, "leg p1.A within 5% of its power limit", False)


def test_a_capped_node_is_restored_step_by_step_after_restore_after_then_released():
    capped = CapNode(1, "gpu01", NodeCapState(0.7, 0.7, "rack r1 warm", None), (), 700.0)
    changes = steps(capped, {}, [0, 9, 10, 11, 12])
    assert [(c.fraction, c.reason, c.sent) for c in changes] == [
        (0.8, "rack r1 warm", True), (0.9, "rack r1 warm", True), (1.0, "restored", True),
    ]
    first = cap_step(nodes=[capped], pressed={}, config=ON, now=NOW)
    assert first.keep == {1: NodeCapState(0.7, 0.7, "rack r1 warm", NOW)}  # the ok clock starts
    assert (first.changes, first.sent, first.shown) == ((), False, False)
    done = cap_step(nodes=[CapNode(1, "gpu01", NodeCapState(0.95, 1.0, "x", NOW), (), None)], pressed={},
                    config=ON, now=NOW + timedelta(minutes=10))
    assert (done.keep, done.release, done.sent, done.shown) == ({}, (1,), True, True)


def test_pressure_again_stops_the_ok_clock():
    capped = NodeCapState(0.8, 0.8, "rack r1 warm", NOW - timedelta(minutes=9))
    after = node_cap_next(capped, WARM["rack:r1"], ON, NOW)
    assert (after.fraction, after.would_fraction) == (pytest.approx(0.7), pytest.approx(0.7))
    assert (after.reason, after.ok_since) == ("rack r1 warm", None)


def test_nodes_are_stepped_by_name_and_a_node_without_a_cap_at_its_defaults_is_not_listed():
    nodes = [CapNode(2, "gpu02", None, ("rack:r1",)), CapNode(1, "gpu01", None, ("rack:r1",)), CapNode(3, "gpu03", None)]
    step = cap_step(nodes=nodes, pressed=WARM, config=ON, now=NOW)
    assert [c.node for c in step.changes] == ["gpu01", "gpu02"]
    assert list(step.keep) == [1, 2] and step.release == ()
    at_floor = cap_step(nodes=nodes, pressed=WARM, config=CappingConfig(enabled=True, floor_fraction=1.0), now=NOW)
    assert (at_floor.keep, at_floor.changes, at_floor.sent, at_floor.shown) == ({}, (), False, False)


def test_a_new_reason_alone_is_shown_not_sent():
    at_floor = CapNode(1, "gpu01", NodeCapState(0.7, 0.7, "rack r1 warm", None), ("rack:r1",))
    step = cap_step(nodes=[at_floor], pressed={"rack:r1": Pressure("rack r1 hot", True)}, config=ON, now=NOW)
    assert (step.changes, step.sent, step.shown) == ((), False, True)


configs = st.builds(
    CappingConfig, enabled=st.just(True), floor_fraction=st.sampled_from([0.3, 0.5, 0.7, 0.85, 1.0]),
    step_fraction=st.sampled_from([0.01, 0.1, 0.25, 0.5]), restore_after=st.sampled_from([0.0, 60.0, 600.0]),
)
# Each tick: a minute or more later, the node's domain pressed under enforce, only observed, or ok.
ticks = st.lists(st.tuples(st.integers(1, 8), st.sampled_from(["enforce", "observe", None])), min_size=1,
                 max_size=30)


def run(config: CappingConfig, timeline, default=700.0):
    """The node's caps (before, after, now) over the timeline, from its defaults."""
    node = CapNode(1, "gpu01", None, ("rack:r1",), default)
    now, seen = NOW, []
    for minutes, mode in timeline:
        now += timedelta(minutes=minutes)
        pressed = {} if mode is None else {"rack:r1": Pressure("rack r1 warm", mode == "enforce")}
        step = cap_step(nodes=[node], pressed=pressed, config=config, now=now)
        after = step.keep.get(1, NodeCapState())
        seen.append((node.kept or NodeCapState(), after, now, mode, step))
        node = CapNode(1, "gpu01", step.keep.get(1), node.domains, default)
    return seen


@FAST
@given(configs, ticks)
def test_a_cap_never_goes_under_the_floor(config, timeline):
    for _, after, _, _, step in run(config, timeline):
        assert config.floor_fraction - 1e-9 <= after.fraction <= 1.0
        assert config.floor_fraction - 1e-9 <= after.would_fraction <= 1.0
        for change in step.changes:
            if change.watts is not None:
                assert change.watts >= round(700.0 * config.floor_fraction)


@FAST
@given(configs, st.floats(0.3, 1.0), st.floats(0.3, 1.0), st.sampled_from(["enforce", "observe", None]))
def test_a_cap_kept_under_a_floor_raised_since_only_goes_up(config, fraction, would, mode):
    """A floor raised in server.yaml: a cap already under it is pressed up to it, or restored up; never lower."""
    before = NodeCapState(fraction, would, "rack r1 warm", NOW - timedelta(hours=1))
    pressure = None if mode is None else Pressure("rack r1 warm", mode == "enforce")
    after = node_cap_next(before, pressure, config, NOW)
    assert after.fraction >= min(before.fraction, config.floor_fraction) - 1e-9
    assert after.would_fraction >= min(before.would_fraction, config.floor_fraction) - 1e-9
    if pressure is not None:
        assert after.would_fraction >= config.floor_fraction - 1e-9


@FAST
@given(configs, ticks)
def test_a_cap_goes_back_up_only_after_restore_after_without_pressure(config, timeline):
    ok_from = None  # the first tick without pressure since the last with it
    for before, after, now, mode, step in run(config, timeline):
        if mode is not None:
            ok_from = None
            assert after.fraction <= before.fraction
            if mode == "observe":
                assert after.fraction == before.fraction  # observe mode sends nothing
                assert after.would_fraction <= before.would_fraction
            else:
                assert after.would_fraction == after.fraction  # under enforce what would be sent is what is
            continue
        ok_from = ok_from or now
        rose = after.fraction > before.fraction or after.would_fraction > before.would_fraction
        if rose or step.release:
            assert now - ok_from >= timedelta(seconds=config.restore_after)
        if now - ok_from < timedelta(seconds=config.restore_after):
            assert (after.fraction, after.would_fraction) == (before.fraction, before.would_fraction)
