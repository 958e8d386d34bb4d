"""`nvidia-smi topo -m` matrices of real machines (tests/fixtures/topology/): read into the `gpu_topology`
a heartbeat carries, and a fake NVML scripted to wire its GPUs so, for the agent's reader to read back.

A matrix names NVLinks by count (NV#) and PCIe paths by how far apart (PIX … SYS). The fake gives each
GPU a bus id and, per pair, its NVLinks as direct links to the peer GPU (a DGX-1's hybrid cube-mesh, an
NVLink bridge) or, where every pair of three or more GPUs has the same NV# (an NVSwitch board), as that
many links to switches; the PCIe path of a pair without NVLink is its common ancestor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pynvml

from tests.fakes.fake_nvml import FakeGpu, FakeNvml, fake_nvml

MATRICES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
ANCESTORS = {
    "PIX": pynvml.NVML_TOPOLOGY_SINGLE,
    "PXB": pynvml.NVML_TOPOLOGY_MULTIPLE,
    "PHB": pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    "NODE": pynvml.NVML_TOPOLOGY_NODE,
    "SYS": pynvml.NVML_TOPOLOGY_SYSTEM,
}
_NV = re.compile(r"NV(\d+)")


def matrix(name: str) -> dict[str, list]:
    """The machine's matrix as a heartbeat's ``gpu_topology``: GPU rows and columns only (NICs left out),
    each GPU's NUMA node from the ``NUMA Affinity`` column (None where the output has none or says N/A)."""
    lines = [line for line in (MATRICES / f"{name}.txt").read_text().splitlines() if line.strip()]
    header = lines[0].split()
    devices = header[: header.index("CPU")]
    gpus = [d for d in devices if d.startswith("GPU")]
    has_numa = "NUMA" in header
    links, numa = [], []
    for line in lines[1:]:
        cells = line.split()
        if not cells[0].startswith("GPU"):
            continue
        links.append(cells[1 : 1 + len(gpus)])
        after = cells[1 + len(devices) :]  # CPU affinity, then NUMA affinity where the output has it
        node = after[1] if has_numa and len(after) > 1 else None
        numa.append(int(node) if node is not None and node.lstrip("-").isdigit() else None)
    return {"links": links, "numa": numa}


def bus_id(index: int) -> str:
    return f"00000000:{0x10 + index:02X}:00.0"


def scripted_nvml(name: str) -> FakeNvml:
    """A fake NVML whose GPUs are wired as the machine's matrix says."""
    document = matrix(name)
    rows = document["links"]
    size = len(rows)
    off_diagonal = {rows[i][j] for i in range(size) for j in range(size) if i != j}
    switched = size > 2 and len(off_diagonal) == 1 and _NV.fullmatch(next(iter(off_diagonal))) is not None
    gpus = [FakeGpu(uuid=f"GPU-{name}-{i}", pci_bus_id=bus_id(i)) for i in range(size)]
    for i, gpu in enumerate(gpus):
        nvlinks: list[Any] = []
        if switched:
            count = int(_NV.fullmatch(next(iter(off_diagonal))).group(1))  # type: ignore[union-attr]
            nvlinks = [("00000000:05:00.0", pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)] * count
        else:
            for j in range(size):
                found = _NV.fullmatch(rows[i][j]) if i != j else None
                if found:
                    nvlinks += [(bus_id(j), pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)] * int(found.group(1))
        gpu.nvlinks = nvlinks
    nvml = fake_nvml(gpus)
    for i in range(size):
        for j in range(i + 1, size):
            if rows[i][j] in ANCESTORS:
                nvml.common_ancestors[frozenset((gpus[i].uuid, gpus[j].uuid))] = ANCESTORS[rows[i][j]]
    return nvml


def numa_by_bus(name: str) -> dict[str, int | None]:
    """Each GPU's NUMA node by its sysfs bus id, as the agent reads it from /sys (-1 where unknown)."""
    nodes = matrix(name)["numa"]
    return {f"0000:{0x10 + i:02x}:00.0": (-1 if node is None else node) for i, node in enumerate(nodes)}
