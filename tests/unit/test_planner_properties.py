"""Properties of the planner that must hold whatever the cluster: power, missing data, spreading, order."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import placement.index
from facility.domains import Domain, domains_of
from facility.power import Budget, FacilitySettings
from placement.index import PlacementIndex
from placement.planner import (
    DomainCondition,
    FacilityView,
    NodeView,
    NoFit,
    Placing,
    Plan,
    Profile,
    ReplicaRequest,
    apply_shard,
    candidate_filters,
    domain_uses,
    plan_replica,
)
from placement.selector import parse_selector
from placement.topology import NVLINK, UNKNOWN_LINK, GpuTopology, is_nvlink, topology_of, worst_link
from tests.examples import examples
from tests.fakes.gpu_machines import MACHINES, reported_topology

MODELS = ("m1", "m2", "m3")
FAST = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The fixture machines' wirings (an NVSwitch board, NVLink pairs over two sockets, a 4-GPU PCIe box).
MACHINE_TOPOLOGIES = tuple(topology_of(reported_topology(name)) for name in MACHINES)


@st.composite
def topologies(draw, size: int = 8):
    """A node's GPU topology: none reported, a fixture machine's, or any symmetric matrix of links (some
    unknown) with GPUs on NUMA nodes 0 and 1 (some unknown)."""
    kind = draw(st.sampled_from(["none", "machine", "drawn"]))
    if kind == "none":
        return None
    if kind == "machine":
        return draw(st.sampled_from(MACHINE_TOPOLOGIES))
    links = [[NVLINK] * size for _ in range(size)]
    for i in range(size):
        for j in range(i + 1, size):
            links[i][j] = links[j][i] = draw(st.integers(NVLINK, UNKNOWN_LINK))
    numa = tuple(draw(st.sampled_from([None, 0, 1])) for _ in range(size))
    return GpuTopology(links=tuple(map(tuple, links)), numa=numa)


@st.composite
def clusters(draw, *, racks=(1, 6), per_rack=(1, 4), power=True, shared_pdus=True, all_up=False):
    """Nodes in racks (each rack on its own PDU, some also on a shared one), with random state."""
    nodes: list[NodeView] = []
    for r in range(draw(st.integers(*racks))):
        pdus = [f"r{r}-a"]
        if shared_pdus and draw(st.booleans()):
            pdus.append(f"shared{r % 2}")
        for i in range(draw(st.integers(*per_rack))):
            labels = {"llmgw.io/rack": f"r{r}", "llmgw.io/pdu": ",".join(pdus)}
            if draw(st.booleans()):
                labels["gpu.model"] = draw(st.sampled_from(["H100", "H200"]))
            total = 8
            free = draw(st.lists(st.integers(0, total - 1), unique=True, max_size=total))
            nodes.append(
                NodeView(
                    name=f"n{r}-{i}",
                    ready=all_up or draw(st.integers(0, 9)) > 0,
                    cordoned=not all_up and draw(st.integers(0, 9)) == 0,
                    labels=labels,
                    domains=domains_of(labels),
                    fabric=draw(st.sampled_from([None, "ib1", "ib2"])),
                    gpus_total=total,
                    free_gpus=tuple(sorted(free)),
                    cpu_cores_total=64,
                    cpu_cores_free=draw(st.integers(0, 64)),
                    memory_gib_total=1024,
                    memory_gib_free=float(draw(st.integers(0, 1024))),
                    gpu_power_limit_watts=draw(st.sampled_from([None, 300.0, 700.0])) if power else None,
                    placed_watts=float(draw(st.integers(0, 6000))) if power else 0.0,
                    measured_watts=(
                        draw(st.one_of(st.none(), st.floats(0, 9000, allow_nan=False))) if power else None
                    ),
                    weights=frozenset(draw(st.lists(st.sampled_from(MODELS), max_size=2))),
                    replicas=draw(st.integers(0, 3)),
                    gpu_topology=draw(topologies()),
                )
            )
    return nodes


def all_domains(nodes):
    return sorted({d for n in nodes for d in n.domains})


CONDITIONS = ("ok", "warm", "hot", "unknown")


@st.composite
def conditions(draw, nodes):
    """Some domains' conditions, each enforced or only observed."""
    found = {}
    for domain in all_domains(nodes):
        if draw(st.integers(0, 2)) == 0:
            found[domain] = DomainCondition(
                draw(st.sampled_from(CONDITIONS)), enforce=draw(st.booleans()), detail="inlet 33.0 °C for 6 min"
            )
    return found


