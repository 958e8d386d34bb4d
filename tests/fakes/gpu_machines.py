"""Fake NVML answers for three GPU machines whose sysfs trees are under tests/fixtures/sys/.

Each builder gives the fake `pynvml` of one machine: its cards, their PCI bus ids, their NVLinks and the
PCIe common ancestor of every pair, laid out as `nvidia-smi topo -m` shows such machines:

hgx-h100            8 × H100 SXM on an HGX board: every GPU's 18 NVLinks go to the board's four NVSwitches
                    (5 + 4 + 4 + 5), so every pair is NV18; each GPU under a PCIe switch of its own, four a
                    socket (NODE within one, SYS across). NUMA 0,0,0,0,1,1,1,1.
pcie-nvlink-pairs   8 × RTX A6000 (PCIe) with NVLink bridges on (0,1), (2,3), (4,5), (6,7) (NV4). Socket 0: the
                    four under one PCIe switch (PIX); socket 1: two switches on root ports of their own (NODE
                    between them); SYS across sockets. NUMA 0 × 4, 1 × 4.
pcie-4gpu           4 × L40S, no NVLink, one socket: two switch trees of two cards each (PXB within a tree),
                    both under one host bridge (PHB across them). numa_node -1: the platform has one node.
"""

from __future__ import annotations

import pynvml

from tests.fakes.fake_nvml import FakeGpu, FakeNvml, fake_nvml, h100_sxm, l40s

RTX_A6000_NAME = "NVIDIA RTX A6000"
RTX_A6000_MEMORY_BYTES = 49140 * 1024 * 1024

SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
PIX = pynvml.NVML_TOPOLOGY_SINGLE
PXB = pynvml.NVML_TOPOLOGY_MULTIPLE
PHB = pynvml.NVML_TOPOLOGY_HOSTBRIDGE
NODE = pynvml.NVML_TOPOLOGY_NODE
SYS = pynvml.NVML_TOPOLOGY_SYSTEM

HGX_H100_BUS_IDS = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")
HGX_NVSWITCH_BUS_IDS = ("00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0")
HGX_LINKS_PER_SWITCH = (5, 4, 4, 5)
A6000_BUS_IDS = ("1A", "1B", "1C", "1D", "88", "89", "B1", "B2")
L40S_BUS_IDS = ("03", "04", "83", "84")


def _bus(bus: str) -> str:
    return f"00000000:{bus}:00.0"  # as NVML writes it: an 8-digit domain, upper case


def _pairs(nvml: FakeNvml, level_of) -> None:
    gpus = nvml.gpus
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            nvml.common_ancestors[frozenset((gpus[i].uuid, gpus[j].uuid))] = level_of(i, j)


def hgx_h100() -> FakeNvml:
    """An HGX H100 8-GPU board (tree: hgx-h100)."""
    gpus = []
    for index, bus in enumerate(HGX_H100_BUS_IDS):
        gpu = h100_sxm(index)
        gpu.pci_bus_id = _bus(bus)
        gpu.nvlinks = [
            (switch, SWITCH)
            for switch, count in zip(HGX_NVSWITCH_BUS_IDS, HGX_LINKS_PER_SWITCH, strict=True)
            for _ in range(count)
        ]
        gpus.append(gpu)
    nvml = fake_nvml(gpus)
    _pairs(nvml, lambda i, j: NODE if i // 4 == j // 4 else SYS)
    return nvml


def rtx_a6000(index: int) -> FakeGpu:
    """An RTX A6000: 48 GB GDDR6 (no memory temperature), a 300 W limit, four NVLinks for a bridge."""
    return FakeGpu(
        uuid=f"GPU-a6000-{index:04d}",
        name=RTX_A6000_NAME,
        memory_total_bytes=RTX_A6000_MEMORY_BYTES,
        temperature=48,
        memory_temperature=None,
        slowdown_temperature=93,
        power_mw=121_000,
        power_limit_mw=300_000,
        default_power_limit_mw=300_000,
        power_limit_constraints_mw=(100_000, 300_000),
        max_sm_clock_mhz=2100,
    )


def pcie_nvlink_pairs() -> FakeNvml:
    """Eight PCIe A6000s over two sockets, bridged in pairs (tree: pcie-nvlink-pairs)."""
    gpus = [rtx_a6000(index) for index in range(8)]
    for gpu, bus in zip(gpus, A6000_BUS_IDS, strict=True):
        gpu.pci_bus_id = _bus(bus)
    for a in range(0, 8, 2):
        b = a + 1
        gpus[a].nvlinks = [(gpus[b].pci_bus_id, GPU)] * 4
        gpus[b].nvlinks = [(gpus[a].pci_bus_id, GPU)] * 4
    nvml = fake_nvml(gpus)

    def level(i: int, j: int) -> int:
        if i // 4 != j // 4:
            return SYS
        if i < 4 or i // 2 == j // 2:
            return PIX  # socket 0's one switch; each pair of socket 1 shares a switch
        return NODE

    _pairs(nvml, level)
    return nvml


def pcie_4gpu() -> FakeNvml:
    """Four PCIe L40S cards without NVLink in a one-socket box (tree: pcie-4gpu)."""
    gpus = [l40s(index) for index in range(4)]
    for gpu, bus in zip(gpus, L40S_BUS_IDS, strict=True):
        gpu.pci_bus_id = _bus(bus)
    nvml = fake_nvml(gpus)
    _pairs(nvml, lambda i, j: PXB if i // 2 == j // 2 else PHB)
    return nvml


MACHINES = {"hgx-h100": hgx_h100, "pcie-nvlink-pairs": pcie_nvlink_pairs, "pcie-4gpu": pcie_4gpu}


def reported_topology(name: str) -> dict:
    """The inventory's ``gpu_topology`` the agent reports on the fixture machine ``name`` (a heartbeat's)."""
    from agents.node.sensors import SensorReader
    from tests.fakes.fixture_trees import tree

    return SensorReader(sys_root=tree(name), nvml=MACHINES[name]()).inventory()["gpu_topology"]
