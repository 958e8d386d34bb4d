"""A small simulated cluster driven without HTTP: each tick, every node's agent reports and takes its answer.

It goes through the same services as the heartbeat API (heartbeat_record, node_assignments), with the
simulator's runtime (replicas ready after `ready_delay` of simulated time), so drains can be watched
step by step.
"""

from __future__ import annotations

from collections import Counter

from agents.services import heartbeat_record
from agents.simulator.nodes import SimNode
from placement.models import Replica, ReplicaState
from placement.selectors import node_assignments
from tests.conftest import node_spec


class Cluster:
    def __init__(self, racks: dict[str, int], *, gpus: int = 8, ready_delay: float = 2.0, reconcile: bool = True):
        """`racks`: rack name → nodes in it; nodes are named n-<rack>-<i>, each on PDU <rack>-a."""
        self.nodes: dict[str, SimNode] = {}
        for rack, count in racks.items():
            for i in range(count):
                name = f"n-{rack}-{i}"
                spec = node_spec(name, rack=rack, pdu=f"{rack}-a", gpus=gpus)
                self.nodes[name] = SimNode(spec, interval=10, ready_delay=ready_delay)
        self.clock = 0.0
        # False when a real worker reconciles (its beat, and the tasks the changes send).
        self.reconcile = reconcile

    def add(self, name: str, rack: str, *, gpus: int = 8) -> None:
        self.nodes[name] = SimNode(node_spec(name, rack=rack, pdu=f"{rack}-a", gpus=gpus), interval=10,
                                   ready_delay=next(iter(self.nodes.values())).runtime.ready_delay)

    def tick(self, seconds: float = 1.0) -> None:
        """Advance simulated time; every node reports and takes the replicas it must run."""
        from placement.reconcile import reconcile_all

        self.clock += seconds
        for name, node in self.nodes.items():
            heartbeat_record(node_name=name, heartbeat=node.heartbeat(self.clock))
        if self.reconcile:
            reconcile_all()  # what the periodic reconcile does
        for name, node in self.nodes.items():
            node.take_answer({"replicas": node_assignments(name)}, self.clock)


def ready_counts() -> Counter:
    return Counter(
        Replica.objects.filter(state=ReplicaState.READY).values_list("model__name", flat=True)
    )


def racks_of(model: str) -> list[str]:
    """The racks a model's replicas run in, one entry per shard."""
    from placement.models import Shard

    return sorted(
        Shard.objects.filter(replica__model__name=model).values_list("node__labels__llmgw.io/rack", flat=True)
    )
