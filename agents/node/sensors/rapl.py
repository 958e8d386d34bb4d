"""CPU package power from RAPL energy counters under /sys/class/powercap.

A counter is energy in microjoules since some arbitrary point; power is the change over time,
so the first read only primes and each later read gives the average since the one before.
Only top-level ``package-N`` zones count: subzones (core, uncore, dram) and ``psys`` overlap the
packages or the whole platform, and adding them would count the same joules twice.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

ReadText = Callable[[str], "str | None"]

log = logging.getLogger(__name__)

# intel-rapl:<hex> is the MSR interface; intel-rapl-mmio:<hex> the newer MMIO one, which
# reports the same package again where both exist. Subzones have a second ":<hex>".
_TOP_ZONE = re.compile(r"^(intel-rapl|intel-rapl-mmio):[0-9a-f]+$")
_PACKAGE_NAME = re.compile(r"^package-\d+$")


@dataclass(frozen=True)
class PackageZone:
    """One CPU package's energy counter directory."""

    package: str
    path: str


def package_zones(root: str, read_text: ReadText) -> list[PackageZone]:
    """The top-level package zones under root, each package once (MSR zone preferred)."""
    class_dir = os.path.join(root, "sys/class/powercap")
    try:
        entries = sorted(os.listdir(class_dir))
    except OSError:
        return []
    msr: dict[str, str] = {}
    mmio: dict[str, str] = {}
    for entry in entries:
        match = _TOP_ZONE.match(entry)
        if match is None:
            continue
        path = os.path.join(class_dir, entry)
        name = read_text(os.path.join(path, "name"))
        if name is None or not _PACKAGE_NAME.match(name.strip()):
            continue
        target = msr if match.group(1) == "intel-rapl" else mmio
        target.setdefault(name.strip(), path)
    chosen = dict(mmio)
    chosen.update(msr)
    return [PackageZone(package=name, path=path) for name, path in sorted(chosen.items())]


class PackagePower:
    """Turns successive package energy readings into watts; keeps the previous sample."""

    def __init__(self, root: str, read_text: ReadText, clock: Callable[[], float]) -> None:
        self._root = root
        self._read_text = read_text
        self._clock = clock
        self._last_time: float | None = None
        self._last_energy: dict[str, int] = {}

    def read_watts(self) -> float | None:
        """Σ package power since the previous call, or None (first call, unreadable, or unknown)."""
        now = self._clock()
        zones = package_zones(self._root, self._read_text)
        energy: dict[str, int] = {}
        for zone in zones:
            value = _microjoules(self._read_text(os.path.join(zone.path, "energy_uj")))
            if value is None:
                # Root-only since the 2020 side-channel fix; a partial sum would under-report.
                self._forget()
                return None
            energy[zone.path] = value
        if not energy:
            self._forget()
            return None
        previous, previous_time = self._last_energy, self._last_time
        self._last_energy, self._last_time = energy, now
        if previous_time is None or previous.keys() != energy.keys():
            return None
        elapsed = now - previous_time
        if elapsed <= 0:
            return None
        total_uj = 0
        for path, value in energy.items():
            delta = value - previous[path]
            if delta < 0:
                limit = _microjoules(self._read_text(os.path.join(path, "max_energy_range_uj")))
                if limit is None or limit <= previous[path]:
                    # Without the counter's range a wrap cannot be undone: drop this sample.
                    log.debug("RAPL counter %s went back without a known range", path)
                    return None
                delta = limit - previous[path] + value
            total_uj += delta
        return total_uj / 1e6 / elapsed

    def _forget(self) -> None:
        self._last_energy = {}
        self._last_time = None


def _microjoules(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None
