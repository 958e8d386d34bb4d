"""The planner: each filter's exact reason, each ordering rule, multi-node replicas, power, headroom."""

from __future__ import annotations

import dataclasses

import pytest

from facility.domains import Domain, domains_of
from facility.power import Budget, FacilitySettings
from placement.index import Headroom, PlacementIndex, headroom
from placement.planner import (
    FacilityView,
    NodeView,
    NoFit,
    Plan,
    Profile,
    ReplicaRequest,
    ShardPlan,
    apply_shard,
    nofit_summary,
    plan_replica,
)
from placement.selector import parse_selector
from placement.topology import topology_of
from tests.fakes.gpu_machines import reported_topology

RACK = Domain("rack", "r12-07")
NO_FACILITY = FacilityView()


def node(
    name: str,
    *,
    rack: str | None = None,
    pdu: str | None = None,
    row: str | None = None,
    free: int | tuple[int, ...] = 8,
    total: int = 8,
    ready: bool = True,
    cordoned: bool = False,
    labels: dict[str, str] | None = None,
    fabric: str | None = None,
    cores_free: int = 64,
    memory_free: float = 1024,
    limit: float | None = None,
    placed: float = 0.0,
    measured: float | None = None,
    weights: tuple[str, ...] = (),
    replicas: int = 0,
    machine: str | None = None,
) -> NodeView:
    """A node for tests: location from rack/pdu/row, free cards as a count (lowest indices) or indices,
    ``machine``: the GPU topology of a fixture machine (tests.fakes.gpu_machines)."""
    all_labels = dict(labels or {})
    for level, value in (("rack", rack), ("pdu", pdu), ("row", row)):
        if value:
            all_labels[f"llmgw.io/{level}"] = value
    free_gpus = tuple(range(total - free, total)) if isinstance(free, int) else free
    return NodeView(
        name=name,
        ready=ready,
        cordoned=cordoned,
        labels=all_labels,
        domains=domains_of(all_labels),
        fabric=fabric,
        gpus_total=total,
        free_gpus=free_gpus,
        cpu_cores_total=64,
        cpu_cores_free=cores_free,
        memory_gib_total=1024,
        memory_gib_free=memory_free,
        gpu_power_limit_watts=limit,
        placed_watts=placed,
        measured_watts=measured,
        weights=frozenset(weights),
        replicas=replicas,
        gpu_topology=topology_of(reported_topology(machine)) if machine else None,
    )


def request(gpus: int = 8, model: str = "llama-70b", existing=(), **profile) -> ReplicaRequest:
    return ReplicaRequest(
        model=model,
        profile=Profile(gpus=gpus, **profile),
        existing=tuple(frozenset(r) for r in existing),
    )


def facility(budgets=(), holds=None, **settings) -> FacilityView:
    return FacilityView(
        settings=FacilitySettings(**settings),
        budgets={b.domain: b for b in budgets},
        holds=dict(holds or {}),
    )


def plan(req, nodes, fac=NO_FACILITY, **kwargs):
    """Plan with the plain path, and check the index gives the same answer."""
    result = plan_replica(req, nodes, fac, **kwargs)
    assert PlacementIndex(nodes, fac).plan(req, **kwargs) == result
    return result


def chosen(result) -> list[str]:
    assert isinstance(result, Plan), result
    return [shard.node for shard in result.shards]


def reason(req, one: NodeView, fac=NO_FACILITY, **kwargs) -> str:
    result = plan(req, [one], fac, **kwargs)
    assert isinstance(result, NoFit), result
    return result.rejections[one.name]


# --- filters ----------------------------------------------------------------------------------


def test_not_ready():
    assert reason(request(), node("a", ready=False, cordoned=True)) == "not ready"


def test_cordoned():
    assert reason(request(), node("a", cordoned=True)) == "cordoned"


def test_held_names_the_first_held_domain_in_level_order():
    fac = facility(holds={Domain("pdu", "p1"): "breaker", RACK: "PDU swap"})
    assert reason(request(), node("a", rack="r12-07", pdu="p1"), fac) == "rack r12-07 is held: PDU swap"


