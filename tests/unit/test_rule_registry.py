"""One rule interface: a filter and a scorer added to the registry as one entry each (from a test
package) are asked by the plain planner, the index (which keeps its plans), the commit's re-check and
explain's words, in their place among the built-ins; power stays the last filter."""

from __future__ import annotations

import dataclasses

import pytest

from facility.domains import domains_of
from placement.index import PlacementIndex
from placement.planner import (
    BUILTIN_FILTERS,
    FacilityView,
    NodeView,
    NoFit,
    Placing,
    Profile,
    ReplicaRequest,
    plan_replica,
    recheck_rejection,
)
from placement.plugins import REGISTRY
from tests.fakes.rules import GOLD_FIRST, QUIET_HOURS


@pytest.fixture(autouse=True)
def _rules():
    REGISTRY.remove_external()
    REGISTRY.call_seconds = 60.0  # the budget is on the wall clock: a loaded machine's pause is no failure here
    REGISTRY.add_filter(QUIET_HOURS)
    REGISTRY.add_scorer(GOLD_FIRST)
    yield
    REGISTRY.remove_external()


def node(name: str, rack: str, **labels: str) -> NodeView:
    labels = {"llmgw.io/rack": rack, **labels}
    return NodeView(name=name, ready=True, cordoned=False, labels=labels, domains=domains_of(labels), fabric=None,
                    gpus_total=8, free_gpus=tuple(range(8)), cpu_cores_total=8, cpu_cores_free=8,
                    memory_gib_total=64, memory_gib_free=64)


REQUEST = ReplicaRequest(model="m", profile=Profile(gpus=8))


def test_each_rule_takes_its_place_among_the_built_ins_and_power_stays_last():
    assert [f.id for f in REGISTRY.filters] == [*(f.id for f in BUILTIN_FILTERS[:-1]), "quiet-hours", "power"]
    assert [s.id for s in REGISTRY.scorers][:3] == ["spread", "gold-first", "condition"]


def test_the_plan_the_index_and_explain_ask_the_added_rules():
    nodes = [node("n1", "r1", quiet="yes", tier="gold"), node("n2", "r2"), node("n3", "r3", tier="gold")]
    plain = plan_replica(REQUEST, nodes, FacilityView())
    assert plain.nodes == {"n3"}  # n1 is quiet; n3 is gold, before n2's name
    assert plain.why == "leaves 0 GPUs free; a gold node (gold-first)"
    assert plain.rejections == {"n1": "quiet-hours: in its quiet hour"}
    index = PlacementIndex(nodes, FacilityView())
    assert index.plan(REQUEST) == plain
    # Relabelled: the index asks the rules again of that node, and plans as the plain path does.
    nodes[2] = dataclasses.replace(nodes[2], labels={**nodes[2].labels, "quiet": "yes"})
    index.update_node(nodes[2])
    plain = plan_replica(REQUEST, nodes, FacilityView())
    assert plain.nodes == {"n2"}
    assert index.plan(REQUEST) == plain
    nodes[1] = dataclasses.replace(nodes[1], labels={**nodes[1].labels, "quiet": "yes"})
    index.update_node(nodes[1])
    nofit = index.plan(REQUEST)
    assert isinstance(nofit, NoFit)
    assert nofit.summary == "no node fits (3 nodes): 3 × quiet-hours: in its quiet hour"
    assert nofit == plan_replica(REQUEST, nodes, FacilityView())


def test_the_commits_recheck_asks_the_added_filter():
    quiet = node("n1", "r1", quiet="yes")
    assert recheck_rejection(quiet, Placing(REQUEST, FacilityView())) == "quiet-hours: in its quiet hour"
    assert recheck_rejection(node("n2", "r2"), Placing(REQUEST, FacilityView())) is None
