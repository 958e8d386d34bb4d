"""Which GPUs a replica takes, end to end: a node's agent reports its topology in a heartbeat, models.yaml
asks for a topology, and ctl shows where each replica went and why."""

from __future__ import annotations

import textwrap

import pytest

from agents.models import Node
from agents.simulator.cluster import heartbeat_for
from llmgw.ctl import main as ctl
from placement.models import Shard
from tests.conftest import node_spec
from tests.fakes.gpu_machines import reported_topology

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = textwrap.dedent(
    """\
    kind: Model
    name: small
    replicas: 1
    profile:
      gpus: 3
    """
)
WIDE = textwrap.dedent(
    """\
    kind: Model
    name: wide
    replicas: 2
    profile:
      gpus: 4
      topology: same-numa
    """
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def apply(capsys, tmp_path, name: str, text: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    code, _, err = run(capsys, "apply", "-f", str(path))
    assert code == 0, err


def test_a_same_numa_replica_lands_inside_one_socket_of_the_pcie_server(capsys, tmp_path, join_node, node_client):
    # gpu01: eight PCIe cards over two sockets, NVLink-bridged in pairs, as its agent reads them.
    join_node("gpu01")
    beat = heartbeat_for(node_spec("gpu01"))
    beat["inventory"]["gpu_topology"] = reported_topology("pcie-nvlink-pairs")
    answer = node_client("gpu01").post("/api/v1/agents/heartbeat", beat, format="json")
    assert answer.status_code == 200, answer.content
    assert Node.objects.get(name="gpu01").gpu_topology["numa"] == [0, 0, 0, 0, 1, 1, 1, 1]
    # gpu02 reports no topology: nothing says its GPUs share a NUMA node.
    join_node("gpu02")

    apply(capsys, tmp_path, "small", SMALL)  # three cards of socket 0
    apply(capsys, tmp_path, "wide", WIDE)
    wide = sorted(Shard.objects.filter(replica__model__name="wide").values_list("node__name", "gpu_indices"))
    # The lowest free indices would be 3-6, across the sockets.
    assert wide == [("gpu01", [4, 5, 6, 7])]

    code, out, _ = run(capsys, "explain-placement", "small")
    assert "  why: leaves 5 GPUs free; GPUs 0-2, one NUMA node" in out.splitlines(), out
    code, out, _ = run(capsys, "explain-placement", "wide")
    lines = out.splitlines()
    assert lines[:3] == [
        "wide: 2 wanted, 1 placed, 1 pending (4 GPUs × 1 node; topology same-numa)",
        "#1 placed on gpu01[4-7]",
        "  why: leaves 1 GPU free; GPUs 4-7, one NUMA node",
    ], out
    assert "gpu02: topology: the node reports no GPU topology (same-numa needs it)" in out, out
    assert "gpu01: gpu: 4 requested, 1 free" in out, out
