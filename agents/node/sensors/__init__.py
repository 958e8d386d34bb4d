"""The node agent's sensors: what a GPU node is made of and what its sensors read now.

``SensorReader`` is the one entry point. It reads GPUs through NVML, CPU and inlet
temperatures from hwmon, CPU package power from RAPL, and the node's cores, memory and name,
all under a root directory so fixture trees of real machines can stand in for ``/``.
A sensor the machine lacks, or a read that fails, is left out — never reported as 0 or null.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from agents.node.protocol import GPU_CAPPING_SENSOR_KEYS, GPU_INVENTORY_KEYS, GPU_SENSOR_KEYS, Capping
from agents.node.sensors import host, hwmon, topology
from agents.node.sensors.nvml import THROTTLE_REASONS, NvmlSession, dropped_text
from agents.node.sensors.rapl import PackagePower

__all__ = ["THROTTLE_REASONS", "SensorReader", "read_file_once"]

log = logging.getLogger(__name__)

# sysfs attributes are at most a page and /proc/meminfo a few KiB; one read is enough, and a
# second could loop forever on drivers that answer EAGAIN.
_READ_BYTES = 65536


def read_file_once(path: str) -> str:
    """Read a sysfs or procfs file with one ``os.read`` on an ``os.open`` descriptor.

    Raises OSError (EACCES, ENODATA, EIO, ENOENT...) for the caller to treat as absent.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, _READ_BYTES)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


class SensorReader:
    """Reads one node's inventory and sensors. One NVML session for its life."""

    def __init__(
        self,
        sys_root: str = "/",
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
        nvml_deadline_seconds: float = 3.0,
        read_file: Callable[[str], str] | None = None,
    ) -> None:
        """sys_root holds ``sys/`` and ``proc/``; nvml=None imports the real ``pynvml``;
        read_file is the single place file reads go through (tests inject errors there)."""
        self._root = sys_root
        self._read_file = read_file or read_file_once
        self._deadline = nvml_deadline_seconds
        self._cpu_power = PackagePower(sys_root, self._read_text, clock)
        self._nvml = NvmlSession(nvml) if nvml is not None else _real_nvml_session()
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()
        self._said_dropped: dict[str, tuple[str, ...]] = {}  # by inventory/reading and GPU uuid: last logged

    def inventory(self) -> dict[str, Any]:
        """The node's GPUs (index, uuid, name, memory_gib, power_limit_watts) and how they are wired
        (``gpu_topology``: agents.node.sensors.topology), cores, memory, name.

        ``gpus`` is left out when NVML did not answer within the deadline: an empty list
        would say the node has no GPUs.
        """
        found: dict[str, Any] = {}
        polled = self._poll_nvml(
            lambda session: (session.inventory(), session.topology(self._numa_node)), absent=([], None)
        )
        if polled is not None:
            gpus, topology = polled
            found["gpus"] = self._carried("inventory", gpus, GPU_INVENTORY_KEYS)
            if gpus and topology is not None:
                found["gpu_topology"] = topology
        for key, getter in (
            ("cpu_cores", host.cpu_cores),
            ("memory_gib", host.memory_gib),
            ("hostname", host.hostname),
        ):
            value = self._guarded(key, lambda getter=getter: getter(self._root, self._read_text))
            if value is not None:
                found[key] = value
        return found

    def read(self) -> dict[str, Any]:
        """The sensors now: per-GPU readings and the node's CPU and inlet temperatures, CPU power.

        Never raises on a bad reading; a missing or failed value is an absent key.
        """
        gpus = self._poll_nvml(lambda session: session.readings()) or []
        sensors: dict[str, Any] = {"gpus": self._carried("reading", gpus, GPU_SENSOR_KEYS | GPU_CAPPING_SENSOR_KEYS)}
        temperatures = self._guarded("hwmon", lambda: hwmon.read_temperatures(self._root, self._read_text))
        if temperatures is not None:
            if temperatures.cpu_celsius is not None:
                sensors["cpu_temperature_celsius"] = temperatures.cpu_celsius
            if temperatures.inlet_celsius is not None:
                sensors["inlet_temperature_celsius"] = temperatures.inlet_celsius
        watts = self._guarded("rapl", self._cpu_power.read_watts)
        if watts is not None:
            sensors["cpu_power_watts"] = round(watts, 1)
        return sensors

    def apply_capping(self, capping: Capping | None) -> bool:
        """Apply the heartbeat answer's capping block in the NVML worker, under the reads' deadline.

        False when NVML did not finish in time (or is busy with a stuck call): the next answer tries again.
        """
        return self._poll_nvml(lambda session: session.apply_capping(capping) or True) is True

    def close(self) -> None:
        """End the NVML session (skipped while a call is stuck: shutting down would block too)."""
        self._poll_nvml(lambda session: session.close())

    # -- internals ---------------------------------------------------------------------------

    def _carried(self, what: str, gpus: list[dict[str, Any]], keys: frozenset[str]) -> list[dict[str, Any]]:
        """The GPUs as the heartbeat carries them: each value NVML could not give logged once (``dropped``),
        and only the keys the control plane's protocol takes (a key this agent reads before the protocol
        names it is left out, not sent to get the whole heartbeat refused)."""
        for gpu in gpus:
            dropped = tuple(dropped_text(entry) for entry in gpu.get("dropped") or ())
            said = f"{what} {gpu.get('uuid')}"
            if dropped and self._said_dropped.get(said) != dropped:
                log.warning("GPU %s %s: %s", gpu.get("index"), what, "; ".join(dropped))
            self._said_dropped[said] = dropped
        return [{key: value for key, value in gpu.items() if key in keys} for gpu in gpus]

    def _numa_node(self, bus_id: str) -> int | None:
        return topology.read_numa_node(self._root, bus_id, self._read_text)

    def _read_text(self, path: str) -> str | None:
        try:
            return self._read_file(path)
        except (OSError, UnicodeDecodeError):
            return None

    def _guarded(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception:
            # A reader bug must not stop the heartbeat; the value is simply absent.
            log.exception("reading %s failed", what)
            return None

    def _poll_nvml(self, call: Callable[[NvmlSession], Any], absent: Any = None) -> Any:
        """Run an NVML call in a worker thread; None when it fails or passes the deadline, ``absent``
        (no GPUs: an empty list unless given) when the machine has no NVML at all."""
        session = self._nvml
        if session is None:
            return [] if absent is None else absent
        with self._worker_lock:
            if self._worker is not None and self._worker.is_alive():
                # The previous call is still stuck in the driver: do not pile up threads on it.
                log.warning("NVML still blocked from an earlier call, no GPU values")
                return None
            answer: dict[str, Any] = {}

            def work() -> None:
                try:
                    answer["value"] = call(session)
                except Exception:
                    log.exception("NVML poll failed")

            worker = threading.Thread(target=work, name="llmgw-nvml", daemon=True)
            self._worker = worker
            worker.start()
        worker.join(self._deadline)
        if worker.is_alive():
            log.warning("NVML did not answer within %.1f s, no GPU values this time", self._deadline)
            return None
        return answer.get("value")


def _real_nvml_session() -> NvmlSession | None:
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        log.info("pynvml is not installed (nvidia-ml-py), no GPU values")
        return None
    if not hasattr(module, "nvmlInit"):
        # The deprecated `pynvml` package (<12) ships a package shadowing the real module.
        log.warning("the installed pynvml has no nvmlInit; install nvidia-ml-py")
        return None
    return NvmlSession(module)
