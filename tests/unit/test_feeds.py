"""Feeds: capacity as NetBox computes it, caps derived for PDUs and dual-fed racks, and N−1."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from facility.domains import Domain
from facility.feeds import Feed, NodeLoad, derived_caps, feed_loss, leg_imbalance, leg_pdu


def test_three_phase_415v_32a_at_80_percent_is_18_4_kw():
    feed = Feed("A1", 415, 32, "three", 0.8, ("r1-a",))
    assert round(feed.capacity_watts) == 18401
    assert feed.text == "feed A1 415 V 32 A 3φ 80 %"


def test_single_phase_is_volts_times_amps_times_utilization():
    assert Feed("B", 230, 16, "single", 0.8).capacity_watts == 230 * 16 * 0.8


def test_dual_fed_rack_takes_the_smaller_feed_never_the_sum():
    a = Feed("A1", 415, 32, "three", 0.8, ("r1-a",))
    b = Feed("B1", 415, 60, "three", 0.8, ("r1-b",))
    caps = derived_caps([a, b], {"r1": ["r1-a", "r1-b"]})
    rack = caps[Domain("rack", "r1")]
    assert rack.cap_watts == a.capacity_watts
    assert rack.source.startswith("feed A1 415 V 32 A 3φ 80 %")
    assert "each carries the rack alone" in rack.source
    assert caps[Domain("pdu", "r1-a")].cap_watts == a.capacity_watts
    assert caps[Domain("pdu", "r1-b")].cap_watts == b.capacity_watts


def test_rack_with_no_fed_pdu_gets_no_derived_cap():
    caps = derived_caps([Feed("A1", 230, 32, pdus=("x",))], {"r9": ["r9-a"]})
    assert Domain("rack", "r9") not in caps


def _pair(amps=32):
    return Feed("A", 415, amps, "three", 0.8, ("r1-a",)), Feed("B", 415, amps, "three", 0.8, ("r1-b",))


def test_feed_loss_moves_the_whole_rack_onto_the_survivor():
    a, b = _pair()
    nodes = [NodeLoad(f"n{i}", "r1", ("r1-a", "r1-b"), 5000, 3000) for i in range(4)]  # 20 kW reserved
    found = feed_loss(a, [a, b], nodes)
    texts = [v.text for v in found]
    assert any(v.domain == Domain("pdu", "r1-b") for v in found)
    assert any(v.domain == Domain("rack", "r1") and v.carrier == "B" for v in found)
    assert any(v.domain is None and v.carrier == "B" for v in found)
    assert all("without feed A" in t for t in texts)
    assert found[0].over_watts == 20000 - b.capacity_watts


def test_feed_loss_within_capacity_is_zero_violations():
    a, b = _pair()
    nodes = [NodeLoad(f"n{i}", "r1", ("r1-a", "r1-b"), 4000, 2000) for i in range(4)]  # 16 kW
    assert feed_loss(a, [a, b], nodes) == []


def test_single_fed_nodes_go_dark_and_are_named():
    a, b = _pair()
    nodes = [NodeLoad("n1", "r1", ("r1-a",), 1000, 0), NodeLoad("n2", "r1", ("r1-a", "r1-b"), 1000, 0)]
    found = feed_loss(a, [a, b], nodes)
    assert found[0].dark_nodes == ("n1",)
    assert found[0].text == "rack r1: 1 node(s) lose power with feed A (n1)"


def test_a_pdu_over_before_the_loss_is_not_this_reports_business():
    a, b = _pair()
    c = Feed("C", 230, 10, "single", 0.8, ("r2-a",))
    nodes = [
        NodeLoad("n1", "r1", ("r1-a", "r1-b"), 1000, 0),
        NodeLoad("m1", "r2", ("r2-a",), 9000, 0),  # over C's 1.8 kW whatever happens to A
    ]
    assert feed_loss(a, [a, b, c], nodes) == []


def test_measured_peak_above_reserved_counts():
    a, b = _pair()
    nodes = [NodeLoad("n1", "r1", ("r1-a", "r1-b"), 19000, 1000, 19000)]
    (pdu, *_rest) = [v for v in feed_loss(a, [a, b], nodes) if v.domain == Domain("pdu", "r1-b")]
    assert pdu.measured_watts == 19000 and pdu.load_watts == 19000


def test_load_is_the_sum_of_each_nodes_use_not_the_larger_of_two_sums():
    # One node mostly placed, one mostly measured: the rack's load is 3.0 + 3.0 kW, as `ctl facility`
    # adds it node by node, not max(Σ reserved, Σ measured) = 3.5 kW.
    a = Feed("A", 230, 16, "single", 0.8, ("r1-a",))
    b = Feed("B", 230, 16, "single", 0.8, ("r1-b",))  # 2.9 kW
    nodes = [
        NodeLoad("n1", "r1", ("r1-a", "r1-b"), use_watts=3000, reserved_watts=3000, measured_watts=500),
        NodeLoad("n2", "r1", ("r1-a", "r1-b"), use_watts=3000, reserved_watts=500, measured_watts=3000),
    ]
    (rack,) = [v for v in feed_loss(a, [a, b], nodes) if v.domain == Domain("rack", "r1")]
    assert rack.load_watts == 6000
    assert rack.text == (
        "rack r1 on feed B: 6.0 kW of 2.9 kW without feed A (3.1 kW over; reserved 3.5 kW, measured peak 3.5 kW)"
    )


def test_only_active_feeds_give_capacity():
    a = Feed("A", 415, 32, "three", 0.8, racks=("r1",))
    b = Feed("B", 415, 32, "three", 0.8, racks=("r1",))
    planned = Feed("P", 230, 16, "single", 0.8, racks=("r1",), status="planned")
    rack = derived_caps([a, b, planned], {})[Domain("rack", "r1")]
    assert round(rack.cap_watts) == 18401  # not the planned feed's 2.9 kW
    failed = Feed("B", 415, 16, "three", 0.8, racks=("r1",), status="failed")
    rack = derived_caps([a, failed], {})[Domain("rack", "r1")]
    assert round(rack.cap_watts) == 18401 and "B failed: not counted" in rack.source
    dark = derived_caps([dataclasses.replace(a, status="offline")], {})[Domain("rack", "r1")]
    assert dark.cap_watts == 0 and dark.source == "no live feed (A offline)"


def test_a_failed_feed_is_lost_now_and_its_loss_is_the_present():
    a, b = _pair(16)  # 9.2 kW each
    failed = dataclasses.replace(b, status="failed")
    nodes = [NodeLoad(f"n{i}", "r1", ("r1-a", "r1-b"), 4000) for i in range(3)]  # 12 kW
    now = feed_loss(failed, [a, failed], nodes)
    assert {(str(v.domain), v.carrier) for v in now} >= {("pdu:r1-a", "A"), ("rack:r1", "A")}
    # Losing A too leaves nothing: every node goes dark.
    assert {n for v in feed_loss(a, [a, failed], nodes) for n in v.dark_nodes} == {"n0", "n1", "n2"}


def test_a_dc_feed_counts_the_magnitude_of_its_voltage():
    dc = Feed("DC1", -48, 100, "single", 0.8, racks=("c1",), supply="dc")
    assert dc.capacity_watts == 48 * 100 * 0.8
    assert dc.text == "feed DC1 -48 V 100 A DC 80 %"


def test_a_three_phase_leg_carries_a_third():
    a = Feed("A1", 415, 32, "three", 0.8, ("p1",))
    caps = derived_caps([a], {"r1": ["p1"]}, legs=["p1.A", "p1.B", "nope"])
    assert caps[Domain("leg", "p1.A")].cap_watts == pytest.approx(a.capacity_watts / 3)
    assert caps[Domain("leg", "p1.A")].source == "feed A1 415 V 32 A 3φ 80 %, leg A (a third)"
    assert Domain("leg", "nope") not in caps
    assert leg_pdu("p1.x.B") == ("p1.x", "B") and leg_pdu("p1") is None


def test_leg_loss_is_judged_on_the_surviving_leg():
    a, b = _pair(32)  # legs of 6.1 kW
    nodes = [NodeLoad(f"n{i}", "r1", ("r1-a", "r1-b"), 2500, legs=("r1-a.A", "r1-b.B")) for i in range(3)]
    found = feed_loss(a, [a, b], nodes)  # 7.5 kW on r1-b's leg B
    (leg,) = [v for v in found if v.domain == Domain("leg", "r1-b.B")]
    assert leg.load_watts == 7500 and leg.capacity_watts == pytest.approx(b.leg_capacity_watts)
    assert leg.text.startswith("leg r1-b.B: 7.5 kW of 6.1 kW without feed A")


def test_imbalance_is_the_largest_distance_from_the_mean():
    assert leg_imbalance([3000, 3000, 3000]) == 0
    assert leg_imbalance([6000, 3000, 0]) == 1.0
    assert leg_imbalance([0, 0, 0]) is None and leg_imbalance([5]) is None
    # Two idle nodes on one leg of an 18.4 kW PDU: nothing near a breaker, so no imbalance is reported.
    assert leg_imbalance([700, 0, 0], 18401) is None
    assert leg_imbalance([6000, 3000, 0], 18401) == 1.0


feed_specs = st.tuples(
    st.sampled_from([(230, "single"), (415, "three"), (-48, "single")]),
    st.sampled_from([10, 16, 32, 63]),
    st.sampled_from(["active", "active", "active", "planned", "failed"]),
)


@settings(max_examples=200, deadline=None)
@given(
    racks=st.lists(st.tuples(feed_specs, feed_specs), min_size=1, max_size=4),
    loads=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 15_000)), max_size=12),
)
def test_any_feed_graph_caps_within_each_live_feed_and_n_minus_1_finds_every_rack(racks, loads):
    # Rack i is dual-fed: PDU ri-a on feed Ai, ri-b on feed Bi. Its cap is at most each live feed's
    # capacity; losing a feed reports every rack whose load passes its surviving feed (or goes dark).
    feeds = []
    for i, specs in enumerate(racks):
        for side, ((volts, phase), amps, status) in zip("AB", specs, strict=True):
            supply = "dc" if volts < 0 else "ac"
            feeds.append(Feed(f"{side}{i}", volts, amps, phase, 0.8, (f"r{i}-{side.lower()}",), status=status,
                              supply=supply))
    by_name = {f.name: f for f in feeds}
    caps = derived_caps(feeds, {f"r{i}": [f"r{i}-a", f"r{i}-b"] for i in range(len(racks))})
    for i in range(len(racks)):
        cap = caps[Domain("rack", f"r{i}")].cap_watts
        for side in "AB":
            feed = by_name[f"{side}{i}"]
            if feed.is_live:
                assert cap <= feed.capacity_watts + 1e-9
        if not (by_name[f"A{i}"].is_live or by_name[f"B{i}"].is_live):
            assert cap == 0
    nodes = [NodeLoad(f"n{k}", f"r{r}", (f"r{r}-a", f"r{r}-b"), w) for k, (r, w) in enumerate(loads) if r < len(racks)]
    for lost in feeds:
        found = feed_loss(lost, feeds, nodes)
        reported = {v.domain.name for v in found if v.domain and v.domain.level == "rack"}
        i = int(lost.name[1:])
        rack_load = sum(n.use_watts for n in nodes if n.rack == f"r{i}")
        survivor = by_name[("B" if lost.name[0] == "A" else "A") + str(i)]
        if any(n.rack == f"r{i}" for n in nodes) and (
            not survivor.is_live or rack_load > survivor.capacity_watts + 1e-6
        ):
            assert f"r{i}" in reported


@settings(max_examples=150, deadline=None)
@given(
    loads=st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.integers(0, 12_000)), min_size=1, max_size=20
    ),
    amps=st.sampled_from([16, 32, 60]),
)
def test_feed_loss_lists_exactly_the_racks_an_independent_sum_finds(loads, amps):
    # Four racks, each on pdus rN-a (feed A) and, when dual-fed, rN-b (feed B). Independently: with A
    # lost, a rack's load on B is the sum of its dual-fed nodes' whole loads.
    a = Feed("A", 415, amps, "three", 0.8, tuple(f"r{i}-a" for i in range(4)))
    b = Feed("B", 415, amps, "three", 0.8, tuple(f"r{i}-b" for i in range(4)))
    nodes = [
        NodeLoad(f"n{k}", f"r{rack}", (f"r{rack}-a", f"r{rack}-b") if dual else (f"r{rack}-a",), w, 0)
        for k, (rack, dual, w) in enumerate(loads)
    ]
    expected = set()
    for rack in range(4):
        on_b = sum(w for (r, dual, w) in loads if r == rack and dual)
        if on_b > b.capacity_watts + 1e-6:
            expected.add(f"r{rack}")
    found = {v.domain.name for v in feed_loss(a, [a, b], nodes) if v.domain and v.domain.level == "rack"
             and not v.dark_nodes}
    assert found == expected
    dark = {n for v in feed_loss(a, [a, b], nodes) for n in v.dark_nodes}
    assert dark == {f"n{k}" for k, (_r, dual, _w) in enumerate(loads) if not dual}
    assert math.isfinite(sum(v.over_watts for v in feed_loss(a, [a, b], nodes)))


def test_rack_level_feeds_cap_the_rack_and_carry_its_nodes_when_one_is_lost():
    a = Feed("A", 230, 32, "single", 0.8, racks=("r1",))
    b = Feed("B", 230, 16, "single", 0.8, racks=("r1",))
    caps = derived_caps([a, b], {})
    assert caps[Domain("rack", "r1")].cap_watts == b.capacity_watts  # the smaller, not the sum
    nodes = [NodeLoad("n1", "r1", (), 3500, 0), NodeLoad("n2", "r1", (), 3500, 0)]  # 7 kW
    lost_a = feed_loss(a, [a, b], nodes)
    assert [(str(v.domain), v.carrier) for v in lost_a if v.domain] == [("rack:r1", "B")]
    assert lost_a[0].over_watts == 7000 - b.capacity_watts
    assert all(v.domain is None or v.domain.level != "pdu" for v in lost_a)  # no invented PDU named
    lost_b = feed_loss(b, [a, b], nodes)  # A (5.9 kW) cannot carry 7 kW either
    assert [(str(v.domain), v.carrier) for v in lost_b if v.domain] == [("rack:r1", "A")]
    assert feed_loss(b, [a, b], nodes[:1]) == []  # 3.5 kW: either feed carries it


def test_a_feeds_load_counts_its_pdus_other_watts_as_its_loss_does():
    from facility.feeds import feed_loads

    a, b = _pair(amps=20)  # 11.5 kW each
    nodes = [NodeLoad(f"n{i}", "r1", ("r1-a", "r1-b"), 4000, 2000) for i in range(4)]  # 16 kW, 8 on each
    other = {"r1-a": 600.0, "r1-b": 400.0, "elsewhere": 9000.0}
    loads = feed_loads([a, b], nodes, pdu_other_watts=other)
    assert loads["A"] == (8600.0, 4600.0, 600.0) and loads["B"] == (8400.0, 4400.0, 400.0)
    # Lose A: B carries the nodes whole and both its own other watts, as its N-1 figure says.
    [feed_b] = [v for v in feed_loss(a, [a, b], nodes, pdu_other_watts=other) if v.domain is None]
    assert feed_b.load_watts == 16000.0 + 400.0
