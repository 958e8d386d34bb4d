"""With a loaded filter and scorer that say which of a node's fields they read (the example rack-affinity:
labels), the index keeps planning incrementally — their verdicts and keys kept, worked out again when a
label moves — and its plans stay the plain path's, through heartbeats, relabels and new facility figures;
a rule that says nothing of what it reads, or one failing now, sends it the plain way, and says so."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.examples import rack_affinity
from placement.index import PlacementIndex
from placement.planner import FacilityView, NodeView, Plan, Profile, ReplicaRequest, plan_replica
from placement.plugins import REGISTRY, Filter, Scorer
from tests.unit.test_planner_properties import (
    FAST,
    MODELS,
    applied,
    assert_same_plan,
    changed_node,
    facilities,
    scenario,
)


@pytest.fixture(autouse=True)
def _affinity_plugin():
    REGISTRY.remove_external()
    # A call's budget is on the wall clock: on a loaded machine a call the process was paused in overran it,
    # and its failure (not kept by the index) is not what these tests hold equal.
    REGISTRY.call_seconds = 60.0
    REGISTRY.add_filter(rack_affinity.FILTERS[0])
    REGISTRY.add_scorer(rack_affinity.SCORERS[0])
    yield
    REGISTRY.remove_external()


def kept_for(draw, node):
    kept = draw(st.lists(st.sampled_from(MODELS), max_size=2, unique=True))
    labels = {k: v for k, v in node.labels.items() if k != rack_affinity.LABEL}
    if kept:
        labels[rack_affinity.LABEL] = ",".join(kept)
    return dataclasses.replace(node, labels=labels)


def plain_path_taken(index: PlacementIndex, request) -> bool:
    """Whether index.plan goes the plain way for the request (it then plans through plan_replica)."""
    import placement.index as index_module

    taken = []
    real = index_module.plan_replica

    def spy(*args, **kwargs):
        taken.append(True)
        return real(*args, **kwargs)

    index_module.plan_replica = spy
    try:
        index.plan(request)
    finally:
        index_module.plan_replica = real
    return bool(taken)


@FAST
@given(st.data())
def test_the_index_keeps_the_plain_paths_plans_with_a_filter_and_scorer_that_read_labels(data):
    same_plans_through_changes(data)


@FAST
@given(st.data(), st.sampled_from([5, 10, 15, 35, 45, 55, 60, 65]))
def test_the_index_keeps_the_plain_paths_plans_wherever_a_kept_scorer_ranks(data, order):
    """A scorer not built in ranks before spread, between any two built-ins or after bin packing: the
    index puts its kept keys in that place of its own."""
    REGISTRY.remove_external()
    REGISTRY.call_seconds = 60.0
    REGISTRY.add_filter(rack_affinity.FILTERS[0])
    REGISTRY.add_scorer(dataclasses.replace(rack_affinity.SCORERS[0], order=order))
    same_plans_through_changes(data)


def same_plans_through_changes(data) -> None:
    """The index's plans and the plain path's, through plans, heartbeats, relabels and facility figures."""
    nodes, facility, reqs = data.draw(scenario())
    nodes = [kept_for(data.draw, n) for n in nodes]
    reqs = [r for r in reqs if r.profile.nodes == 1] or [dataclasses.replace(reqs[0], profile=dataclasses.replace(
        reqs[0].profile, nodes=1, keep_within=None))]
    racks = sorted({n.labels["llmgw.io/rack"] for n in nodes}) + ["r-new"]
    index = PlacementIndex(nodes, facility)
    existing: dict[str, list[frozenset[str]]] = {}
    for _ in range(data.draw(st.integers(4, 24))):
        step = data.draw(st.sampled_from(["plan", "plan", "plan", "look", "node", "relabel", "facility"]))
        if step in ("node", "relabel"):
            at = data.draw(st.integers(0, len(nodes) - 1))
            nodes[at] = kept_for(data.draw, nodes[at]) if step == "relabel" else data.draw(
                changed_node(nodes[at], racks))
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


def test_which_plugins_keep_the_index(caplog):
    node = NodeView(name="n1", ready=True, cordoned=False, labels={}, domains=(), fabric=None, gpus_total=8,
                    free_gpus=tuple(range(8)), cpu_cores_total=8, cpu_cores_free=8, memory_gib_total=64,
                    memory_gib_free=64)
    index = PlacementIndex([node], FacilityView())
    request = ReplicaRequest(model="m1", profile=Profile(gpus=1))
    assert not plain_path_taken(index, request)  # rack-affinity's filter and scorer say they read labels
    REGISTRY.add_filter(Filter("weights-too", lambda node, request: None, reads=frozenset({"labels", "weights"})))
    assert not plain_path_taken(index, request)  # any of a node's fields may be read
    REGISTRY.add_scorer(Scorer("heat", lambda node, request: 0, reads=frozenset({"temperature"})))
    assert REGISTRY.plain_path_reason() == "scorer heat reads temperature, not a field of a node"
    assert plain_path_taken(index, request)
    REGISTRY.remove_external()
    REGISTRY.add_scorer(Scorer("s", lambda node, request: 0))
    with caplog.at_level(logging.WARNING, logger="placement.index"):
        assert plain_path_taken(index, request)
    assert ("placement plans the plain way, every node asked every rule (slower): scorer s does not say which of "
            "a node's fields it reads") in caplog.text
    REGISTRY.remove_external()
    REGISTRY.add_filter(Filter("f", lambda node, request: None))
    assert REGISTRY.plain_path_reason() == "filter f does not say which of a node's fields it reads"
    assert plain_path_taken(index, request)


def test_a_kept_key_is_worked_out_again_only_when_what_it_reads_moves():
    calls: list[str] = []

    def key(node, placing):
        calls.append(node.name)
        return 0 if node.labels.get("fast") else 1

    REGISTRY.remove_external()
    REGISTRY.add_scorer(Scorer("fast", key, order=15, reads=frozenset({"labels"})))
    nodes = [NodeView(name=f"n{i}", ready=True, cordoned=False, labels={}, domains=(), fabric=None, gpus_total=8,
                      free_gpus=tuple(range(8)), cpu_cores_total=8, cpu_cores_free=8, memory_gib_total=64,
                      memory_gib_free=64) for i in range(3)]
    index = PlacementIndex(nodes, FacilityView())
    request = ReplicaRequest(model="m1", profile=Profile(gpus=1))
    assert index.plan(request).nodes == {"n0"}
    assert sorted(calls) == ["n0", "n1", "n2"]
    calls.clear()
    index.update_node(dataclasses.replace(nodes[2], measured_watts=500.0))  # not what it reads
    assert index.plan(request).nodes == {"n0"}
    assert calls == []
    index.update_node(dataclasses.replace(nodes[2], labels={"fast": "yes"}))
    assert index.plan(request).nodes == {"n2"}
    assert calls == ["n2"]
