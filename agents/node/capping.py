"""GPU capping through NVML: hold each GPU at the power limit or locked SM clocks the control plane asks.

The heartbeat answer's `capping` block (agents.node.protocol.validate_capping) says what each GPU must
hold; anything not asked goes back to its default (the default power limit, clocks unlocked). Setting
needs root (NVML answers No Permission otherwise) and does not survive a reboot or a driver reload.
Each pass is idempotent: a set call is made only when the value wanted is not the one in force, so an
agent without the privilege and with nothing asked makes no call that could fail. What failed is kept
per GPU and reported in its sensors (`capping: "not permitted" | "not supported"`), never raised: a
heartbeat must not fail over it. Calls here may block on a hung GPU: the caller runs them in the NVML
worker thread, under the same deadline as reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from agents.node.protocol import SM_CLOCK_MHZ_MAX, Capping, GpuCap

log = logging.getLogger(__name__)

# Locked clocks are not readable through NVML: a fresh agent does not know whether an earlier one left
# them locked, so its first pass resets them (best effort, said nowhere if it fails).
UNKNOWN = "unknown"


@dataclass
class GpuCapState:
    """What the agent knows of one GPU's capping: the clocks it locked, and how the last change failed."""

    locked_clocks_mhz: tuple[int, int] | None | str = UNKNOWN
    power_status: str | None = None
    clocks_status: str | None = None

    @property
    def status(self) -> str | None:
        """What the sensors say: the failure of the last set or reset, if one failed."""
        return self.power_status or self.clocks_status


class GpuCapper:
    """Applies capping blocks to the GPUs of one NVML session and reports what holds."""

    def __init__(self, nvml: ModuleType, session_errors: tuple[type[BaseException], ...]) -> None:
        self._nv = nvml
        self._session_errors = session_errors
        self._states: dict[str, GpuCapState] = {}  # by GPU uuid: NVML's index order is not stable
        self._top_clocks: dict[str, int | None] = {}  # by GPU uuid: a card's top SM clock never changes
        denied = getattr(nvml, "NVMLError_NoPermission", None)
        self._denied = (denied,) if denied is not None else ()
        self._unsupported = tuple(
            cls
            for cls in (getattr(nvml, "NVMLError_NotSupported", None), getattr(nvml, "NVMLError_FunctionNotFound", None))
            if cls is not None
        )

    def apply(self, handle: Any, uuid: str, capping: Capping | None) -> None:
        """Make this GPU hold what `capping` asks of it (its defaults when it asks nothing)."""
        state = self._states.setdefault(uuid, GpuCapState())
        want = capping.for_gpu(uuid) if capping is not None else None
        lever = capping.lever if capping is not None else None
        wanted_watts = want.power_limit_watts if want is not None and lever == "power_limit" else None
        wanted_clocks = want.locked_clocks_mhz if want is not None and lever == "locked_clocks" else None
        state.power_status = self._guard(uuid, "power limit", lambda: self._power_limit(handle, wanted_watts))
        clocks_status = self._guard(uuid, "locked clocks", lambda: self._clocks(handle, uuid, state, wanted_clocks))
        if state.locked_clocks_mhz == UNKNOWN and wanted_clocks is None:
            # The first reset failed with nothing asked: not worth a report, nor a retry every beat.
            state.locked_clocks_mhz = None
            clocks_status = None
        state.clocks_status = clocks_status

    def report(self, handle: Any, uuid: str, gpu: dict[str, Any]) -> None:
        """Add this GPU's capping keys to its reading: enforced and default limits, top and locked clocks, status."""
        top = self.top_sm_clock(handle, uuid)
        if top is not None:
            gpu["max_sm_clock_mhz"] = top
        enforced = self._optional(lambda: self._nv.nvmlDeviceGetEnforcedPowerLimit(handle))
        if enforced is not None and enforced > 0:
            gpu["enforced_power_limit_watts"] = enforced / 1000.0
        default = self._optional(lambda: self._nv.nvmlDeviceGetPowerManagementDefaultLimit(handle))
        if default is not None and default > 0:
            gpu["default_power_limit_watts"] = default / 1000.0
        state = self._states.get(uuid)
        if state is None:
            return
        if isinstance(state.locked_clocks_mhz, tuple):
            gpu["locked_clocks_mhz"] = list(state.locked_clocks_mhz)
        if state.status is not None:
            gpu["capping"] = state.status

    def top_sm_clock(self, handle: Any, uuid: str) -> int | None:
        """The card's top SM clock (MHz), read once per GPU; None when NVML cannot tell.

        A card or driver that answers Not Supported (or lacks the call) is not asked again; any other
        failure is, at the next read.
        """
        if uuid in self._top_clocks:
            return self._top_clocks[uuid]
        nv = self._nv
        try:
            top = nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM)
        except self._session_errors:
            raise
        except self._unsupported:
            top = None
        except nv.NVMLError as exc:
            log.debug("GPU %s: top SM clock unavailable: %s", uuid, exc)
            return None
        # A figure outside the protocol's bounds would get the whole heartbeat refused: leave it out.
        if isinstance(top, bool) or not isinstance(top, int) or not 0 < top <= SM_CLOCK_MHZ_MAX:
            top = None
        self._top_clocks[uuid] = top
        return top

    # -- the levers --------------------------------------------------------------------------

    def _power_limit(self, handle: Any, watts: float | None) -> None:
        nv = self._nv
        if watts is None:
            target = nv.nvmlDeviceGetPowerManagementDefaultLimit(handle)
        else:
            low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            # The card's own bounds win: a wanted limit below its floor is held at the floor.
            target = min(max(round(watts * 1000), low), high)
        if nv.nvmlDeviceGetPowerManagementLimit(handle) != target:
            nv.nvmlDeviceSetPowerManagementLimit(handle, target)
            log.info("GPU power limit set to %g W", target / 1000.0)

    def _clocks(self, handle: Any, uuid: str, state: GpuCapState, wanted: tuple[int, int] | None) -> None:
        nv = self._nv
        if wanted is not None:
            top = self.top_sm_clock(handle, uuid)
            if top:
                wanted = (min(wanted[0], top), min(wanted[1], top))
        if state.locked_clocks_mhz == wanted:
            return
        if wanted is None:
            nv.nvmlDeviceResetGpuLockedClocks(handle)
            if state.locked_clocks_mhz != UNKNOWN:
                log.info("GPU clocks unlocked")
        else:
            nv.nvmlDeviceSetGpuLockedClocks(handle, wanted[0], wanted[1])
            log.info("GPU SM clocks locked to %d-%d MHz", *wanted)
        state.locked_clocks_mhz = wanted

    # -- errors -------------------------------------------------------------------------------

    def _guard(self, uuid: str, what: str, call: Any) -> str | None:
        """Run one lever's change; the status to report when NVML refuses it (None: it holds)."""
        try:
            call()
        except self._session_errors:
            raise
        except self._denied:
            log.debug("GPU %s: %s not permitted (the agent is not root)", uuid, what)
            return "not permitted"
        except self._unsupported:
            log.debug("GPU %s: %s not supported", uuid, what)
            return "not supported"
        except self._nv.NVMLError as exc:
            # Anything else (a GPU that refuses an argument) is logged; the next answer tries again.
            log.warning("GPU %s: %s not changed: %s", uuid, what, exc)
        return None

    def _optional(self, call: Any) -> Any:
        try:
            return call()
        except self._session_errors:
            raise
        except self._nv.NVMLError:
            return None


__all__ = ["Capping", "GpuCap", "GpuCapState", "GpuCapper"]
