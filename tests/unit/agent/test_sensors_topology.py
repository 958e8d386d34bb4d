"""GPU topology in the inventory: three fixture machines (fake NVML answers + sysfs numa_node files)."""

from __future__ import annotations

import pynvml
import pytest

from agents.node.protocol import HeartbeatError, validate_heartbeat
from agents.node.sensors import SensorReader
from agents.node.sensors.topology import sysfs_bus_id
from tests.fakes.fake_nvml import fake_nvml, h100_sxm, library_missing
from tests.fakes.fixture_trees import tree
from tests.fakes.gpu_machines import hgx_h100, pcie_4gpu, pcie_nvlink_pairs


def inventory(nvml, name: str) -> dict:
    return SensorReader(sys_root=tree(name), nvml=nvml).inventory()


def rows(text: str) -> list[list[str]]:
    """A matrix as `nvidia-smi topo -m` prints it (GPU columns only)."""
    return [line.split()[1:] for line in text.strip().splitlines()]


def test_hgx_h100_every_pair_is_nv18_through_the_nvswitches():
    found = inventory(hgx_h100(), "hgx-h100")
    assert found["gpu_topology"] == {
        "links": rows(
            """
            GPU0  X     NV18  NV18  NV18  NV18  NV18  NV18  NV18
            GPU1  NV18  X     NV18  NV18  NV18  NV18  NV18  NV18
            GPU2  NV18  NV18  X     NV18  NV18  NV18  NV18  NV18
            GPU3  NV18  NV18  NV18  X     NV18  NV18  NV18  NV18
            GPU4  NV18  NV18  NV18  NV18  X     NV18  NV18  NV18
            GPU5  NV18  NV18  NV18  NV18  NV18  X     NV18  NV18
            GPU6  NV18  NV18  NV18  NV18  NV18  NV18  X     NV18
            GPU7  NV18  NV18  NV18  NV18  NV18  NV18  NV18  X
            """
        ),
        "numa": [0, 0, 0, 0, 1, 1, 1, 1],
    }
    assert [g["index"] for g in found["gpus"]] == list(range(8))
    assert found["hostname"] == "hgx01"


def test_pcie_server_with_nvlink_bridge_pairs_over_two_sockets():
    found = inventory(pcie_nvlink_pairs(), "pcie-nvlink-pairs")
    assert found["gpu_topology"] == {
        "links": rows(
            """
            GPU0  X     NV4   PIX   PIX   SYS   SYS   SYS   SYS
            GPU1  NV4   X     PIX   PIX   SYS   SYS   SYS   SYS
            GPU2  PIX   PIX   X     NV4   SYS   SYS   SYS   SYS
            GPU3  PIX   PIX   NV4   X     SYS   SYS   SYS   SYS
            GPU4  SYS   SYS   SYS   SYS   X     NV4   NODE  NODE
            GPU5  SYS   SYS   SYS   SYS   NV4   X     NODE  NODE
            GPU6  SYS   SYS   SYS   SYS   NODE  NODE  X     NV4
            GPU7  SYS   SYS   SYS   SYS   NODE  NODE  NV4   X
            """
        ),
        "numa": [0, 0, 0, 0, 1, 1, 1, 1],
    }


def test_pcie_box_without_nvlink_on_one_numa_node():
    found = inventory(pcie_4gpu(), "pcie-4gpu")
    assert found["gpu_topology"] == {
        "links": rows(
            """
            GPU0  X    PXB  PHB  PHB
            GPU1  PXB  X    PHB  PHB
            GPU2  PHB  PHB  X    PXB
            GPU3  PHB  PHB  PXB  X
            """
        ),
        "numa": [-1, -1, -1, -1],
    }


@pytest.mark.parametrize(
    ("machine", "name"), [(hgx_h100, "hgx-h100"), (pcie_nvlink_pairs, "pcie-nvlink-pairs"), (pcie_4gpu, "pcie-4gpu")]
)
def test_each_machine_heartbeat_passes_the_protocol(machine, name):
    found = inventory(machine(), name)
    heartbeat = validate_heartbeat({"node": "gpu01", "inventory": found})
    assert heartbeat["inventory"]["gpu_topology"] == found["gpu_topology"]


def test_an_older_driver_without_the_remote_type_still_finds_the_switches():
    nvml = hgx_h100()
    for gpu in nvml.gpus:
        gpu.nvlink_remote_type_supported = False
    links = inventory(nvml, "hgx-h100")["gpu_topology"]["links"]
    assert {links[i][j] for i in range(8) for j in range(8) if i != j} == {"NV18"}


def test_a_link_down_counts_one_fewer():
    nvml = pcie_nvlink_pairs()
    nvml.gpus[0].nvlinks[3] = None
    nvml.gpus[1].nvlinks[3] = None
    links = inventory(nvml, "pcie-nvlink-pairs")["gpu_topology"]["links"]
    assert links[0][1] == links[1][0] == "NV3"
    assert links[2][3] == "NV4"


def test_the_topology_is_read_once_while_the_gpus_stay_the_same():
    nvml = pcie_4gpu()
    node = SensorReader(sys_root=tree("pcie-4gpu"), nvml=nvml)
    first = node.inventory()["gpu_topology"]
    calls = sum(g.calls.get("nvmlDeviceGetTopologyCommonAncestor", 0) for g in nvml.gpus)
    assert node.inventory()["gpu_topology"] == first
    assert sum(g.calls.get("nvmlDeviceGetTopologyCommonAncestor", 0) for g in nvml.gpus) == calls