@st.composite
def facilities(draw, nodes, *, power=True, holds=True, thermal=True):
    budgets = {}
    for domain in all_domains(nodes):
        if draw(st.booleans()):
            cap = float(draw(st.integers(1000, 60000))) if power else float(draw(st.integers(0, 60000)))
            other = float(draw(st.integers(0, 2000))) if power else 0.0
            budgets[domain] = Budget(domain, cap, other)
    held = {}
    if holds and draw(st.integers(0, 3)) == 0:
        domain = draw(st.sampled_from(all_domains(nodes) or [Domain("rack", "none")]))
        held[domain] = draw(st.sampled_from(["", "PDU swap"]))
    if power:
        fac_settings = FacilitySettings(margin=draw(st.sampled_from([0.0, 0.1, 0.25])))
    else:
        fac_settings = FacilitySettings(gpu_watts=None, cpu_core_watts=None, node_watts=None)
    found = draw(conditions(nodes)) if thermal else {}
    return FacilityView(settings=fac_settings, budgets=budgets, holds=held, conditions=found)


@st.composite
def requests(draw, *, power=True, multi=True):
    gpus = draw(st.integers(0, 8))
    nodes = draw(st.integers(1, 2)) if multi and gpus > 0 else 1
    profile = Profile(
        gpus=gpus,
        nodes=nodes,
        cpu_cores=draw(st.integers(0, 16)),
        memory_gib=float(draw(st.sampled_from([0, 64, 256]))),
        power_watts=draw(st.sampled_from([None, 1500.0, 6000.0])) if power else None,
        keep_within=draw(st.sampled_from([None, "rack"])) if nodes > 1 else None,
        selector=None,
        topology=draw(st.sampled_from(["any", "any", "nvlink-all", "same-numa"])),
    )
    return ReplicaRequest(model=draw(st.sampled_from(MODELS)), profile=profile)


def applied(nodes, plan):
    by_name = {n.name: n for n in nodes}
    for shard in plan.shards:
        by_name[shard.node] = apply_shard(by_name[shard.node], shard)
    return [by_name[n.name] for n in nodes]


@st.composite
def scenario(draw, **kwargs):
    nodes = draw(clusters(**kwargs))
    return nodes, draw(facilities(nodes)), draw(st.lists(requests(), min_size=1, max_size=8))


@FAST
@given(scenario())
def test_no_plan_takes_a_domain_past_its_limit(case):
    nodes, facility, reqs = case
    existing: dict[str, list[frozenset[str]]] = {}
    for req in reqs:
        req = dataclasses.replace(req, existing=tuple(existing.get(req.model, ())))
        result = plan_replica(req, nodes, facility)
        if isinstance(result, NoFit):
            # Refused, and saying why for each node: every node has its rejection, and the summary words.
            assert set(result.rejections) == {n.name for n in nodes}, result
            assert all(result.rejections.values()) and result.summary
            continue
        before = domain_uses(nodes, facility)
        nodes = applied(nodes, result)
        after = domain_uses(nodes, facility)
        touched = {d for s in result.shards for n in nodes if n.name == s.node for d in n.domains}
        for domain in touched & facility.budgets.keys():
            limit = facility.budgets[domain].limit_watts(facility.settings.margin)
            assert after[domain] <= limit + 1e-6, (domain, before[domain], after[domain], limit)
        existing.setdefault(req.model, []).append(result.nodes)