def test_held_pdu_holds_its_nodes():
    fac = facility(holds={Domain("pdu", "p1"): "breaker test"})
    assert reason(request(), node("a", rack="r1", pdu="p0,p1"), fac) == "pdu p1 is held: breaker test"


def test_excluded_after_a_lost_race():
    assert reason(request(), node("a"), exclude=frozenset({"a"})) == "excluded (lost a race)"


def test_selector():
    req = request(selector=parse_selector("gpu.model in (H100,H200), !spot"))
    assert reason(req, node("a", labels={"gpu.model": "A100"})) == "needs gpu.model in (H100,H200)"
    assert reason(req, node("a", labels={"gpu.model": "H100", "spot": "1"})) == "needs !spot"


def test_gpus():
    assert reason(request(8), node("a", free=3)) == "gpu: 8 requested, 3 free"


def test_cpu():
    assert reason(request(1, cpu_cores=16), node("a", cores_free=8)) == "cpu: 16 requested, 8 free"


def test_memory():
    got = reason(request(1, memory_gib=256), node("a", memory_free=100))
    assert got == "memory: 256 GiB requested, 100 GiB free"
    got = reason(request(1, memory_gib=80.5), node("a", memory_free=40.25))
    assert got == "memory: 80.5 GiB requested, 40.25 GiB free"


def test_filters_are_checked_in_order():
    fac = facility(holds={RACK: "PDU swap"}, budgets=[Budget(RACK, 100)])
    sel = parse_selector("x")
    base = dict(rack="r12-07", free=0, cores_free=0, memory_free=0)
    req = request(8, cpu_cores=16, memory_gib=64, selector=sel)
    ex = frozenset({"a"})
    assert reason(req, node("a", ready=False, cordoned=True, **base), fac, exclude=ex) == "not ready"
    assert reason(req, node("a", cordoned=True, **base), fac, exclude=ex) == "cordoned"
    assert reason(req, node("a", **base), fac, exclude=ex) == "rack r12-07 is held: PDU swap"
    fac = facility(budgets=[Budget(RACK, 100)])
    assert reason(req, node("a", **base), fac, exclude=ex) == "excluded (lost a race)"
    assert reason(req, node("a", **base), fac) == "needs x"
    base["labels"] = {"x": "1"}
    assert reason(req, node("a", **base), fac) == "gpu: 8 requested, 0 free"
    base["free"] = 8
    assert reason(req, node("a", **base), fac) == "cpu: 16 requested, 0 free"
    base["cores_free"] = 16
    assert reason(req, node("a", **base), fac) == "memory: 64 GiB requested, 0 GiB free"
    base["memory_free"] = 64
    assert reason(req, node("a", **base), fac).startswith("rack r12-07: ")


# --- power ------------------------------------------------------------------------------------


def test_power_refusal_names_the_domain_and_figures():
    # 16 kW cap, 10% margin: 14.4 kW limit. Node 350 W + 5.6 kW placed + 8.25 kW elsewhere = 14.2 kW.
    others = node("b", rack="r12-07", free=0, placed=8250 - 350)
    target = node("a", rack="r12-07", free=4, placed=5600)
    fac = facility(budgets=[Budget(RACK, 16000)])
    result = plan(request(4), [target, others], fac)
    assert isinstance(result, NoFit)
    assert result.rejections["a"] == (
        "rack r12-07: 14.2 kW of a 14.4 kW limit (16.0 kW cap less 10%) in use, 17.0 kW with the shard (~2.8 kW)"
    )


def test_power_uses_the_cards_reported_limit_and_other_watts():
    fac = facility(budgets=[Budget(RACK, 4000, other_watts=1000)], margin=0)
    # 1000 other + 350 node + 4 × 500 = 3350: fits; with the 700 W default it would be 4150.
    assert chosen(plan(request(4), [node("a", rack="r12-07", limit=500)], fac)) == ["a"]
    assert isinstance(plan(request(4), [node("a", rack="r12-07")], fac), NoFit)


