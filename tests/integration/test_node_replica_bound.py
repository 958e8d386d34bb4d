"""A node is given at most MAX_NODE_REPLICAS replicas: its agent reports each one in every heartbeat, and
a heartbeat listing more than the protocol's bound is refused, leaving the node not ready for good."""

from __future__ import annotations

import pytest

from agents.node import protocol
from placement.models import Replica, ReplicaState
from placement.planner import MAX_NODE_REPLICAS
from placement.reconcile import reconcile_all
from placement.services import models_apply

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_bound_leaves_room_under_what_a_heartbeat_may_report():
    assert 2 * MAX_NODE_REPLICAS <= protocol.MAX_REPLICAS


def test_replicas_that_ask_for_nothing_stop_at_the_bound_with_the_reason(join_node):
    join_node("gpu01", rack="r1")
    models_apply(text="kind: Model\nname: sidecar\nreplicas: 520\nprofile: {gpus: 0}\n")
    reconcile_all()
    replicas = Replica.objects.filter(model__name="sidecar")
    assert replicas.filter(state=ReplicaState.PLACED).count() == MAX_NODE_REPLICAS
    waiting = replicas.filter(state=ReplicaState.PENDING)
    assert waiting.count() == 520 - MAX_NODE_REPLICAS
    assert f"replicas: {MAX_NODE_REPLICAS} on the node, the most one node runs" in waiting.first().reason