@FAST
@given(scenario())
def test_the_pick_takes_as_many_free_gpus_as_asked_and_never_a_booked_one(case):
    """Plans applied one after another: each shard takes exactly the profile's GPUs, all free on its node
    and joined as its topology asks, and no card is taken twice."""
    nodes, facility, reqs = case
    taken: dict[str, set[int]] = {n.name: set(range(n.gpus_total)) - set(n.free_gpus) for n in nodes}
    by_name = {n.name: n for n in nodes}
    for req in reqs * 2:
        result = plan_replica(req, nodes, facility)
        if isinstance(result, NoFit):
            continue
        for shard in result.shards:
            gpus = set(shard.gpu_indices)
            assert len(shard.gpu_indices) == len(gpus) == req.profile.gpus, (shard, req.profile)
            assert gpus <= set(by_name[shard.node].free_gpus), (shard, by_name[shard.node].free_gpus)
            assert not gpus & taken[shard.node], (shard, taken[shard.node])
            wiring = by_name[shard.node].gpu_topology
            if req.profile.topology == "nvlink-all" and len(gpus) > 1:
                assert is_nvlink(worst_link(wiring, gpus)), (shard, wiring)
            if req.profile.topology == "same-numa" and len(gpus) > 1:
                assert len({wiring.numa_of(g) for g in gpus}) == 1 and None not in {wiring.numa_of(g) for g in gpus}
            taken[shard.node] |= gpus
        nodes = applied(nodes, result)
        by_name = {n.name: n for n in nodes}


def assert_same_plan(got, expected) -> None:
    """The index's answer is the plain path's, its rejections in the same (rank) order, and the reasons
    it counted as it walked (kept from one plan to the next) are its rejections' own."""
    assert got == expected
    assert list(got.rejections) == list(expected.rejections)
    if isinstance(got, Plan) and got.reasons is not None:
        assert dict(got.reasons) == dict(Counter(got.rejections.values()))


@FAST
@given(scenario())
def test_the_index_gives_the_plain_paths_plans(case):
    nodes, facility, reqs = case
    index = PlacementIndex(nodes, facility)
    existing: dict[str, list[frozenset[str]]] = {}
    for req in reqs * 2:
        req = dataclasses.replace(req, existing=tuple(existing.get(req.model, ())))
        expected = plan_replica(req, nodes, facility)
        assert_same_plan(index.plan(req), expected)
        if isinstance(expected, Plan):
            index.apply(expected)
            nodes = applied(nodes, expected)
            assert index.nodes() == tuple(sorted(nodes, key=lambda n: n.name))
            existing.setdefault(req.model, []).append(expected.nodes)


@st.composite
def changed_node(draw, node: NodeView, racks: list[str]) -> NodeView:
    """The node as a heartbeat, a freeing, a label move or another replica's cores and memory would
    leave it."""
    what = draw(st.sampled_from(["measured", "freed", "moved", "ready", "cores", "swapped", "rewired", "weights"]))
    if what == "measured":
        return dataclasses.replace(
            node, measured_watts=draw(st.one_of(st.none(), st.floats(0, 9000, allow_nan=False)))
        )
    if what == "freed":
        free = draw(st.lists(st.integers(0, node.gpus_total - 1), unique=True, max_size=node.gpus_total))
        return dataclasses.replace(node, free_gpus=tuple(sorted(free)), placed_watts=float(draw(st.integers(0, 6000))))
    if what == "swapped":  # one replica gone, another come: as many cards free, others
        free = draw(st.lists(st.integers(0, node.gpus_total - 1), unique=True, min_size=len(node.free_gpus),
                             max_size=len(node.free_gpus)))
        return dataclasses.replace(node, free_gpus=tuple(sorted(free)))
    if what == "weights":  # the agent loaded or dropped a model's weights
        return dataclasses.replace(node, weights=frozenset(draw(st.lists(st.sampled_from(MODELS), max_size=2))))
    if what == "rewired":  # the agent read its topology anew (or could not)
        return dataclasses.replace(node, gpu_topology=draw(topologies()))
    if what == "cores":
        return dataclasses.replace(
            node, cpu_cores_free=draw(st.integers(0, 64)), memory_gib_free=float(draw(st.integers(0, 1024)))
        )
    if what == "moved":
        labels = {**node.labels, "llmgw.io/rack": draw(st.sampled_from(racks)), "llmgw.io/pdu": "moved-a"}
        return dataclasses.replace(node, labels=labels, domains=domains_of(labels))
    return dataclasses.replace(node, ready=not node.ready)