def test_fresh_measurement_above_placed_counts():
    fac = facility(budgets=[Budget(RACK, 10000)], margin=0)
    # Another node measuring 7000 (nothing placed): 350 + 7000 + 350 = 7.7 kW in use; 2.8 kW more is 10.5.
    busy = node("b", rack="r12-07", free=0, measured=7000)
    result = plan(request(4), [node("a", rack="r12-07"), busy], fac)
    assert result.rejections["a"] == (
        "rack r12-07: 7.7 kW of a 10.0 kW limit (10.0 kW cap less 0%) in use, 10.5 kW with the shard (~2.8 kW)"
    )
    assert chosen(plan(request(4), [node("a", rack="r12-07"), node("b", rack="r12-07", free=0, measured=6500)], fac)) == ["a"]
    # On the node itself the shard's draw is what the measurement already reads, not on top of it:
    # placed 7000 + 2800 against a reading of 8000 takes the term from 8000 to 9800 (10.15 kW).
    assert reason(request(4), node("a", rack="r12-07", placed=7000, measured=8000), fac) == (
        "rack r12-07: 8.3 kW of a 10.0 kW limit (10.0 kW cap less 0%) in use, 10.2 kW with the shard (~2.8 kW)"
    )
    # An idle node reading 7000 takes a 2.8 kW shard: its term stays 7000, nothing counted twice.
    assert chosen(plan(request(4), [node("a", rack="r12-07", measured=7000)], fac)) == ["a"]
    # A measurement below what is placed changes nothing.
    assert chosen(plan(request(4), [node("a", rack="r12-07", placed=6800, measured=100)], fac)) == ["a"]


def test_a_domain_already_over_its_limit_refuses_every_shard():
    fac = facility(budgets=[Budget(RACK, 1000)], gpu_watts=None)
    text = reason(request(1), node("a", rack="r12-07", placed=2000), fac)
    assert text == "rack r12-07: 2.4 kW of a 0.9 kW limit (1.0 kW cap less 10%) in use, already past it"


def test_unknown_draw_never_blocks():
    fac = facility(budgets=[Budget(RACK, 1000)], gpu_watts=None, node_watts=None)
    assert chosen(plan(request(8), [node("a", rack="r12-07")], fac)) == ["a"]


def test_power_checks_every_budgeted_domain_of_the_node():
    pdu = Domain("pdu", "p1")
    fac = facility(budgets=[Budget(RACK, 100000), Budget(pdu, 3000)], margin=0)
    assert reason(request(4), node("a", rack="r12-07", pdu="p1"), fac) == (
        "pdu p1: 0.3 kW of a 3.0 kW limit (3.0 kW cap less 0%) in use, 3.1 kW with the shard (~2.8 kW)"
    )


def test_declared_power_is_the_shards_draw():
    fac = facility(budgets=[Budget(RACK, 4000)], margin=0)
    result = plan(request(8, power_watts=3000), [node("a", rack="r12-07")], fac)
    assert result.shards[0].draw_watts == 3000


# --- ordering ---------------------------------------------------------------------------------


def test_bin_packing_takes_the_node_left_fullest():
    nodes = [node("a", free=8), node("b", free=4), node("c", free=6)]
    result = plan(request(4), nodes)
    assert result.shards == (ShardPlan("b", (4, 5, 6, 7), 0, 0, 2800),)
    assert result.why == "leaves 0 GPUs free"


def test_lowest_free_indices_where_the_node_reports_no_topology():
    result = plan(request(2), [node("a", free=(1, 3, 6, 7))])
    assert result.shards[0].gpu_indices == (1, 3)


def test_a_four_gpu_replica_lands_inside_one_socket_of_the_pcie_server():
    # Eight PCIe cards over two sockets, NVLink-bridged in pairs; 0 and 2 taken: socket 1's four, not the
    # lowest free indices (1, 3, 4, 5: across the sockets).
    result = plan(request(4), [node("a", free=(1, 3, 4, 5, 6, 7), machine="pcie-nvlink-pairs")])
    assert result.shards[0].gpu_indices == (4, 5, 6, 7)
    assert result.why == "leaves 2 GPUs free; GPUs 4-7, one NUMA node"


def test_an_nvlink_pair_before_the_lowest_free_indices():
    result = plan(request(2), [node("a", free=(1, 2, 4, 5), machine="pcie-nvlink-pairs")])
    assert result.shards[0].gpu_indices == (4, 5)
    assert result.why == "leaves 2 GPUs free; GPUs 4,5, NVLink-complete"


