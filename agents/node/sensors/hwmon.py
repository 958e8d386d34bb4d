"""CPU and inlet temperatures from the kernel's hwmon class (what lm_sensors reads).

Each ``/sys/class/hwmon/hwmonX`` is one chip: ``name`` says which, ``temp<N>_input`` is a
channel in millidegrees Celsius and ``temp<N>_label`` names it when the driver knows. Only CPU
chips give the CPU temperature; board sensors labelled SYSTIN / Inlet / Ambient give the
inlet. Everything else (acpitz, NVMe, PCH, NICs) is ignored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

ReadText = Callable[[str], "str | None"]

# A reading outside this band is a broken sensor or a driver's placeholder, not a temperature.
MIN_CELSIUS = -40.0
MAX_CELSIUS = 150.0

_INTEL_CHIPS = frozenset({"coretemp"})
_AMD_CHIPS = frozenset({"k10temp", "zenpower"})
_INLET_LABEL = re.compile(r"systin|inlet|ambient", re.IGNORECASE)
_INTEL_PACKAGE_LABEL = re.compile(r"^(package|physical) id \d+$", re.IGNORECASE)
_INTEL_CORE_LABEL = re.compile(r"^core \d+$", re.IGNORECASE)
_AMD_CCD_LABEL = re.compile(r"^tccd\d+$", re.IGNORECASE)
_CHANNEL_INPUT = re.compile(r"^temp(\d+)_input$")


@dataclass(frozen=True)
class Channel:
    """One temperature channel of a hwmon chip."""

    chip: str
    label: str | None
    celsius: float


@dataclass(frozen=True)
class Temperatures:
    """What hwmon says about the node: each value None when the machine has no such sensor."""

    cpu_celsius: float | None
    inlet_celsius: float | None


def read_temperatures(root: str, read_text: ReadText) -> Temperatures:
    """Read every hwmon chip under ``root`` and pick the CPU and inlet temperatures."""
    chips = list(_chips(root, read_text))
    cpu = _cpu_celsius(chips)
    inlets = [
        ch.celsius for _, channels in chips for ch in channels if ch.label and _INLET_LABEL.search(ch.label)
    ]
    # Several inlet sensors on one board are rare; the warmest is the one a thermal limit cares about.
    return Temperatures(cpu_celsius=cpu, inlet_celsius=max(inlets) if inlets else None)


def read_channels(root: str, read_text: ReadText) -> list[Channel]:
    """Every enabled, plausible temperature channel under root (for dry runs and tests)."""
    return [channel for _, channels in _chips(root, read_text) for channel in channels]


def _cpu_celsius(chips: list[tuple[str, list[Channel]]]) -> float | None:
    """The hottest package over the sockets, else the hottest core."""
    packages: list[float] = []
    cores: list[float] = []
    for chip, channels in chips:
        if chip in _INTEL_CHIPS:
            for ch in channels:
                if ch.label and _INTEL_PACKAGE_LABEL.match(ch.label):
                    packages.append(ch.celsius)
                elif ch.label and _INTEL_CORE_LABEL.match(ch.label):
                    cores.append(ch.celsius)
        elif chip in _AMD_CHIPS:
            # One chip per socket. Tdie is the die itself; Tctl may carry a fan-control offset.
            by_label = {(ch.label or "").lower(): ch.celsius for ch in channels}
            if "tdie" in by_label:
                packages.append(by_label["tdie"])
            elif "tctl" in by_label:
                packages.append(by_label["tctl"])
            elif len(channels) == 1 and channels[0].label is None:
                # Old k10temp exposes a single unlabelled channel, which is Tctl.
                packages.append(channels[0].celsius)
            cores.extend(ch.celsius for ch in channels if ch.label and _AMD_CCD_LABEL.match(ch.label))
    if packages:
        return max(packages)
    if cores:
        return max(cores)
    return None


def _chips(root: str, read_text: ReadText) -> Iterator[tuple[str, list[Channel]]]:
    """Yield (chip name, enabled channels in range) for each hwmon device under root."""
    class_dir = os.path.join(root, "sys/class/hwmon")
    try:
        entries = sorted(os.listdir(class_dir))
    except OSError:
        return
    for entry in entries:
        if not entry.startswith("hwmon"):
            continue
        hwmon_dir = os.path.join(class_dir, entry)
        # Old drivers keep their files in hwmonX/device/ instead of hwmonX/.
        for directory in (hwmon_dir, os.path.join(hwmon_dir, "device")):
            name = read_text(os.path.join(directory, "name"))
            if name is not None and name.strip():
                yield name.strip(), list(_channels(directory, name.strip(), read_text))
                break


def _channels(directory: str, chip: str, read_text: ReadText) -> Iterator[Channel]:
    try:
        files = sorted(os.listdir(directory))
    except OSError:
        return
    for filename in files:
        match = _CHANNEL_INPUT.match(filename)
        if match is None:
            continue
        prefix = os.path.join(directory, f"temp{match.group(1)}")
        enable = read_text(prefix + "_enable")
        if enable is not None and enable.strip() == "0":
            continue
        celsius = _millidegrees(read_text(prefix + "_input"))
        if celsius is None:
            continue
        label = read_text(prefix + "_label")
        label = label.strip() if label is not None and label.strip() else None
        yield Channel(chip=chip, label=label, celsius=celsius)


def _millidegrees(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        celsius = int(text.strip()) / 1000.0
    except ValueError:
        return None
    if not MIN_CELSIUS <= celsius <= MAX_CELSIUS:
        return None
    return celsius
