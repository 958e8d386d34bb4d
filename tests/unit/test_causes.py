"""Why replicas wait, in a facility team's words: each rejection the planner writes, grouped by its cause,
the facility's first. The rejections come from the planner itself, so a change of its words shows here."""

from __future__ import annotations

from facility.domains import Domain
from facility.power import Budget
from placement.causes import nofit_causes
from placement.planner import DomainCondition, FacilityView, NoFit, plan_replica
from placement.selector import parse_selector
from tests.unit.test_planner import facility, node, request


def rejections(req, nodes, fac, **kwargs) -> dict[str, str]:
    result = plan_replica(req, nodes, fac, **kwargs)
    assert isinstance(result, NoFit), result
    return result.rejections


def test_holds_hot_racks_and_power_limits_come_first_and_name_their_domains():
    nodes = [
        *(node(f"a{i}", rack="r1") for i in range(3)),
        *(node(f"b{i}", rack="r2") for i in range(2)),
        node("c0", rack="r3"),
        node("d0", rack="r4", placed=5000, labels={"gpu.model": "H200"}),
        node("e0", rack="r5", labels={"gpu.model": "H200"}, free=2),
        node("f0", rack="r6", labels={"gpu.model": "H100"}),
    ]
    fac = FacilityView(
        settings=facility().settings,
        budgets={Domain("rack", "r4"): Budget(Domain("rack", "r4"), cap_watts=6000)},
        holds={Domain("rack", "r1"): "PDU swap", Domain("rack", "r2"): ""},
        conditions={Domain("rack", "r3"): DomainCondition("hot", enforce=True, detail="inlet 33 °C")},
    )
    found = rejections(request(gpus=8, selector=parse_selector("gpu.model = H200")), nodes, fac)
    assert nofit_causes(found) == [
        "2 racks held: r1, r2 (5 nodes)",
        "rack r3 hot (1 node)",
        "rack r4 at its power limit (1 node)",
        "1 node lacks gpu.model = H200",
        "1 node with fewer than 8 GPUs free",
    ]


def test_the_nodes_own_reasons_are_counted_the_most_first():
    nodes = [
        node("n1", free=2),
        node("n2", free=0),
        node("n3", ready=False),
        node("n4", cordoned=True),
        node("n5", cores_free=1),
        node("n6", memory_free=10),
    ]
    found = rejections(request(gpus=4, cpu_cores=8, memory_gib=64), nodes, facility())
    assert nofit_causes(found) == [
        "2 nodes with fewer than 4 GPUs free",
        "1 node cordoned",
        "1 node not ready",
        "1 node with fewer than 8 CPU cores free",
        "1 node with less than 64 GiB of memory free",
    ]
    found = rejections(request(gpus=4), [node("x1")], facility(), exclude=frozenset({"x1"}))
    assert nofit_causes(found) == ["1 node lost a race to another placement"]


def test_many_domains_are_counted_and_the_first_named():
    holds = {Domain("rack", f"r{i}"): "" for i in range(5)}
    nodes = [node(f"n{i}", rack=f"r{i}") for i in range(5)]
    found = rejections(request(), nodes, FacilityView(holds=holds))
    assert nofit_causes(found) == ["5 racks held: r0, r1, r2, … (5 nodes)"]


def test_a_multi_node_replica_says_what_its_nodes_lack():
    nodes = [node("m1", fabric="ib0"), node("m2"), node("m3", fabric="ib1")]
    found = rejections(request(gpus=8, nodes=2), nodes, facility())
    assert nofit_causes(found) == ["2 nodes in no fabric with 2 nodes that fit", "1 node on no fabric"]
    nodes = [node("k1", fabric="ib0"), node("k2", fabric="ib0", rack="r1")]
    found = rejections(request(gpus=8, nodes=2, keep_within="rack"), nodes, facility())
    assert nofit_causes(found) == ["1 node in no rack with 2 nodes that fit", "1 node with no rack label"]


def test_a_reason_it_does_not_know_is_kept_as_it_is():
    assert nofit_causes({"n1": "plugin rack-affinity: not in rack r9", "n2": "not ready"}) == [
        "1 node not ready",
        "1 node: plugin rack-affinity: not in rack r9",
    ]
    assert nofit_causes({}) == []


def test_gpus_not_joined_as_the_topology_asks():
    nodes = [
        node("p1", free=(0, 1, 4, 6), machine="pcie-nvlink-pairs"),
        node("p2", free=(0, 2, 4, 6), machine="pcie-nvlink-pairs"),
        node("u1"),
    ]
    found = rejections(request(gpus=4, topology="nvlink-all"), nodes, facility())
    assert nofit_causes(found) == [
        "2 nodes without 4 free GPUs all joined by NVLink",
        "1 node reporting no GPU topology",
    ]
    found = rejections(request(gpus=4, topology="same-numa"), nodes[:1], facility())
    assert nofit_causes(found) == ["1 node without 4 free GPUs on one NUMA node"]
