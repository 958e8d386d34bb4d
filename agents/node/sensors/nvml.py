"""GPU inventory and readings through NVML (the ``pynvml`` module of nvidia-ml-py).

One NVML session is kept for the agent's life and opened again after the errors that end it
(Uninitialized, GpuIsLost, LibRmVersionMismatch). A GPU that fails is left out; a field the
GPU does not support is left out of that GPU's reading. Nothing here reports 0 for unknown.
A value no card can have — NVML's "not available" answer (an unsigned field all ones: 0xFFFFFFFF mW
reads 4,294,967 W), a temperature outside -40…150 °C, a power beyond any card's — is dropped here, at
the source, and named in the GPU's ``dropped`` list (each ``{"reading", "value", "why"}``, as the heartbeat
carries it: the control plane flags the node for it), so one bad field never costs the heartbeat.
Calls here may block in the kernel on a hung GPU: the caller runs them in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from agents.node.capping import Capping, GpuCapper
from agents.node.protocol import GPU_WATTS_MAX
from agents.node.sensors.topology import TopologyReader

log = logging.getLogger(__name__)

_BYTES_PER_GIB = 1024**3
MIN_CELSIUS = -40.0
MAX_CELSIUS = 150.0
# NVML's "not available" answers (NVML_VALUE_NOT_AVAILABLE_uint / _ulonglong): all ones in the field.
NOT_AVAILABLE = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)

# Clock event reason bits (nvmlClocksEventReason*); the other bits (idle, application clocks,
# sync boost, display) are not limits a facility cares about.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "power_brake"),
)


class SessionLost(Exception):
    """NVML's state is gone: stop this poll and initialise again next time."""