def test_nvlink_all_refuses_in_exact_words_when_no_free_set_is_joined_by_nvlink():
    pairs = node("a", free=(0, 1, 4, 6), machine="pcie-nvlink-pairs")
    assert reason(request(4, topology="nvlink-all"), pairs) == (
        "topology: no 4 free GPUs all joined by NVLink (free: 0,1,4,6)"
    )
    assert reason(request(4, topology="same-numa"), pairs) == (
        "topology: no 4 free GPUs on one NUMA node (free: 0,1,4,6)"
    )
    unknown = node("b", free=4)
    assert reason(request(2, topology="nvlink-all"), unknown) == (
        "topology: the node reports no GPU topology (nvlink-all needs it)"
    )


def test_nvlink_all_takes_a_pair_where_one_is_free():
    result = plan(request(2, topology="nvlink-all"), [node("a", free=(0, 2, 4, 5), machine="pcie-nvlink-pairs")])
    assert result.shards[0].gpu_indices == (4, 5)
    assert result.why == "leaves 2 GPUs free; GPUs 4,5, NVLink-complete"


def test_same_numa_takes_one_socket_and_passes_a_node_without_one_over():
    split = node("a", free=(2, 3, 4, 5), machine="pcie-nvlink-pairs")
    whole = node("b", free=(0, 2, 4, 5, 6, 7), machine="pcie-nvlink-pairs")  # a packs fuller: ranked first
    result = plan(request(4, topology="same-numa"), [split, whole])
    assert chosen(result) == ["b"] and result.shards[0].gpu_indices == (4, 5, 6, 7)
    assert result.rejections == {"a": "topology: no 4 free GPUs on one NUMA node (free: 2-5)"}
    assert result.why == "leaves 2 GPUs free; GPUs 4-7, one NUMA node"


def test_any_never_refuses_unknown_links_nor_one_gpu():
    assert chosen(plan(request(4), [node("a", free=(0, 1, 4, 6), machine="pcie-nvlink-pairs")])) == ["a"]
    assert chosen(plan(request(4), [node("b", free=4)])) == ["b"]
    assert chosen(plan(request(1, topology="nvlink-all"), [node("c", free=1)])) == ["c"]


def test_ties_go_to_the_node_name_whatever_the_input_order():
    nodes = [node("c"), node("a"), node("b")]
    assert chosen(plan(request(8), nodes)) == ["a"]
    assert chosen(plan(request(8), list(reversed(nodes)))) == ["a"]


def test_weights_before_bin_packing():
    nodes = [node("a", free=4), node("b", free=8, weights=("llama-70b",))]
    result = plan(request(4), nodes)
    assert chosen(result) == ["b"]
    assert result.why == "holds the weights; leaves 4 GPUs free"


def test_spreading_before_weights_and_bin_packing():
    nodes = [
        node("x1", rack="r1", pdu="p1", free=0),
        node("a", rack="r1", pdu="p1", free=4, weights=("llama-70b",)),
        node("b", rack="r2", pdu="p2", free=8),
    ]
    result = plan(request(4, existing=[{"x1"}]), nodes)
    assert chosen(result) == ["b"]
    assert result.why == "shares no rack or pdu with the model's 1 replica; leaves 4 GPUs free"


def test_fewer_shared_domains_before_more():
    nodes = [
        node("x1", rack="r1", pdu="p1", free=0),
        node("same-rack-and-pdu", rack="r1", pdu="p1", free=4),
        node("same-pdu", rack="r2", pdu="p1", free=8),
    ]
    result = plan(request(4, existing=[{"x1"}]), nodes)
    assert chosen(result) == ["same-pdu"]
    assert result.why == (
        "shares pdu p1 with the model's 1 replica, the fewest of the nodes that fit; leaves 4 GPUs free"
    )


def test_spreading_never_filters():
    nodes = [node("x1", rack="r1", free=4), node("other", rack="r2", free=0)]
    result = plan(request(4, existing=[{"x1"}]), nodes)
    assert chosen(result) == ["x1"]


