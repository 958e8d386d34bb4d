"""How a node's GPUs are wired to each other and to the CPUs: the matrix `nvidia-smi topo -m` prints.

For each pair of GPUs the closest link between them, in nvidia-smi's words: ``NV#`` (# NVLinks, direct
or through NVSwitches), else the PCIe path's common ancestor from
``nvmlDeviceGetTopologyCommonAncestor``: ``PIX`` (one PCIe switch; a dual-GPU board too), ``PXB``
(several switches), ``PHB`` (a host bridge), ``NODE`` (host bridges of one NUMA node), ``SYS`` (across
NUMA nodes, over the socket interconnect). And each GPU's NUMA node, from sysfs
(``sys/bus/pci/devices/<bus id>/numa_node`` under the sensor root; -1 where the kernel knows none — a VM,
a BIOS that does not say — which placement takes for unknown).

NVLink peers: each active link's remote PCI device (``nvmlDeviceGetNvLinkRemotePciInfo``) is a GPU of
this node (a bridge or a direct link: counted per peer) or an NVSwitch (``nvmlDeviceGetNvLinkRemoteDeviceType``
says so; where it cannot, a remote that is none of the node's GPUs is taken for a switch). GPUs that
both reach NVSwitches talk through them over as many links as the one with fewer has: NV18 for every
pair of an HGX H100 board.

A value NVML or sysfs cannot give is None, never a guess. Calls here may block on a hung GPU: they run
in the NVML worker thread (agents.node.sensors.SensorReader), under the same deadline as reads.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

# nvmlGpuTopologyLevel_t → nvidia-smi's words (INTERNAL: two GPUs of one board, shown as PIX too).
PCIE_LEVELS: tuple[tuple[str, str], ...] = (
    ("NVML_TOPOLOGY_INTERNAL", "PIX"),
    ("NVML_TOPOLOGY_SINGLE", "PIX"),
    ("NVML_TOPOLOGY_MULTIPLE", "PXB"),
    ("NVML_TOPOLOGY_HOSTBRIDGE", "PHB"),
    ("NVML_TOPOLOGY_NODE", "NODE"),
    ("NVML_TOPOLOGY_SYSTEM", "SYS"),
)
# NVLinks probed per GPU when the binding does not say (NVML_NVLINK_MAX_LINKS: 18 up to Hopper).
DEFAULT_MAX_LINKS = 18
_BUS_ID = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])")


def sysfs_bus_id(bus_id: Any) -> str | None:
    """NVML's PCI bus id (``00000000:1B:00.0``, str or bytes) as sysfs names it (``0000:1b:00.0``)."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", errors="replace")
    if not isinstance(bus_id, str):
        return None
    match = _BUS_ID.fullmatch(bus_id.strip().rstrip("\x00"))
    if match is None:
        return None
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def read_numa_node(root: str, bus_id: str, read_text: Callable[[str], str | None]) -> int | None:
    """The GPU's NUMA node from sysfs (-1: the kernel knows none), or None when the file says nothing."""
    text = read_text(f"{root.rstrip('/')}/sys/bus/pci/devices/{bus_id}/numa_node")
    if text is None:
        return None
    text = text.strip()
    try:
        node = int(text)
    except ValueError:
        return None
    return node if -1 <= node <= 1023 else None


class TopologyReader:
    """Reads the matrix and NUMA nodes of one NVML session's GPUs; called with ``_optional`` of the
    session, so errors that end a GPU or the session propagate and the others leave a value None."""

    def __init__(
        self, nvml: ModuleType, optional: Callable[[Callable[[], Any]], Any], session_errors: tuple[type, ...]
    ) -> None:
        self._nv = nvml
        self._optional = optional
        self._session_errors = session_errors
        self._levels = {
            getattr(nvml, name): word for name, word in PCIE_LEVELS if getattr(nvml, name, None) is not None
        }
        self._no_more_links = tuple(
            cls
            for cls in (
                getattr(nvml, "NVMLError_NotSupported", None),  # no NVLink on this GPU
                getattr(nvml, "NVMLError_InvalidArgument", None),  # past the GPU's last link
            )
            if cls is not None
        )

    def read(self, handles: Sequence[Any], numa_node: Callable[[str], int | None]) -> dict[str, list]:
        """``{"links": n×n matrix, "numa": n nodes}`` for the GPUs at indexes 0..n-1 (a handle of None:
        a GPU NVML could not open, whose row and column are None)."""
        count = len(handles)
        bus_ids = [self._bus_id(h) if h is not None else None for h in handles]
        index_of_bus = {bus: i for i, bus in enumerate(bus_ids) if bus is not None}
        peers: list[dict[int, int]] = []
        switch_links: list[int] = []
        for h in handles:
            direct, switched = self._nvlinks(h, index_of_bus) if h is not None else ({}, 0)
            peers.append(direct)
            switch_links.append(switched)
        links: list[list[str | None]] = [[None] * count for _ in range(count)]
        for i in range(count):
            links[i][i] = "X"
            for j in range(i + 1, count):
                if handles[i] is None or handles[j] is None:
                    continue
                nvlinks = max(peers[i].get(j, 0), peers[j].get(i, 0))
                if switch_links[i] and switch_links[j]:
                    nvlinks = max(nvlinks, min(switch_links[i], switch_links[j]))
                link = f"NV{nvlinks}" if nvlinks else self._pcie(handles[i], handles[j])
                links[i][j] = links[j][i] = link
        numa = [numa_node(bus) if bus is not None else None for bus in bus_ids]
        return {"links": links, "numa": numa}

    def _bus_id(self, handle: Any) -> str | None:
        info = self._optional(lambda: self._nv.nvmlDeviceGetPciInfo(handle))
        return sysfs_bus_id(getattr(info, "busId", None)) if info is not None else None

    def _pcie(self, a: Any, b: Any) -> str | None:
        level = self._optional(lambda: self._nv.nvmlDeviceGetTopologyCommonAncestor(a, b))
        return self._levels.get(level) if level is not None else None

    def _nvlinks(self, handle: Any, index_of_bus: dict[str, int]) -> tuple[dict[int, int], int]:
        """Active links of one GPU: counted per peer GPU (by index), and the number that reach switches."""
        nv = self._nv
        peers: dict[int, int] = {}
        switched = 0
        switch_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        gpu_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", DEFAULT_MAX_LINKS)):
            try:
                state = nv.nvmlDeviceGetNvLinkState(handle, link)
            except self._session_errors:
                raise
            except self._no_more_links:
                break
            except nv.NVMLError:
                continue  # this one link cannot be read; the next may
            if state != getattr(nv, "NVML_FEATURE_ENABLED", 1):
                continue
            remote = self._optional(lambda link=link: nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
            bus = sysfs_bus_id(getattr(remote, "busId", None)) if remote is not None else None
            kind = self._remote_type(handle, link)
            if kind == switch_type or (kind is None and bus is not None and bus not in index_of_bus):
                switched += 1
            elif bus in index_of_bus and kind in (None, gpu_type):
                peer = index_of_bus[bus]
                peers[peer] = peers.get(peer, 0) + 1
        return peers, switched

    def _remote_type(self, handle: Any, link: int) -> int | None:
        getter = getattr(self._nv, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        if getter is None:
            return None
        return self._optional(lambda: getter(handle, link))

