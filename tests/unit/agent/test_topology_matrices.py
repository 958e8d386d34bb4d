"""The agent's topology reader and the placement's ranking on `nvidia-smi topo -m` matrices of real machines
(tests/fixtures/topology/README.md names each one's source)."""

from __future__ import annotations

import pytest

from agents.node.protocol import validate_heartbeat
from agents.node.sensors.nvml import NvmlSession
from placement.topology import gpus_pick, pick_words, refusal, topology_of
from tests.fakes.topo_matrices import matrix, numa_by_bus, scripted_nvml

MACHINES = ("dgx1-v100", "hgx-a100-p4d", "hgx-h100", "pcie-l40s-g6e")


def read_back(name: str) -> dict[str, list]:
    nodes = numa_by_bus(name)
    topology = NvmlSession(scripted_nvml(name)).topology(lambda bus: nodes[bus])
    assert topology is not None
    return topology


@pytest.mark.parametrize("name", MACHINES)
def test_the_agent_reads_back_the_matrix_nvidia_smi_printed(name):
    document = matrix(name)
    read = read_back(name)
    assert read["links"] == document["links"]
    # A NUMA node the output does not give is read from sysfs as -1 on such a machine.
    assert read["numa"] == [-1 if node is None else node for node in document["numa"]]
    heartbeat = validate_heartbeat({"node": "gpu01", "inventory": {"gpu_topology": read}})
    assert heartbeat["inventory"]["gpu_topology"] == read


def test_dgx1_hybrid_cube_mesh_reads_as_nv1_and_nv2():
    links = matrix("dgx1-v100")["links"]
    assert links[0] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert sorted(int(cell[2:]) for cell in links[0] if cell.startswith("NV")) == [1, 1, 2, 2]  # six links


def test_dgx1_pair_takes_two_nvlinks_not_one():
    wiring = topology_of(read_back("dgx1-v100"))
    # GPU 0's NV2 peer before its NV1 peers, though 0,1 are the lowest indices.
    assert gpus_pick(tuple(range(8)), 2, wiring) == (0, 3)
    assert gpus_pick((0, 1, 2), 2, wiring) == (1, 2)
    assert gpus_pick(tuple(range(8)), 2, wiring, "nvlink-all") == (0, 3)


def test_dgx1_quad_is_one_all_nvlink_board_half_and_its_numa_is_unknown():
    wiring = topology_of(read_back("dgx1-v100"))
    gpus = gpus_pick(tuple(range(8)), 4, wiring, "nvlink-all")
    assert gpus == (0, 1, 2, 3)
    assert pick_words(wiring, gpus) == "GPUs 0-3, NVLink-complete"
    assert gpus_pick(tuple(range(8)), 2, wiring, "same-numa") is None
    assert refusal("same-numa", 2, tuple(range(8)), wiring) == (
        "topology: no 2 free GPUs on one NUMA node (free: 0-7; NUMA node unknown for 0-7, reported as -1)"
    )


def test_hgx_a100_keeps_a_shard_on_one_socket():
    wiring = topology_of(read_back("hgx-a100-p4d"))
    assert gpus_pick(tuple(range(8)), 4, wiring) == (0, 1, 2, 3)
    assert gpus_pick((2, 3, 4, 5, 6, 7), 4, wiring, "same-numa") == (4, 5, 6, 7)
    assert pick_words(wiring, (4, 5, 6, 7)) == "GPUs 4-7, NVLink-complete"


def test_hgx_h100_reads_as_eighteen_nvlinks_a_pair_and_keeps_a_shard_on_one_socket():
    read = read_back("hgx-h100")
    assert read["links"][0] == ["X"] + ["NV18"] * 7
    assert read["numa"] == [0, 0, 0, 0, 1, 1, 1, 1]
    wiring = topology_of(read)
    assert gpus_pick((3, 4, 5, 6, 7), 4, wiring) == (4, 5, 6, 7)
    assert gpus_pick((2, 3, 4, 5, 6, 7), 3, wiring, "same-numa") == (4, 5, 6)
    assert pick_words(wiring, (4, 5, 6, 7)) == "GPUs 4-7, NVLink-complete"
    assert refusal("same-numa", 5, tuple(range(8)), wiring) == "topology: no 5 free GPUs on one NUMA node (free: 0-7)"


def test_pcie_box_without_nvlink_is_one_numa_node_and_never_nvlink():
    wiring = topology_of(read_back("pcie-l40s-g6e"))
    assert gpus_pick((0, 1, 2, 3), 2, wiring) == (0, 1)
    assert pick_words(wiring, (0, 1)) == "GPUs 0,1, one NUMA node"
    assert gpus_pick((0, 1, 2, 3), 2, wiring, "nvlink-all") is None
    assert gpus_pick((1, 2, 3), 3, wiring, "same-numa") == (1, 2, 3)
