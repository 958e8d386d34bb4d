"""The index's kept walks against the plain path in the sequences that broke them: a replay cut short by
its choice, then a slate it did not reach changing while the model's next plans take the walk up."""

from __future__ import annotations

import dataclasses
from collections import Counter

from facility.domains import Domain, domains_of
from facility.power import Budget
from placement.index import PlacementIndex
from placement.planner import (
    DomainCondition,
    FacilityView,
    NodeView,
    Plan,
    Profile,
    ReplicaRequest,
    plan_replica,
)

R1, R2, R3 = (Domain("rack", name) for name in ("R1", "R2", "R3"))
REQUEST = ReplicaRequest("m1", Profile(gpus=1))


def node(name: str, rack: str, *, free: int = 8, placed: float = 0.0, cordoned: bool = False,
         weights: tuple[str, ...] = ()) -> NodeView:
    labels = {"llmgw.io/rack": rack, "llmgw.io/pdu": f"{rack}-a", "gpu.model": "H100"}
    return NodeView(
        name=name, ready=True, cordoned=cordoned, labels=labels, domains=domains_of(labels), fabric=None,
        gpus_total=8, free_gpus=tuple(range(8 - free, 8)), cpu_cores_total=64, cpu_cores_free=64,
        memory_gib_total=1024, memory_gib_free=1024, gpu_power_limit_watts=700.0, placed_watts=placed,
        measured_watts=None, weights=frozenset(weights),
    )


class Side:
    """The index and the plain path on the same nodes; every plan held to the plain path's."""

    def __init__(self, nodes: list[NodeView], facility: FacilityView) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.facility = facility
        self.index = PlacementIndex(nodes, facility)

    def change(self, name: str, **fields) -> None:
        self.nodes[name] = dataclasses.replace(self.nodes[name], **fields)
        self.index.update_node(self.nodes[name])

    def plan(self, exclude: frozenset[str] = frozenset()) -> Plan:
        expected = plan_replica(REQUEST, list(self.nodes.values()), self.facility, exclude=exclude)
        got = self.index.plan(REQUEST, exclude=exclude)
        assert got == expected
        assert list(got.rejections.items()) == list(expected.rejections.items())
        assert dict(got.reasons) == dict(Counter(expected.rejections.values()))
        return got


def test_a_slate_the_cut_short_replay_did_not_reach_changes_then_its_rack_use_moves():
    side = Side(
        [
            node("x0", "R1", cordoned=True),  # R1 has room: x0 and x1 are refused only while cordoned
            node("x1", "R1", cordoned=True),
            node("s1", "R2"), node("s2", "R2"), node("s3", "R2"),  # R2 full: power refusals
            node("c1", "R3"),  # R3 warm: ranked after the ok racks
        ],
        FacilityView(
            budgets={R1: Budget(R1, 100000.0), R2: Budget(R2, 3000.0, 5000.0)},
            conditions={R3: DomainCondition("warm", enforce=True)},
        ),
    )
    assert list(side.plan().rejections) == ["x0", "x1", "s1", "s2", "s3"]  # looked at, not applied
    side.change("x1", cordoned=False)
    assert side.plan().nodes == frozenset({"x1"})  # the replay stops at x1, before R2's refusals
    side.change("s3", free_gpus=(), placed_watts=5600.0)  # R2's slate shrinks and its use moves
    assert side.plan().nodes == frozenset({"x1"})


def test_a_node_moved_into_a_slate_the_cut_short_replay_did_not_reach_is_walked_once():
    side = Side(
        [
            node("n1", "R2", weights=("m1",)),  # holds the weights: first of R2's
            node("a0", "R1", cordoned=True),  # R1 tight
            node("a1", "R1", cordoned=True),
            node("s1", "R2"), node("s2", "R2"), node("s3", "R2"),
            node("f", "R2", free=0, placed=8000.0),  # fills R2
            node("c1", "R3"),  # R3 warm
        ],
        FacilityView(
            budgets={R1: Budget(R1, 1612.0), R2: Budget(R2, 10000.0)},
            conditions={R3: DomainCondition("warm", enforce=True)},
        ),
    )
    side.plan()
    side.change("a1", cordoned=False)
    assert side.plan().nodes == frozenset({"a1"})
    side.change("n1", weights=frozenset())  # n1 joins R2's other slate, at its first place
    side.change("f", placed_watts=0.0)  # R2 has room again
    assert side.plan().nodes == frozenset({"n1"})
    for _ in range(2):
        plan = side.plan(exclude=frozenset({"n1", "s1"}))
        assert plan.reasons == {"excluded (lost a race)": 2}