class NvmlSession:
    """One NVML session: init once, poll GPUs, re-init after the errors that end a session."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nv = nvml
        self._initialised = False
        self._needs_reinit = False
        self._unavailable: str | None = None
        # The errors after which the session must be opened again (classes, never a set:
        # NVMLError instances are unhashable and these classes are compared by identity).
        self._session_errors = tuple(
            cls
            for cls in (
                getattr(nvml, "NVMLError_Uninitialized", None),
                getattr(nvml, "NVMLError_GpuIsLost", None),
                getattr(nvml, "NVMLError_LibRmVersionMismatch", None),
            )
            if cls is not None
        )
        self._capper = GpuCapper(nvml, self._session_errors)
        self._topology = TopologyReader(nvml, self._optional, self._session_errors)
        # The topology of the GPUs last read, by their uuids: links do not change while a node runs, and
        # reading them is some 300 NVML calls on an 8-GPU board.
        self._topology_of: tuple[tuple[str | None, ...], dict[str, list]] | None = None

    def inventory(self) -> list[dict[str, Any]]:
        """Each GPU's index, uuid, name, memory, enforced power limit and the range a limit may be set in
        (``power_limit_min_watts``, ``power_limit_max_watts``), and ``dropped``: what NVML gave that no card has."""
        return self._each_gpu(self._gpu_inventory)

    def readings(self) -> list[dict[str, Any]]:
        """Each GPU's temperatures, power, power limit and active clock limiters, and ``dropped``: what NVML
        gave that no card has."""
        return self._each_gpu(self._gpu_reading)

    def topology(self, numa_node: Callable[[str], int | None]) -> dict[str, list] | None:
        """The GPUs' links (the matrix of `nvidia-smi topo -m`) and NUMA nodes, indexed like the
        inventory's GPUs (agents.node.sensors.topology); None without NVML or GPUs, or when it failed.
        ``numa_node(bus_id)`` reads a GPU's NUMA node."""
        if not self._open():
            return None
        nv = self._nv
        try:
            handles: list[Any] = []
            for index in range(nv.nvmlDeviceGetCount()):
                try:
                    handles.append(nv.nvmlDeviceGetHandleByIndex(index))
                except self._session_errors:
                    raise
                except nv.NVMLError as exc:
                    log.warning("GPU %d left out of the topology: %s", index, exc)
                    handles.append(None)
            if not handles:
                return None
            key = tuple(
                self._optional(lambda h=h: nv.nvmlDeviceGetUUID(h)) if h is not None else None for h in handles
            )
            if self._topology_of is not None and self._topology_of[0] == key:
                return self._topology_of[1]
            topology = self._topology.read(handles, numa_node)
            # Kept only whole: a link that failed to read this time is asked again next time.
            if None not in key and all(None not in row for row in topology["links"]):
                self._topology_of = (key, topology)
            return topology
        except self._session_errors as exc:
            self._lost(exc)
            return None
        except nv.NVMLError as exc:
            log.warning("GPU topology not read: %s", exc)
            return None

    def apply_capping(self, capping: Capping | None) -> None:
        """Hold each GPU at what the capping block asks (agents.node.capping); defaults when None."""

        def one(handle: Any, index: int) -> dict[str, Any]:
            self._capper.apply(handle, self._nv.nvmlDeviceGetUUID(handle), capping)
            return {}

        self._each_gpu(one)

    def close(self) -> None:
        """End the session (nvmlShutdown pairs the nvmlInit)."""
        if self._initialised:
            self._initialised = False
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)

    # -- session ---------------------------------------------------------------------------

    def _open(self) -> bool:
        if self._needs_reinit:
            self.close()
            self._needs_reinit = False
            self._topology_of = None  # read again: a GPU may have gone or come back
        if self._initialised:
            return True
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:
            reason = str(exc)
            if reason != self._unavailable:
                # Said once per cause: a node without a driver polls every interval.
                log.info("NVML unavailable, no GPU values: %s", reason)
            self._unavailable = reason
            return False
        if self._unavailable is not None:
            log.info("NVML available again")
        self._unavailable = None
        self._initialised = True
        return True

    def _each_gpu(self, one: Callable[[Any, int], dict[str, Any]]) -> list[dict[str, Any]]:
        if not self._open():
            return []
        nv = self._nv
        try:
            count = nv.nvmlDeviceGetCount()
        except self._session_errors as exc:
            self._lost(exc)
            return []
        except nv.NVMLError as exc:
            log.warning("NVML device count failed: %s", exc)
            return []
        gpus: list[dict[str, Any]] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                gpus.append(one(handle, index))
            except nv.NVMLError_GpuIsLost as exc:
                # Only this GPU is gone; the others are still worth reporting.
                log.warning("GPU %d is lost: %s", index, exc)
                self._needs_reinit = True
            except self._session_errors as exc:
                self._lost(exc)
                return gpus
            except nv.NVMLError as exc:
                log.warning("GPU %d left out: %s", index, exc)
        return gpus

    def _lost(self, exc: Exception) -> None:
        log.warning("NVML session lost, re-initialising on the next read: %s", exc)
        self._needs_reinit = True

    # -- one GPU -----------------------------------------------------------------------------

    def _gpu_inventory(self, handle: Any, index: int) -> dict[str, Any]:
        nv = self._nv
        gpu: dict[str, Any] = {"index": index, "uuid": nv.nvmlDeviceGetUUID(handle)}
        dropped: list[dict[str, Any]] = []
        name = self._optional(lambda: nv.nvmlDeviceGetName(handle))
        if name:
            gpu["name"] = name
        memory = self._optional(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        if memory is not None and memory.total > 0 and memory.total not in NOT_AVAILABLE:
            gpu["memory_gib"] = round(memory.total / _BYTES_PER_GIB, 1)
        _watts(gpu, "power_limit_watts", self._optional(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle)), dropped)
        # The range a power limit may be set in: what capping can ask of this card.
        constraints = self._optional(lambda: nv.nvmlDeviceGetPowerManagementLimitConstraints(handle))
        if isinstance(constraints, list | tuple) and len(constraints) == 2:
            bounds: dict[str, Any] = {}
            _watts(bounds, "power_limit_min_watts", constraints[0], dropped)
            _watts(bounds, "power_limit_max_watts", constraints[1], dropped)
            if len(bounds) == 2 and bounds["power_limit_min_watts"] > bounds["power_limit_max_watts"]:
                low, high = bounds["power_limit_min_watts"], bounds["power_limit_max_watts"]
                dropped.append(_dropped("power_limit_min_watts", low, f"{low:g} W above the maximum's {high:g} W is no range"))
            elif len(bounds) == 2:  # half a range says nothing of where a limit may be set
                gpu.update(bounds)
        if dropped:
            gpu["dropped"] = dropped
        return gpu

    def _gpu_reading(self, handle: Any, index: int) -> dict[str, Any]:
        nv = self._nv
        gpu: dict[str, Any] = {"uuid": nv.nvmlDeviceGetUUID(handle), "index": index}
        dropped: list[dict[str, Any]] = []
        _celsius(gpu, "temperature_celsius", self._optional(lambda: self._temperature(handle)), dropped)
        _celsius(gpu, "memory_temperature_celsius", self._optional(lambda: self._memory_temperature(handle)), dropped)
        # Where the card starts slowing its clocks for heat: the margin to it is what a warm domain is judged by.
        slowdown = self._optional(
            lambda: nv.nvmlDeviceGetTemperatureThreshold(handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        )
        if slowdown != 0:  # 0: a card that has no such threshold
            _celsius(gpu, "slowdown_temperature_celsius", slowdown, dropped)
        _watts(gpu, "power_watts", self._optional(lambda: nv.nvmlDeviceGetPowerUsage(handle)), dropped)
        _watts(gpu, "power_limit_watts", self._optional(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle)), dropped)
        reasons = self._optional(lambda: self._clock_event_reasons(handle))
        if reasons is not None and reasons not in NOT_AVAILABLE:
            gpu["throttle_reasons"] = [name for bit, name in THROTTLE_REASONS if reasons & bit]
        self._capper.report(handle, gpu["uuid"], gpu)
        for key in ("enforced_power_limit_watts", "default_power_limit_watts"):  # the capper's, read the same way
            if key in gpu:
                _watts(gpu, key, round(gpu.pop(key) * 1000), dropped)
        if dropped:
            gpu["dropped"] = dropped
        return gpu

    def _optional(self, call: Callable[[], Any]) -> Any:
        """The call's answer, or None when NVML cannot give this one value.

        Errors that end the GPU or the session propagate to the loop over GPUs.
        """
        try:
            return call()
        except self._session_errors:
            raise
        except self._nv.NVMLError as exc:
            log.debug("NVML value unavailable: %s", exc)
            return None

    def _temperature(self, handle: Any) -> int:
        nv = self._nv
        getter = getattr(nv, "nvmlDeviceGetTemperatureV", None)
        if getter is not None:
            older_driver = tuple(
                cls
                for cls in (
                    getattr(nv, "NVMLError_FunctionNotFound", None),
                    getattr(nv, "NVMLError_ArgumentVersionMismatch", None),
                )
                if cls is not None
            )
            try:
                return getter(handle, nv.NVML_TEMPERATURE_GPU)
            except older_driver:
                pass  # an older driver: the deprecated call below has the same answer
        return nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)

    def _memory_temperature(self, handle: Any) -> float | None:
        nv = self._nv
        values = nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_MEMORY_TEMP])
        value = values[0]
        # The call succeeds even when the field failed (GDDR boards say Not Supported here):
        # the field's own return code decides, or we would report 0.
        if value.nvmlReturn != nv.NVML_SUCCESS:
            return None
        return _field_number(nv, value)

    def _clock_event_reasons(self, handle: Any) -> int:
        nv = self._nv
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is not None:
            try:
                return getter(handle)
            except nv.NVMLError_FunctionNotFound:
                pass  # older driver: the deprecated name reports the same bits
        return nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