@FAST
@given(st.data())
def test_the_index_keeps_the_plain_paths_plans_through_changes(data):
    """Plans (some only looked at, as explain does) interleaved with heartbeats, freeing, label moves and
    new facility figures: the index's kept rankings never drift from what the plain path works out afresh."""
    nodes, facility, reqs = data.draw(scenario())
    racks = sorted({n.labels["llmgw.io/rack"] for n in nodes}) + ["r-new"]
    index = PlacementIndex(nodes, facility)
    existing: dict[str, list[frozenset[str]]] = {}
    for _ in range(data.draw(st.integers(4, 24))):
        step = data.draw(st.sampled_from(["plan", "plan", "plan", "look", "node", "facility"]))
        if step == "node":
            at = data.draw(st.integers(0, len(nodes) - 1))
            nodes[at] = data.draw(changed_node(nodes[at], racks))
            index.update_node(nodes[at])
            continue
        if step == "facility":
            facility = data.draw(facilities(nodes))
            index.set_facility(facility)
            continue
        req = data.draw(st.sampled_from(reqs))
        req = dataclasses.replace(req, existing=tuple(existing.get(req.model, ())))
        expected = plan_replica(req, nodes, facility)
        assert_same_plan(index.plan(req), expected)
        if isinstance(expected, Plan) and step == "plan":
            index.apply(expected)
            nodes = applied(nodes, expected)
            existing.setdefault(req.model, []).append(expected.nodes)


@FAST
@given(st.data())
def test_with_every_power_figure_missing_the_plan_is_as_without_facility(data):
    nodes = data.draw(clusters(power=False))
    facility = data.draw(facilities(nodes, power=False))
    req = data.draw(requests(power=False))
    ignored = FacilityView(holds=facility.holds, conditions=facility.conditions)
    with_power = plan_replica(req, nodes, facility)
    without = plan_replica(req, nodes, ignored)
    assert type(with_power) is type(without)
    if isinstance(without, Plan):
        assert [(s.node, s.gpu_indices) for s in with_power.shards] == [
            (s.node, s.gpu_indices) for s in without.shards
        ]
        assert (with_power.why, with_power.rejections) == (without.why, without.rejections)
        assert all(s.draw_watts is None for s in with_power.shards)
    else:
        assert with_power == without


@FAST
@given(clusters(all_up=True, shared_pdus=False), st.integers(1, 8), st.sampled_from(MODELS))
def test_replicas_land_on_distinct_racks_while_racks_have_room(nodes, gpus, model):
    req = ReplicaRequest(model=model, profile=Profile(gpus=gpus))
    racks_with_room = {n.labels["llmgw.io/rack"] for n in nodes if len(n.free_gpus) >= gpus}
    facility = FacilityView()
    existing: list[frozenset[str]] = []
    racks: list[str] = []
    for _ in racks_with_room:
        result = plan_replica(dataclasses.replace(req, existing=tuple(existing)), nodes, facility)
        assert isinstance(result, Plan)
        (shard,) = result.shards
        racks.append(next(n.labels["llmgw.io/rack"] for n in nodes if n.name == shard.node))
        nodes = applied(nodes, result)
        existing.append(result.nodes)
    assert len(racks) == len(set(racks))