def test_what_cannot_be_read_is_null_never_a_guess():
    nvml = pcie_4gpu()
    del nvml.common_ancestors[frozenset((nvml.gpus[0].uuid, nvml.gpus[3].uuid))]
    nvml.gpus[2].pci_bus_id = None  # no bus id: no NUMA node either
    topology = SensorReader(sys_root=tree("vm"), nvml=nvml).inventory()["gpu_topology"]
    assert topology["links"][0][3] is None and topology["links"][3][0] is None
    assert topology["links"][0][1] == "PXB"
    assert topology["numa"] == [None, None, None, None]  # the vm tree has no PCI devices


def test_a_failing_gpu_call_leaves_the_rest_of_the_inventory():
    nvml = pcie_4gpu()
    nvml.gpus[1].errors["nvmlDeviceGetTopologyCommonAncestor"] = pynvml.NVML_ERROR_UNKNOWN
    found = inventory(nvml, "pcie-4gpu")
    assert len(found["gpus"]) == 4
    assert found["gpu_topology"]["links"][0][1] is None
    assert found["gpu_topology"]["links"][2][3] == "PXB"


def test_one_gpu_has_a_one_by_one_matrix_and_no_gpu_none():
    gpu = h100_sxm(0)
    gpu.pci_bus_id = "00000000:1B:00.0"
    assert inventory(fake_nvml([gpu]), "hgx-h100")["gpu_topology"] == {"links": [["X"]], "numa": [0]}
    assert "gpu_topology" not in inventory(fake_nvml([]), "hgx-h100")
    assert "gpu_topology" not in inventory(library_missing(), "hgx-h100")


def test_bus_ids_as_sysfs_names_them():
    assert sysfs_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert sysfs_bus_id(b"00000001:C3:1F.7\x00") == "0001:c3:1f.7"
    assert sysfs_bus_id("not a bus id") is None
    assert sysfs_bus_id(None) is None


# -- the protocol's bounds ---------------------------------------------------------------------


def heartbeat_with(topology) -> dict:
    return {"node": "gpu01", "inventory": {"gpu_topology": topology}}


@pytest.mark.parametrize(
    ("topology", "field", "words"),
    [
        ([], "inventory.gpu_topology", "must be an object"),
        ({"links": [["X"]]}, "inventory.gpu_topology.numa", "is required"),
        ({"links": [["X", "NV4"], ["NV4"]], "numa": [0, 0]}, "inventory.gpu_topology.links[1]", "2 entries"),
        ({"links": [["X", "NV4"], ["NV2", "X"]], "numa": [0, 0]}, "inventory.gpu_topology.links[1][0]", "NV4"),
        ({"links": [["PIX"]], "numa": [0]}, "inventory.gpu_topology.links[0][0]", "'X'"),
        ({"links": [["X", "QPI"], ["QPI", "X"]], "numa": [0, 0]}, "inventory.gpu_topology.links[0][1]", "PIX"),
        ({"links": [["X", "NV0"], ["NV0", "X"]], "numa": [0, 0]}, "inventory.gpu_topology.links[0][1]", "NV"),
        ({"links": [["X"]], "numa": [0, 1]}, "inventory.gpu_topology.numa", "one entry a GPU"),
        ({"links": [["X"]], "numa": [-2]}, "inventory.gpu_topology.numa[0]", "between -1 and"),
        ({"links": [["X"]] * 65, "numa": [0] * 65}, "inventory.gpu_topology.links", "at most 64"),
        ({"links": [["X"]], "numa": [0], "cpus": "0-55"}, "inventory.gpu_topology.cpus", "unknown field"),
    ],
)
def test_a_bad_topology_is_refused_naming_its_field(topology, field, words):
    with pytest.raises(HeartbeatError) as refused:
        validate_heartbeat(heartbeat_with(topology))
    assert refused.value.field == field
    assert words in refused.value.message


def test_null_links_and_nodes_pass_as_unknown():
    topology = {"links": [["X", None], [None, "X"]], "numa": [None, 0]}
    assert validate_heartbeat(heartbeat_with(topology))["inventory"]["gpu_topology"] == topology


def test_a_topology_wiring_fewer_gpus_than_the_inventory_lists_is_refused():
    gpus = [{"index": i} for i in range(8)]
    body = {"node": "gpu01", "inventory": {"gpus": gpus, "gpu_topology": {"links": [["X", "NV4"], ["NV4", "X"]],
                                                                          "numa": [0, 0]}}}
    with pytest.raises(HeartbeatError) as refused:
        validate_heartbeat(body)
    assert (refused.value.field, refused.value.message) == (
        "inventory.gpus[2].index",
        "inventory.gpus[2].index: GPU 2 is not in inventory.gpu_topology, which wires GPUs 0 to 1",
    )


def test_a_gpu_the_agent_cannot_read_leaves_the_list_and_the_heartbeat_still_passes():
    # Its row stays in the matrix (nulls): the node keeps reporting while a card fails.
    nvml = pcie_4gpu()
    nvml.gpus[2].errors["nvmlDeviceGetUUID"] = pynvml.NVML_ERROR_UNKNOWN
    found = inventory(nvml, "pcie-4gpu")
    assert [g["index"] for g in found["gpus"]] == [0, 1, 3] and len(found["gpu_topology"]["links"]) == 4
    assert validate_heartbeat({"node": "gpu01", "inventory": found})["inventory"]["gpu_topology"] == found["gpu_topology"]