def _field_number(nv: ModuleType, value: Any) -> float | None:
    kinds = {
        nv.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nv.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }
    attribute = kinds.get(value.valueType)
    return float(getattr(value.value, attribute)) if attribute else None


def _shown(value: Any) -> str:
    return f"0x{value:X}" if value in NOT_AVAILABLE else f"{value:g}"


def _dropped(reading: str, value: float, why: str) -> dict[str, Any]:
    """A value dropped at the source, as a GPU's ``dropped`` carries it (agents.node.protocol.DROPPED_KEYS)."""
    return {"reading": reading, "value": value, "why": why}


def dropped_text(entry: dict[str, Any]) -> str:
    """A dropped value in one line, as the agent's log says it."""
    return f"{entry.get('reading')}: {entry.get('why')}; dropped"


def _celsius(gpu: dict[str, Any], key: str, value: Any, dropped: list[dict[str, Any]]) -> None:
    """``gpu[key]``, the temperature NVML answered (°C), unless it is none a card can have: then named in ``dropped``."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    if value in NOT_AVAILABLE:
        dropped.append(_dropped(key, value, f"{_shown(value)}, NVML's not-available value"))
    elif not MIN_CELSIUS <= value <= MAX_CELSIUS:
        dropped.append(_dropped(key, value, f"{value:g} °C is outside {MIN_CELSIUS:g}…{MAX_CELSIUS:g} °C"))
    else:
        gpu[key] = float(value)


def _watts(gpu: dict[str, Any], key: str, milliwatts: Any, dropped: list[dict[str, Any]]) -> None:
    """``gpu[key]`` in W from NVML's milliwatts, unless it is none a card can have: then named in ``dropped``.
    0 (a limit NVML does not know) is left out unsaid."""
    if milliwatts is None or isinstance(milliwatts, bool) or not isinstance(milliwatts, int | float):
        return
    if milliwatts in NOT_AVAILABLE:
        dropped.append(_dropped(key, milliwatts / 1000, f"{_shown(milliwatts)} mW, NVML's not-available value"))
    elif milliwatts < 0:
        dropped.append(_dropped(key, milliwatts / 1000, f"{milliwatts / 1000:g} W is below 0 W"))
    elif milliwatts > GPU_WATTS_MAX * 1000:
        watts = milliwatts / 1000
        dropped.append(_dropped(key, watts, f"{watts:g} W is more than any card draws ({GPU_WATTS_MAX:g} W)"))
    elif milliwatts > 0 or key == "power_watts":
        gpu[key] = milliwatts / 1000.0