@FAST
@given(scenario(), st.randoms(use_true_random=False))
def test_same_input_same_plan_whatever_the_node_order(case, rng: random.Random):
    nodes, facility, reqs = case
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    for req in reqs:
        assert plan_replica(req, nodes, facility) == plan_replica(req, shuffled, facility)
        assert plan_replica(req, nodes, facility) == plan_replica(req, nodes, facility)


@FAST
@given(st.data())
def test_spreading_never_filters(data):
    nodes = data.draw(clusters())
    facility = data.draw(facilities(nodes))
    req = data.draw(requests())
    names = [n.name for n in nodes]
    existing = data.draw(st.lists(st.frozensets(st.sampled_from(names), min_size=1, max_size=2), max_size=4))
    alone = plan_replica(req, nodes, facility)
    spread = plan_replica(dataclasses.replace(req, existing=tuple(existing)), nodes, facility)
    assert isinstance(alone, Plan) == isinstance(spread, Plan)
    if isinstance(alone, NoFit):
        assert alone == spread


@FAST
@given(
    st.integers(2, 5),
    st.integers(1, 8),
    st.integers(0, 30000),
    st.sampled_from([None, 3000.0, 9000.0]),
    st.integers(2, 3),
)
def test_a_multi_node_replica_is_counted_whole(count, gpus, cap, power_watts, wanted):
    labels = {"llmgw.io/rack": "r1"}
    nodes = [
        NodeView(
            name=f"n{i}",
            ready=True,
            cordoned=False,
            labels=labels,
            domains=domains_of(labels),
            fabric="ib1",
            gpus_total=8,
            free_gpus=tuple(range(8)),
            cpu_cores_total=64,
            cpu_cores_free=64,
            memory_gib_total=1024,
            memory_gib_free=1024,
        )
        for i in range(count)
    ]
    rack = Domain("rack", "r1")
    facility = FacilityView(budgets={rack: Budget(rack, float(cap))})
    req = ReplicaRequest("m1", Profile(gpus=gpus, nodes=wanted, power_watts=power_watts))
    result = plan_replica(req, nodes, facility)
    if isinstance(result, Plan):
        assert len(result.shards) == wanted
        after = domain_uses(applied(nodes, result), facility)
        assert after[rack] <= facility.budgets[rack].limit_watts(0.1) + 1e-6


@FAST
@given(scenario())
def test_no_plan_lands_in_an_enforced_hot_domain_and_observe_changes_nothing(case):
    nodes, facility, reqs = case
    observed = dataclasses.replace(
        facility,
        conditions={d: dataclasses.replace(c, enforce=False) for d, c in facility.conditions.items()},
    )
    blind = dataclasses.replace(facility, conditions={})
    by_name = {n.name: n for n in nodes}
    for req in reqs:
        result = plan_replica(req, nodes, facility)
        if isinstance(result, Plan):
            for shard in result.shards:
                for domain in by_name[shard.node].domains:
                    state = facility.conditions.get(domain)
                    assert not (state and state.enforce and state.condition == "hot"), (shard.node, domain)
        watched, unwatched = plan_replica(req, nodes, observed), plan_replica(req, nodes, blind)
        if isinstance(unwatched, Plan):
            assert dataclasses.replace(watched, notes=()) == unwatched
        else:
            assert watched == unwatched


@FAST
@given(st.data())
def test_missing_data_never_refuses_everything(data):
    """Every domain unknown (no fresh reading), enforced or not: the plans are those without conditions."""
    nodes = data.draw(clusters())
    facility = data.draw(facilities(nodes, thermal=False))
    req = data.draw(requests())
    unknown = {d: DomainCondition("unknown", enforce=data.draw(st.booleans())) for d in all_domains(nodes)}
    assert plan_replica(req, nodes, dataclasses.replace(facility, conditions=unknown)) == plan_replica(
        req, nodes, facility
    )