def test_cpu_profiles_pack_by_fewest_replicas():
    nodes = [node("a", replicas=3), node("b", replicas=1), node("c", replicas=1)]
    result = plan(request(0, cpu_cores=4), nodes)
    assert chosen(result) == ["b"]
    assert result.shards[0].gpu_indices == ()
    assert result.shards[0].draw_watts == 40
    assert result.why == "runs 1 replica already"


def test_plan_keeps_the_rejections_of_nodes_ranked_ahead():
    fac = facility(holds={RACK: "PDU swap"})
    nodes = [
        node("held", rack="r12-07", free=4),
        node("cordoned", free=4, cordoned=True),
        node("full", free=2),
        node("chosen", free=8),
        node("later", free=8, ready=False),
    ]
    result = plan(request(4), nodes, fac)
    assert chosen(result) == ["chosen"]
    assert result.rejections == {"cordoned": "cordoned", "held": "rack r12-07 is held: PDU swap"}
    assert list(result.rejections) == ["cordoned", "held"]


# --- no fit -----------------------------------------------------------------------------------


def test_no_nodes():
    assert plan_replica(request(), [], NO_FACILITY) == NoFit("no nodes", {})


def test_nofit_summary_most_common_first_at_most_five_groups():
    fac = facility(holds={RACK: "PDU swap"})
    nodes = [node(f"full{i:02}", free=0) for i in range(7)]
    nodes += [node(f"held{i}", rack="r12-07") for i in range(3)]
    nodes += [node("down", ready=False), node("cordoned", cordoned=True)]
    result = plan(request(8), nodes, fac)
    assert isinstance(result, NoFit)
    assert result.summary == (
        "no node fits (12 nodes): 7 × gpu: 8 requested, 0 free; 3 × rack r12-07 is held: PDU swap; "
        "1 × cordoned; 1 × not ready"
    )
    assert len(result.rejections) == 12


def test_nofit_summary_keeps_five_groups_and_counts_the_rest():
    rejections = {f"n{i}": f"reason {i}" for i in range(7)}
    assert nofit_summary(rejections) == (
        "no node fits (7 nodes): 1 × reason 0; 1 × reason 1; 1 × reason 2; 1 × reason 3; 1 × reason 4; "
        "2 more nodes for 2 other reasons"
    )
    assert nofit_summary({**rejections, "n7": "reason 9"}).endswith("; 3 more nodes for 3 other reasons")
    assert nofit_summary(dict(list(rejections.items())[:6])).endswith("; 1 more node for 1 other reason")
    assert nofit_summary({"a": "cordoned"}) == "no node fits (1 node): 1 × cordoned"


# --- multi-node -------------------------------------------------------------------------------


def test_multi_node_needs_a_fabric():
    got = reason(request(8, nodes=2), node("a"))
    assert got == "no fabric (a 2-node replica stays inside one)"


def test_keep_within_needs_the_label():
    got = reason(request(8, nodes=2, keep_within="rack"), node("a", fabric="ib1"))
    assert got == "no llmgw.io/rack label (keep_within: rack)"


def test_group_too_small():
    nodes = [node("a", rack="r1", fabric="ib1"), node("b", rack="r2", fabric="ib1")]
    result = plan(request(8, nodes=2, keep_within="rack"), nodes)
    assert isinstance(result, NoFit)
    assert result.summary == "no node fits (2 nodes): 2 × no rack with 2 nodes that fit"
    lone = plan(request(8, nodes=2), [node("a", fabric="ib1"), node("b", fabric="ib2")])
    assert lone.summary == "no node fits (2 nodes): 2 × no fabric with 2 nodes that fit"


def test_multi_node_stays_in_one_fabric_and_keep_within_domain():
    nodes = [
        node("a1", rack="r1", fabric="ib1", free=8),
        node("a2", rack="r2", fabric="ib1", free=8),
        node("b1", rack="r3", fabric="ib2", free=8),
        node("b2", rack="r3", fabric="ib2", free=8),
    ]
    result = plan(request(8, nodes=2, keep_within="rack", power_watts=6000), nodes)
    assert chosen(result) == ["b1", "b2"]
    assert [s.draw_watts for s in result.shards] == [3000, 3000]
    assert result.why == "2 nodes in fabric ib2 and rack r3; b1: leaves 0 GPUs free"
    free = plan(request(8, nodes=2), nodes)
    assert chosen(free) == ["a1", "a2"]


