"""Feeds: capacity as NetBox computes it, caps derived for PDUs and dual-fed racks, and N−1."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from facility.domains import Domain
from facility.feeds import Feed, NodeLoad, derived_caps, feed_loss


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
    nodes = [NodeLoad("n1", "r1", ("r1-a", "r1-b"), 1000, 19000)]
    (pdu, *_rest) = [v for v in feed_loss(a, [a, b], nodes) if v.domain == Domain("pdu", "r1-b")]
    assert pdu.measured_watts == 19000 and pdu.load_watts == 19000


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