@FAST
@given(st.integers(6, 8), st.integers(2, 3), st.data())
def test_replicas_stay_even_across_racks_by_count(racks, per_rack, data):
    """After two racks go, the model's replicas sit at most two per rack where room allows."""
    nodes = []
    for r in range(racks):
        for i in range(per_rack):
            labels = {"llmgw.io/rack": f"r{r}", "llmgw.io/pdu": f"r{r}-a"}
            nodes.append(
                NodeView(
                    name=f"n{r}-{i}", ready=True, cordoned=False, labels=labels, domains=domains_of(labels),
                    fabric=None, gpus_total=8, free_gpus=tuple(range(8)), cpu_cores_total=64, cpu_cores_free=64,
                    memory_gib_total=1024, memory_gib_free=1024,
                )
            )
    gone = set(data.draw(st.lists(st.sampled_from([f"r{r}" for r in range(racks)]), min_size=2, max_size=2,
                                  unique=True)))
    req = ReplicaRequest(model="m1", profile=Profile(gpus=8))
    live = [n for n in nodes if n.labels["llmgw.io/rack"] not in gone]
    index = PlacementIndex(live, FacilityView())
    existing: list[frozenset[str]] = []
    for _ in range(racks):
        request = dataclasses.replace(req, existing=tuple(existing))
        result = index.plan(request)
        assert result == plan_replica(request, index.nodes(), FacilityView())
        assert isinstance(result, Plan)
        index.apply(result)
        existing.append(result.nodes)
    per = Counter(name.split("-")[0] for replica in existing for name in replica)
    assert max(per.values()) - min(per.values()) <= 1, per
    assert max(per.values()) <= 2, per


@FAST
@given(clusters(), requests(), st.sampled_from([None, "gpu.model in (H200)", "gpu.model notin (H100), rack"]),
       st.data())
def test_a_candidates_first_refusal_is_the_registered_filters(nodes, request, selector, data):
    """The index checks a candidate — ready, not cordoned, not held, its cards free — against only the
    built-in filters that can turn such a node down (each filter's ``asks``): the first refusal is the
    registered filters' before power, word for word."""
    profile = dataclasses.replace(request.profile, selector=selector and parse_selector(selector))
    exclude = frozenset(data.draw(st.lists(st.sampled_from([n.name for n in nodes]), max_size=2)))
    checks = candidate_filters(profile, exclude)
    placing = Placing(dataclasses.replace(request, profile=profile), FacilityView(), exclude=exclude)
    candidates = [n for n in nodes if n.ready and not n.cordoned and len(n.free_gpus) >= profile.gpus]
    for node in candidates:
        first = next((r for r in (reject(node, placing) for reject in checks) if r), None)
        assert first == placing.rejection(node, before_power=True), node