def test_multi_node_takes_the_best_group_by_the_same_ordering():
    nodes = [
        node("a1", fabric="ib1", free=8),
        node("a2", fabric="ib1", free=8),
        node("b1", fabric="ib2", free=4),
        node("b2", fabric="ib2", free=4),
    ]
    assert chosen(plan(request(4, nodes=2), nodes)) == ["b1", "b2"]


def test_multi_node_shards_are_counted_together():
    # Each 2.8 kW shard fits the rack alone (350 × 2 + 2800 = 3.5 kW of 5 kW), both do not.
    fac = facility(budgets=[Budget(RACK, 5000)], margin=0)
    nodes = [node("a", rack="r12-07", fabric="ib1"), node("b", rack="r12-07", fabric="ib1")]
    result = plan(request(4, nodes=2), nodes, fac)
    assert isinstance(result, NoFit)
    assert result.rejections == {
        "a": "no fabric with 2 nodes that fit",
        "b": "rack r12-07: 0.7 kW of a 5.0 kW limit (5.0 kW cap less 0%) in use, "
        "6.3 kW with the replica's shards here (~5.6 kW)",
    }


def test_multi_node_power_goes_to_another_group():
    fac = facility(budgets=[Budget(RACK, 5000)], margin=0)
    nodes = [
        node("a", rack="r12-07", fabric="ib1", free=4),
        node("b", rack="r12-07", fabric="ib1", free=4),
        node("c", rack="r2", fabric="ib2"),
        node("d", rack="r2", fabric="ib2"),
    ]
    assert chosen(plan(request(4, nodes=2), nodes, fac)) == ["c", "d"]


# --- headroom ---------------------------------------------------------------------------------


def test_headroom_counts_replicas_and_says_why_the_next_does_not_fit():
    nodes = [node("a", free=8), node("b", free=6, rack="r12-07"), node("c", free=3)]
    assert headroom(request(3), nodes, NO_FACILITY) == Headroom(
        fits=5, why_not="no node fits (3 nodes): 2 × gpu: 3 requested, 0 free; 1 × gpu: 3 requested, 2 free"
    )


def test_headroom_respects_power_and_stops_at_the_limit():
    fac = facility(budgets=[Budget(RACK, 6000)], margin=0)
    nodes = [node("a", rack="r12-07"), node("b", rack="r12-07")]
    result = headroom(request(2), nodes, fac)
    # 700 W of nodes, then 1.4 kW a replica: 3 fit in 6 kW (4.9 kW), the 4th would make it 6.3 kW.
    assert result.fits == 3
    assert result.why_not == (
        "no node fits (2 nodes): 2 × rack r12-07: 4.9 kW of a 6.0 kW limit (6.0 kW cap less 0%) in use, "
        "6.3 kW with the shard (~1.4 kW)"
    )
    assert headroom(request(1), nodes, NO_FACILITY, limit=5) == Headroom(fits=5, why_not=None)


# --- the index --------------------------------------------------------------------------------


def test_index_apply_updates_free_resources_power_and_replicas():
    fac = facility(budgets=[Budget(RACK, 16000)])
    index = PlacementIndex([node("a", rack="r12-07", free=8)], fac)
    assert index.use_watts(RACK) == 350
    result = index.plan(request(4, cpu_cores=8, memory_gib=100))
    index.apply(result)
    after = index.node("a")
    assert after.free_gpus == (4, 5, 6, 7)
    assert (after.cpu_cores_free, after.memory_gib_free) == (56, 924)
    assert (after.placed_watts, after.replicas) == (2800, 1)
    assert index.use_watts(RACK) == 3150
    assert index.use_watts(Domain("rack", "elsewhere")) is None


def test_index_follows_updates_and_facility_changes():
    index = PlacementIndex([node("a", free=8), node("b", free=4)], NO_FACILITY)
    assert chosen(index.plan(request(4))) == ["b"]
    index.update_node(node("b", free=4, cordoned=True))
    result = index.plan(request(4))
    assert chosen(result) == ["a"]
    assert result.rejections == {"b": "cordoned"}
    index.remove_node("b")
    assert chosen(index.plan(request(4))) == ["a"]
    index.set_facility(facility(holds={Domain("rack", "r1"): ""}))
    index.update_node(node("a", rack="r1"))
    assert index.plan(request(4)).summary == "no node fits (1 node): 1 × rack r1 is held"


