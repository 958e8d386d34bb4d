"""A fake ``pynvml`` module for tests: the real constants and error classes, scripted answers.

nvidia-ml-py imports without a driver, so the constants, the ``NVMLError_*`` classes and the
field value structure are taken from the installed binding; only the calls are fake. Each
``FakeGpu`` answers like one device and can be told to fail (a code per call, a lost GPU, a
call that hangs until released).
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass, field
from typing import Any

import pynvml

H100_SXM_NAME = "NVIDIA H100 80GB HBM3"
H100_SXM_MEMORY_BYTES = 81559 * 1024 * 1024  # what nvidia-smi shows as 81559 MiB
L4_NAME = "NVIDIA L4"
L4_MEMORY_BYTES = 23034 * 1024 * 1024
A100_SXM_NAME = "NVIDIA A100-SXM4-80GB"
A100_SXM_MEMORY_BYTES = 81920 * 1024 * 1024
L40S_NAME = "NVIDIA L40S"
L40S_MEMORY_BYTES = 46068 * 1024 * 1024

# Each card's top SM clock, as nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_SM) answers it (MHz).
H100_SXM_MAX_SM_CLOCK_MHZ = 1980
A100_SXM_MAX_SM_CLOCK_MHZ = 1410
L40S_MAX_SM_CLOCK_MHZ = 2520
L4_MAX_SM_CLOCK_MHZ = 2040

# Longest a hung call blocks before giving up, so a test that forgets to release it ends.
HANG_LIMIT_SECONDS = 30.0


@dataclass
class FakeGpu:
    """One scripted device: what it answers, and how it fails."""

    uuid: str
    name: str = H100_SXM_NAME
    memory_total_bytes: int = H100_SXM_MEMORY_BYTES
    temperature: int = 54
    memory_temperature: int | None = 61  # None: the field answers Not Supported (GDDR boards)
    slowdown_temperature: int | None = 89  # None: the threshold answers Not Supported
    power_mw: int = 312_500
    power_limit_mw: int = 700_000  # the limit set (nvmlDeviceGetPowerManagementLimit)
    default_power_limit_mw: int = 700_000
    power_limit_constraints_mw: tuple[int, int] = (200_000, 700_000)
    other_limiter_mw: int | None = None  # a lower limit from elsewhere (out of band): enforced is the least
    max_sm_clock_mhz: int | None = H100_SXM_MAX_SM_CLOCK_MHZ  # None: the call answers Not Supported
    locked_clocks_mhz: tuple[int, int] | None = None
    privileged: bool = True  # False: every set and reset answers No Permission, as for a non-root agent
    set_calls: list[tuple[str, Any]] = field(default_factory=list)  # what the agent changed, in order
    calls: dict[str, int] = field(default_factory=dict)  # call name -> how often it was made on this device
    clock_event_reasons: int = pynvml.nvmlClocksEventReasonSwPowerCap
    errors: dict[str, int] = field(default_factory=dict)  # call name -> NVML_ERROR_* it returns
    lost: bool = False  # every call on this device answers GPU is lost
    hang: threading.Event | None = None  # every call on this device blocks until it is set
    # Where it sits: its PCI bus id as NVML writes it (None: nvmlDeviceGetPciInfo answers Not Supported),
    # and its NVLinks, one entry a link: (the remote device's bus id, its NVML_NVLINK_DEVICE_TYPE_*), or
    # None for a link that is down. No entries: the card has no NVLink (the state answers Not Supported).
    pci_bus_id: str | None = None
    nvlinks: list[tuple[str, int] | None] = field(default_factory=list)
    nvlink_remote_type_supported: bool = True  # False: an older driver without nvmlDeviceGetNvLinkRemoteDeviceType


def h100_sxm(index: int) -> FakeGpu:
    """An H100 SXM at work: 700 W limit, HBM temperature, held by its power cap."""
    return FakeGpu(uuid=f"GPU-h100-{index:04d}")


def l4(index: int) -> FakeGpu:
    """An L4: GDDR memory, so the memory temperature field is Not Supported."""
    return FakeGpu(
        uuid=f"GPU-l4-{index:04d}",
        name=L4_NAME,
        memory_total_bytes=L4_MEMORY_BYTES,
        temperature=47,
        memory_temperature=None,
        slowdown_temperature=87,
        power_mw=41_250,
        power_limit_mw=72_000,
        default_power_limit_mw=72_000,
        power_limit_constraints_mw=(40_000, 72_000),
        max_sm_clock_mhz=L4_MAX_SM_CLOCK_MHZ,
        clock_event_reasons=pynvml.nvmlClocksEventReasonGpuIdle,
    )


def a100_sxm(index: int) -> FakeGpu:
    """An A100 SXM4 80GB: HBM2e, a 400 W limit (settable down to 100 W), SMs topping out at 1410 MHz."""
    return FakeGpu(
        uuid=f"GPU-a100-{index:04d}",
        name=A100_SXM_NAME,
        memory_total_bytes=A100_SXM_MEMORY_BYTES,
        temperature=49,
        memory_temperature=58,
        slowdown_temperature=89,
        power_mw=236_000,
        power_limit_mw=400_000,
        default_power_limit_mw=400_000,
        power_limit_constraints_mw=(100_000, 400_000),
        max_sm_clock_mhz=A100_SXM_MAX_SM_CLOCK_MHZ,
    )


def l40s(index: int) -> FakeGpu:
    """An L40S: GDDR6 (no memory temperature), a 350 W limit, SMs topping out at 2520 MHz."""
    return FakeGpu(
        uuid=f"GPU-l40s-{index:04d}",
        name=L40S_NAME,
        memory_total_bytes=L40S_MEMORY_BYTES,
        temperature=51,
        memory_temperature=None,
        slowdown_temperature=88,
        power_mw=198_000,
        power_limit_mw=350_000,
        default_power_limit_mw=350_000,
        power_limit_constraints_mw=(100_000, 350_000),
        max_sm_clock_mhz=L40S_MAX_SM_CLOCK_MHZ,
    )


@dataclass
class FakeMemory:
    """What nvmlDeviceGetMemoryInfo answers (bytes)."""

    total: int
    free: int
    used: int


class FakeNvml(types.ModuleType):
    """A module that answers like ``pynvml`` for the GPUs it was given."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        super().__init__("pynvml")
        for name in dir(pynvml):
            if (
                name.startswith(("NVML_", "NVMLError", "nvmlClocks", "c_nvml"))
                or name == "nvmlExceptionClass"
            ):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.init_error = init_error
        # The PCIe common ancestor of each pair of GPUs (NVML_TOPOLOGY_*), by their two uuids; a pair not
        # listed answers Not Supported.
        self.common_ancestors: dict[frozenset[str], int] = {}
        self.init_calls = 0
        self.shutdown_calls = 0
        self.initialised = False

    # -- library ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check_initialised()
        self.shutdown_calls += 1
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check_initialised()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check_initialised()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._device(self.gpus[index], "nvmlDeviceGetHandleByIndex")

    # -- one device ------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        return self._device(gpu, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        return self._device(gpu, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: Any = None) -> FakeMemory:
        total = self._device(gpu, "nvmlDeviceGetMemoryInfo").memory_total_bytes
        return FakeMemory(total=total, free=total, used=0)

    def nvmlDeviceGetTemperatureV(self, gpu: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._device(gpu, "nvmlDeviceGetTemperatureV").temperature

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._device(gpu, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetTemperatureThreshold(self, gpu: FakeGpu, threshold: int) -> int:
        assert threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        value = self._device(gpu, "nvmlDeviceGetTemperatureThreshold").slowdown_temperature
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]) -> Any:
        self._device(gpu, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, field_id in enumerate(field_ids):
            values[i].fieldId = field_id
            if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temperature is not None:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = gpu.memory_temperature
            else:
                # The call succeeds, the field fails, and its value reads 0: the trap to avoid.
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return self._device(gpu, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        gpu = self._device(gpu, "nvmlDeviceGetEnforcedPowerLimit")
        return min(gpu.power_limit_mw, gpu.other_limiter_mw or gpu.power_limit_mw)

    def nvmlDeviceGetPowerManagementLimit(self, gpu: FakeGpu) -> int:
        return self._device(gpu, "nvmlDeviceGetPowerManagementLimit").power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, gpu: FakeGpu) -> int:
        return self._device(gpu, "nvmlDeviceGetPowerManagementDefaultLimit").default_power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, gpu: FakeGpu) -> list[int]:
        return list(self._device(gpu, "nvmlDeviceGetPowerManagementLimitConstraints").power_limit_constraints_mw)

    def nvmlDeviceSetPowerManagementLimit(self, gpu: FakeGpu, limit_mw: int) -> None:
        gpu = self._setter(gpu, "nvmlDeviceSetPowerManagementLimit")
        low, high = gpu.power_limit_constraints_mw
        if not low <= limit_mw <= high:  # the driver refuses a limit outside the constraints
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.set_calls.append(("power_limit_mw", limit_mw))
        gpu.power_limit_mw = limit_mw

    def nvmlDeviceGetMaxClockInfo(self, gpu: FakeGpu, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_SM
        value = self._device(gpu, "nvmlDeviceGetMaxClockInfo").max_sm_clock_mhz
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceSetGpuLockedClocks(self, gpu: FakeGpu, min_mhz: int, max_mhz: int) -> None:
        gpu = self._setter(gpu, "nvmlDeviceSetGpuLockedClocks")
        if not 0 < min_mhz <= max_mhz:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.set_calls.append(("locked_clocks_mhz", (min_mhz, max_mhz)))
        gpu.locked_clocks_mhz = (min_mhz, max_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, gpu: FakeGpu) -> None:
        gpu = self._setter(gpu, "nvmlDeviceResetGpuLockedClocks")
        gpu.set_calls.append(("locked_clocks_mhz", None))
        gpu.locked_clocks_mhz = None

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        return self._device(gpu, "nvmlDeviceGetCurrentClocksEventReasons").clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        return self._device(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_event_reasons

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> Any:
        gpu = self._device(gpu, "nvmlDeviceGetPciInfo")
        if gpu.pci_bus_id is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _pci_info(gpu.pci_bus_id)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeGpu, b: FakeGpu) -> int:
        self._device(a, "nvmlDeviceGetTopologyCommonAncestor")
        self._device(b, "nvmlDeviceGetTopologyCommonAncestor")
        level = self.common_ancestors.get(frozenset((a.uuid, b.uuid)))
        if level is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return level

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        return pynvml.NVML_FEATURE_ENABLED if self._nvlink(gpu, link, "nvmlDeviceGetNvLinkState") else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, gpu: FakeGpu, link: int) -> Any:
        remote = self._nvlink(gpu, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        if remote is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _pci_info(remote[0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, gpu: FakeGpu, link: int) -> int:
        if not gpu.nvlink_remote_type_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        remote = self._nvlink(gpu, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        if remote is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return remote[1]

    # -- scripting -------------------------------------------------------------------------

    def _nvlink(self, gpu: FakeGpu, link: int, call: str) -> tuple[str, int] | None:
        gpu = self._device(gpu, call)
        if not gpu.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a card without NVLink
        if not 0 <= link < len(gpu.nvlinks):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # past its last link
        return gpu.nvlinks[link]

    def _setter(self, gpu: FakeGpu, call: str) -> FakeGpu:
        gpu = self._device(gpu, call)
        if not gpu.privileged:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return gpu

    def _check_initialised(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, gpu: FakeGpu, call: str) -> FakeGpu:
        self._check_initialised()
        gpu.calls[call] = gpu.calls.get(call, 0) + 1
        if gpu.hang is not None:
            gpu.hang.wait(HANG_LIMIT_SECONDS)
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in gpu.errors:
            raise pynvml.NVMLError(gpu.errors[call])
        return gpu


def _pci_info(bus_id: str) -> Any:
    """What nvmlDeviceGetPciInfo answers: the binding's own structure, its bus id as NVML writes it."""
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    domain, bus, rest = bus_id.split(":")
    info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    return info


def fake_nvml(gpus: list[FakeGpu] | None = None, init_error: int | None = None) -> FakeNvml:
    """A fake pynvml with these GPUs (none by default), or failing nvmlInit with init_error."""
    return FakeNvml(list(gpus or []), init_error=init_error)


def library_missing() -> FakeNvml:
    """A machine without the NVIDIA driver: nvmlInit raises NVMLError_LibraryNotFound."""
    return fake_nvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