@st.composite
def drifting(draw):
    """A cluster whose every node reads a draw of its own, racks and PDUs budgeted to bind, some racks
    warm or hot (enforced), and models of a few shard shapes — alike shapes with their own tokens per
    joule and weights — to place in turns."""
    nodes: list[NodeView] = []
    for r in range(draw(st.integers(2, 6))):
        for i in range(draw(st.integers(2, 6))):
            labels = {
                "llmgw.io/rack": f"r{r}",
                "llmgw.io/pdu": f"r{r}-{'ab'[i % 2]}",
                "gpu.model": draw(st.sampled_from(["H100", "H200"])),
            }
            placed = float(draw(st.sampled_from([0, 700, 2800, 4200])))
            nodes.append(
                NodeView(
                    name=f"n{r}-{i}", ready=True, cordoned=draw(st.integers(0, 19)) == 0, labels=labels,
                    domains=domains_of(labels), fabric=None, gpus_total=8,
                    free_gpus=tuple(range(int(placed // 700), 8)), cpu_cores_total=64, cpu_cores_free=64,
                    memory_gib_total=1024, memory_gib_free=1024, gpu_power_limit_watts=700.0,
                    placed_watts=placed,
                    measured_watts=draw(st.floats(300, 6500, allow_nan=False)),
                    weights=frozenset(draw(st.lists(st.sampled_from(MODELS), max_size=1))),
                )
            )
    budgets = {}
    for domain in all_domains(nodes):
        members = sum(1 for n in nodes if domain in n.domains)
        budgets[domain] = Budget(domain, float(draw(st.integers(2500, 6500)) * members), 500.0)
    racks = sorted(d for d in all_domains(nodes) if d.level == "rack")
    found = {
        rack: DomainCondition(draw(st.sampled_from(["warm", "hot"])), enforce=True)
        for rack in racks
        if draw(st.integers(0, 4)) == 0
    }
    facility = FacilityView(settings=FacilitySettings(), budgets=budgets, conditions=found)
    shapes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=2))
    reqs = [
        ReplicaRequest(
            model=model,
            profile=Profile(
                gpus=draw(st.sampled_from(shapes)),
                tokens_per_joule=(("H100", draw(st.sampled_from([0.0, 1.5, 2.5]))), ("H200", 2.0)),
            ),
        )
        for model in MODELS
    ]
    return nodes, facility, reqs


@FAST
@given(st.data())
def test_the_index_keeps_the_plain_paths_plans_through_drifting_readings(data):
    """Every node's reading its own and moving between plans (most by less than a headroom step), while
    models of shared shard shapes place in turns, lose races and see nodes freed: the index's plans stay
    the plain path's, rejections in rank order."""
    place_drifting(data)


@FAST
@given(st.data())
def test_the_index_keeps_the_plain_paths_plans_when_its_change_logs_drop_what_a_walk_needs(data):
    """A kept walk learns what moved since it was made from the index's logs of changed slates and uses;
    kept short, they drop what an older walk needs, and that walk is walked again whole: the plans stay the
    plain path's."""
    with mock.patch.object(placement.index, "_CHANGES_KEPT", data.draw(st.sampled_from([2, 8, 32]))):
        place_drifting(data)


def place_drifting(data) -> None:
    """Drifting readings and turns of placements, each plan held to the plain path's."""
    nodes, facility, reqs = data.draw(drifting())
    index = PlacementIndex(nodes, facility)
    existing: dict[str, list[frozenset[str]]] = {}
    for _ in range(data.draw(st.integers(6, 40))):
        for _ in range(data.draw(st.integers(0, 3))):
            at = data.draw(st.integers(0, len(nodes) - 1))
            node = nodes[at]
            drift = data.draw(st.sampled_from([0.0, 1e-9, 3.0, -3.0, 150.0, -150.0, 1500.0, -1500.0]))
            measured = max(0.0, (node.measured_watts or 0.0) + drift)
            if data.draw(st.integers(0, 9)) == 0:
                node = dataclasses.replace(node, free_gpus=tuple(range(8)), placed_watts=0.0)  # freed
            if data.draw(st.integers(0, 9)) == 0:  # weights loaded or dropped
                weights = data.draw(st.lists(st.sampled_from(MODELS), max_size=2))
                node = dataclasses.replace(node, weights=frozenset(weights))
            nodes[at] = dataclasses.replace(node, measured_watts=measured)
            index.update_node(nodes[at])
        req = data.draw(st.sampled_from(reqs))
        req = dataclasses.replace(req, existing=tuple(existing.get(req.model, ())))
        exclude = frozenset(data.draw(st.lists(st.sampled_from([n.name for n in nodes]), max_size=1)))
        expected = plan_replica(req, nodes, facility, exclude=exclude)
        assert_same_plan(index.plan(req, exclude=exclude), expected)
        if isinstance(expected, Plan):
            index.apply(expected)
            nodes = applied(nodes, expected)
            existing.setdefault(req.model, []).append(expected.nodes)