def test_index_refuses_a_node_listed_twice():
    with pytest.raises(ValueError, match="listed twice"):
        PlacementIndex([node("a"), node("a")], NO_FACILITY)


def _shared_pdu_cluster():
    """a and b on PDU p (3 kW cap, no margin) from racks r1 and r2: a's 4 cards draw 1 kW each, so a
    4-card shard on it is refused by p, and b's 300 W cards fit; c (2 cards free) takes only small
    shards. The index's plans for the 4-card model walk past a to choose b."""
    pdu = Domain("pdu", "p")
    nodes = [
        node("a", rack="r1", pdu="p", limit=1000),
        node("b", rack="r2", pdu="p", limit=300),
        node("c", rack="r3", pdu="p", free=2, limit=300),
    ]
    return nodes, facility(budgets=[Budget(pdu, 3000)], margin=0)


def test_index_words_a_passed_over_node_with_the_domains_use_of_now():
    # Another model's shard on c raises p's use; nothing of the 4-card model's ranking moves (c is no
    # candidate for it), but a is refused at the new figure, as the plain path says it.
    nodes, fac = _shared_pdu_cluster()
    index = PlacementIndex(nodes, fac)
    first = index.plan(request(4))
    assert chosen(first) == ["b"] and "1.1 kW" in first.rejections["a"], first.rejections
    index.apply(index.plan(request(2, model="small")))
    again = index.plan(request(4))
    assert again == plan_replica(request(4), index.nodes(), fac)
    assert "1.6 kW" in again.rejections["a"], again.rejections


def test_index_words_a_passed_over_node_with_the_exclusions_of_now():
    # The same walk with a excluded after a lost race: a is passed over as excluded, not as refused.
    nodes, fac = _shared_pdu_cluster()
    index = PlacementIndex(nodes, fac)
    assert chosen(index.plan(request(4))) == ["b"]
    result = index.plan(request(4), exclude=frozenset({"a"}))
    assert result == plan_replica(request(4), nodes, fac, exclude=frozenset({"a"}))
    assert result.rejections == {"a": "excluded (lost a race)"}


def test_apply_shard_keeps_every_other_field_of_the_view():
    # apply_shard builds the view field by field (dataclasses.replace was a placement's own cost in the
    # index): a field added to NodeView and not passed on would come back at its default here.
    view = node("a", rack="r1", free=(1, 3, 5), fabric="ib1", cores_free=40, memory_free=512, limit=700,
                placed=1400, measured=2100, weights=("m1",), replicas=2, cordoned=True, ready=False,
                machine="pcie-4gpu")
    shard = ShardPlan("a", (3, 5), 8, 128, 1400)
    changed = {
        "free_gpus": (1,), "cpu_cores_free": 32, "memory_gib_free": 384, "placed_watts": 2800, "replicas": 3,
    }
    assert apply_shard(view, shard) == dataclasses.replace(view, **changed)
    defaults = NodeView("x", True, False, {}, (), None, 0, (), 0, 0, 0, 0)
    assert all(
        getattr(view, f.name) != getattr(defaults, f.name) for f in dataclasses.fields(NodeView) if f.name not in changed
    )


def test_index_checks_a_passed_over_node_again_once_its_cores_are_free():
    # Only the node's free cores change (its place in the ranking stays): the rejection kept from the
    # last plan no longer holds, and the node ranked first takes the replica.
    nodes = [node("a", cores_free=0), node("b"), node("c")]
    index = PlacementIndex(nodes, NO_FACILITY)
    req = request(1, cpu_cores=8)
    assert index.plan(req).rejections == {"a": "cpu: 8 requested, 0 free"}
    index.update_node(dataclasses.replace(nodes[0], cpu_cores_free=64))
    result = index.plan(req)
    assert chosen(result) == ["a"] and result == plan_replica(req, index.nodes(), NO_FACILITY)
