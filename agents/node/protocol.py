"""What a heartbeat may say: its shape, units and ranges, checked in one pass.

Pure: no Django. Heartbeats are the hottest path of the control plane (10,000 nodes every 10 s), so
this is plain code rather than nested serializers; a refusal names the field by its path
(`sensors.gpus[0].power_watts`) and nothing of the heartbeat is stored.

Kept in one module: the heartbeat is one contract, and every field's bound and words are here
once, for both write paths and the agent (docs/reference/limits.md is written from them).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from facility.domains import MAX_VALUE_LENGTH, DomainError, validate_label
from llmgw.errors import SHOWN_CHARS, cut_short, value_shown  # noqa: F401  (read here by the layers above)

THROTTLE_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "power_brake"})
REPLICA_STATES = frozenset({"starting", "ready", "stopping", "failed"})

# The bounds of a heartbeat, stated once: a value outside them is refused naming its field.
# Counts
MAX_GPUS = 64
MAX_REPLICAS = 1024
MAX_LABELS = 256
# Text (characters). No string may hold a control character or a lone surrogate (a replica message may
# hold tabs and newlines): they break tables, logs and the database, never carry meaning.
MAX_NAME_LENGTH = 253  # node, hostname, fabric: a DNS name's length
MAX_AGENT_VERSION_LENGTH = 50
MAX_GPU_UUID_LENGTH = 100
MAX_GPU_NAME_LENGTH = 200  # the GPU's model name
MAX_LABEL_KEY_LENGTH = 253
MAX_LABEL_VALUE_LENGTH = MAX_VALUE_LENGTH  # 253
MAX_MESSAGE_LENGTH = 1000  # a replica's message
MAX_HEALTH_PATH_LENGTH = 200  # a profile's health_path, as its model document and the agent take it
# Numbers (inclusive ranges)
GPU_WATTS_MAX = 5000  # no card draws 5 kW; a larger figure is a unit error (mW sent as W)
CPU_WATTS_MAX = 20_000
TEMP_MIN, TEMP_MAX = -40.0, 150.0
GPU_MEMORY_GIB_MAX = 4096
NODE_MEMORY_GIB_MAX = 1_048_576
CPU_CORES_MAX = 16384
INTERVAL_MIN, INTERVAL_MAX = 0.1, 10
REPLICA_ID_MAX = 2**63 - 1
RESTARTS_MAX = 2**31 - 1
PID_MAX = 2**31 - 1

# The C0 controls, DEL and the C1 controls (U+009B starts a terminal's escape sequence as ESC [ does), and
# the bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069: a text with one shows
# in another order than it is stored).
# The bidirectional controls as a character class's ranges, written as re and JSON Schema both read them
# (llmgw.api refuses them in every API body and query too).
BIDI_CONTROLS = r"\u202a-\u202e\u2066-\u2069"
# U+2028 and U+2029 end a line where a console's text or a script reads one: a reason with one is two lines.
_SEPARATORS = "\u2028\u2029"
_CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f" + _SEPARATORS + BIDI_CONTROLS + "\ud800-\udfff]")
_CONTROL_BUT_TAB_NEWLINE_OR_SURROGATE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f" + _SEPARATORS + BIDI_CONTROLS + "\ud800-\udfff]"
)


def _kind_of(char: str) -> str:
    """What a character the patterns above found is, in a refusal's words."""
    if "\ud800" <= char <= "\udfff":
        return "a lone surrogate"
    if char in _SEPARATORS:
        return "a line or paragraph separator"
    if "\u202a" <= char <= "\u2069":
        return "a bidirectional control"
    return "a control character"
_CLEAN_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")  # a key a field path may quote as is
_SHOWN = SHOWN_CHARS  # characters of an offending value a refusal quotes


# The fields a replica's command template is filled in with, by name alone.
COMMAND_FIELDS = ("model", "port", "replica", "gpus")


def health_path_problem(path: str) -> str | None:
    """Why a profile's ``health_path`` is no URL path the agent can ask its replica's port for; None when
    it is one (``/health``, ``/v1/models?ready=1``)."""
    if not path.startswith("/"):
        return f"must be a URL path starting with '/' (got {cut_short(repr(path), 60)})"
    if len(path) > MAX_HEALTH_PATH_LENGTH:
        return f"at most {MAX_HEALTH_PATH_LENGTH} characters (got {len(path):,})"
    if not path.isprintable() or " " in path:
        return "must hold no spaces or control characters (a URL path; write a space as %20)"
    return None


def command_problem(template: str) -> str | None:
    """Why a replica's command template cannot be filled in, or None when it can.

    Each field is one of COMMAND_FIELDS by name alone: no attribute, index, conversion or format spec
    (``{model.x}`` and ``{model:>99999999}`` would fail, or fill a node's memory, on every start).
    """
    fields = ", ".join("{" + name + "}" for name in COMMAND_FIELDS)
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"{exc} (a brace itself is written {{{{ or }}}})"
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name == "" or name.isdigit():
            return f"a positional field {{{name}}} is not allowed; the fields are {fields}"
        if name not in COMMAND_FIELDS:
            return f"unknown field {{{cut_short(name, _SHOWN)}}}; the fields are {fields}"
        if spec or conversion:
            return f"{{{name}}} takes no conversion or format spec; the fields are {fields}"
    return None


def carried_text(text: str, longest: int, *, multiline: bool = False) -> str:
    """Text the agent words itself from what it met (an exception's text, a BMC's answer: they may quote
    anything) as a heartbeat may carry it: within ``longest``, each character a heartbeat's text may not
    hold (a control character — but tab and newline where ``multiline`` — or a lone surrogate) written as
    its escape, so the node's heartbeats are never refused for it."""
    bad = _CONTROL_BUT_TAB_NEWLINE_OR_SURROGATE if multiline else _CONTROL_OR_SURROGATE
    return cut_short(bad.sub(lambda found: repr(found.group())[1:-1], text), longest)


def message_text(text: str) -> str:
    """A replica's message as a heartbeat carries it (:func:`carried_text`, tabs and newlines kept)."""
    return carried_text(text, MAX_MESSAGE_LENGTH, multiline=True)


def _shown(value: Any) -> str:
    """A value as a refusal quotes it: its repr, cut short (a refusal must not echo 256 KiB back)."""
    return cut_short(repr(value), _SHOWN)


def control_character_problem(value: str) -> str | None:
    """What a text holds that no name, path, command or reason may: a control character (C0, DEL, C1) or
    a lone surrogate."""
    bad = _CONTROL_OR_SURROGATE.search(value)
    if bad is None:
        return None
    return f"holds {_kind_of(bad.group())} ({bad.group()!r}) at character {bad.start()}; control characters are refused"


# A node's name, wherever one is given: agent.yaml, the heartbeat, `ctl node token`, the cluster file.
# A DNS-like name: it starts and ends with a letter or digit, so `gpu01-` is refused everywhere.
NODE_NAME_MAX_LENGTH = 253
NODE_NAME_RULE = f"letters, digits, '.', '_' and '-', starting and ending with a letter or digit, at most {NODE_NAME_MAX_LENGTH}"
_NODE_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")  # 253 at most


def is_node_name(name: Any) -> bool:
    """Whether `name` is a node's name; the whole text must match (a trailing newline does not pass)."""
    return isinstance(name, str) and _NODE_NAME_RE.fullmatch(name) is not None


def node_name_problem(name: Any) -> str:
    """What is wrong with a name that is_node_name refused, in the words every reader uses."""
    return f"{name!r} is not a node name ({NODE_NAME_RULE})"


class HeartbeatError(ValueError):
    """A heartbeat that breaks a rule; `field` is the path of the offending value."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = f"{field}: {message}"


def _number(value: Any, field: str, lo: float, hi: float, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HeartbeatError(field, f"must be a number ({unit}), not {_shown(value)}")
    # Range first: an integer of 400 digits has no float (math.isfinite would raise OverflowError).
    if isinstance(value, int):
        if not lo <= value <= hi:
            shown = f"{value:g}" if abs(value) < 10**20 else f"an integer of {len(str(abs(value)))} digits"
            raise HeartbeatError(field, f"must be between {lo:g} and {hi:g} {unit}, got {shown}")
        return float(value)
    if not math.isfinite(value):
        raise HeartbeatError(field, "must be a finite number")
    if not lo <= value <= hi:
        raise HeartbeatError(field, f"must be between {lo:g} and {hi:g} {unit}, got {value:g}")
    return float(value)


def implausible_entry(reading: str, value: Any, why: str, kind: str) -> dict[str, Any]:
    """One dropped reading as the node's ``sensors.implausible`` keeps it: the field, the value (None when it
    is no finite number), why in words, and its kind (IMPLAUSIBLE_KINDS: the metric's label)."""
    try:
        shown = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    except OverflowError:  # an integer of hundreds of digits
        shown = None
    if shown is not None and not math.isfinite(shown):
        shown = None
    return {"reading": reading, "value": shown, "why": why, "kind": kind}


def implausible_text(entry: Mapping[str, Any]) -> str:
    """A dropped reading in one line, as the heartbeat's answer warns of it and the log says it."""
    ending = entry.get("then") or "dropped"
    return f"{entry['reading']}: {entry['why']}; {ending}"


def _figure(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:,.0f}"


def _reading(
    obj: Mapping[str, Any], key: str, field: str, lo: float, hi: float, unit: str, out: dict, dropped: list | None
) -> None:
    """A sensor's number into ``out``: refused (HeartbeatError) when it is no number; a number outside
    ``lo``..``hi`` (or not finite) is a reading no sensor gives — dropped into ``dropped``, the heartbeat taken.
    ``dropped`` None: refused as any other field (the agent's own check)."""
    value = obj.get(key)
    if value is None:
        return
    where = f"{field}.{key}" if field else key
    if dropped is None:
        out[key] = _number(value, where, lo, hi, unit)
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HeartbeatError(where, f"must be a number ({unit}), not {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        dropped.append(implausible_entry(where, value, f"{value!r} is not a finite number", "out_of_bounds"))
        return
    if not lo <= value <= hi:
        shown = _figure(float(value)) if abs(value) < 10**20 else f"an integer of {len(str(abs(int(value))))} digits"
        dropped.append(implausible_entry(
            where, value, f"{shown} {unit} is outside what any sensor reads ({lo:g} to {hi:g} {unit})", "out_of_bounds"
        ))
        return
    out[key] = float(value)


def _integer(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HeartbeatError(field, f"must be a whole number, not {_shown(value)}")
    if not lo <= value <= hi:
        shown = value if abs(value) < 10**20 else f"an integer of {len(str(abs(value)))} digits"
        raise HeartbeatError(field, f"must be between {lo} and {hi}, got {shown}")
    return value


def _text(value: Any, field: str, max_length: int, *, multiline: bool = False) -> str:
    if not isinstance(value, str):
        raise HeartbeatError(field, f"must be text, not {_shown(value)}")
    if len(value) > max_length:
        raise HeartbeatError(field, f"at most {max_length} characters, got {len(value)}")
    bad = (_CONTROL_BUT_TAB_NEWLINE_OR_SURROGATE if multiline else _CONTROL_OR_SURROGATE).search(value)
    if bad:
        raise HeartbeatError(
            field, f"holds {_kind_of(bad.group())} ({bad.group()!r}) at character {bad.start()}; control characters and lone "
            "surrogates are refused"
        )
    return value


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise HeartbeatError(field, "must be an object")
    return value


def _list(value: Any, field: str, max_length: int) -> list:
    if not isinstance(value, list):
        raise HeartbeatError(field, "must be a list")
    if len(value) > max_length:
        raise HeartbeatError(field, f"at most {max_length} entries")
    return value


def _only(obj: Mapping[str, Any], field: str, allowed: frozenset[str]) -> None:
    for key in obj:
        if key not in allowed:
            name = f".{key}" if _CLEAN_KEY.fullmatch(key) else f"[{_shown(key)}]"
            where = f"{field}{name}" if field else name.removeprefix(".")
            raise HeartbeatError(where, f"unknown field; {field or 'a heartbeat'} takes {', '.join(sorted(allowed))}")


def _temperature(obj: Mapping[str, Any], key: str, field: str, out: dict, dropped: list | None = None) -> None:
    _reading(obj, key, field, TEMP_MIN, TEMP_MAX, "°C", out, dropped)


# `power_limit_max_watts`: the highest limit the card can be set to (NVML's power management limit
# constraints), what it can draw at most; `max_draw_watts`: the node's declared ceiling (its PSUs' rating).
GPU_INVENTORY_KEYS = frozenset(
    {"index", "uuid", "name", "memory_gib", "power_limit_watts", "power_limit_min_watts", "power_limit_max_watts"}
)
INVENTORY_KEYS = frozenset(
    {"gpus", "cpu_cores", "memory_gib", "hostname", "fabric", "gpu_topology", "max_draw_watts"}
)
GPU_SENSOR_KEYS = frozenset(
    {"index", "uuid", "temperature_celsius", "memory_temperature_celsius", "slowdown_temperature_celsius",
     "power_watts", "power_limit_watts", "throttle_reasons", "dropped"}
)
# A GPU's `dropped`: the readings its agent dropped at the source (NVML's not-available value, a figure no
# card has), each {"reading": its key, "value": what was read in the reading's unit (optional), "why"}.
GPU_DROPPED_READINGS = frozenset(
    {"temperature_celsius", "memory_temperature_celsius", "slowdown_temperature_celsius", "power_watts",
     "power_limit_watts", "enforced_power_limit_watts", "default_power_limit_watts"}
)
DROPPED_KEYS = frozenset({"reading", "value", "why"})
MAX_DROPPED_WHY_LENGTH = 200
SENSOR_KEYS = frozenset({"gpus", "cpu_temperature_celsius", "inlet_temperature_celsius", "cpu_power_watts"})
# The node's whole draw from its BMC (agents.node.sensors.bmc): the figure, where it comes from, and the BMC's
# state as a source. `node_power_watts` and `power_source: "bmc"` come together, while the BMC is up;
# `bmc` is {"state": "up", "resource": "EnvironmentMetrics" | "PowerSubsystem" | "Power" | "Sensors"} or
# {"state": "down", "reason": "…"} (the node's draw is then its GPUs' and CPUs' readings).
BMC_SENSOR_KEYS = frozenset({"node_power_watts", "power_source", "bmc"})
BMC_KEYS = frozenset({"state", "reason", "resource"})
BMC_STATES = ("up", "down")
# Sensors: a chassis' power sensor where the other three have none (HPE Cray EX blades).
BMC_RESOURCES = ("EnvironmentMetrics", "PowerSubsystem", "Power", "Sensors")
POWER_SOURCES = ("bmc",)
NODE_POWER_WATTS_MAX = 200_000  # a chassis may hold several nodes (a blade enclosure), never a hall
MAX_BMC_REASON_LENGTH = 300
REPLICA_KEYS = frozenset({"id", "state", "port", "pid", "restarts", "message"})
HEARTBEAT_KEYS = frozenset(
    {"node", "agent_version", "interval_seconds", "inventory", "labels", "sensors", "replicas"}
)


def _inventory(raw: Any) -> dict[str, Any]:
    inv = _mapping(raw, "inventory")
    _only(inv, "inventory", INVENTORY_KEYS)
    out: dict[str, Any] = {}
    if inv.get("gpus") is not None:
        gpus, seen = [], set()
        for i, g in enumerate(_list(inv["gpus"], "inventory.gpus", MAX_GPUS)):
            f = f"inventory.gpus[{i}]"
            g = _mapping(g, f)
            _only(g, f, GPU_INVENTORY_KEYS)
            if "index" not in g:
                raise HeartbeatError(f"{f}.index", "is required")
            gpu = {"index": _integer(g["index"], f"{f}.index", 0, MAX_GPUS - 1)}
            if gpu["index"] in seen:
                raise HeartbeatError(f"{f}.index", f"two GPUs with index {gpu['index']}")
            seen.add(gpu["index"])
            for key, longest in (("uuid", MAX_GPU_UUID_LENGTH), ("name", MAX_GPU_NAME_LENGTH)):
                if g.get(key) is not None:
                    gpu[key] = _text(g[key], f"{f}.{key}", longest)
            if g.get("memory_gib") is not None:
                gpu["memory_gib"] = _number(g["memory_gib"], f"{f}.memory_gib", 0, GPU_MEMORY_GIB_MAX, "GiB")
            for key in ("power_limit_watts", "power_limit_min_watts", "power_limit_max_watts"):
                if g.get(key) is not None:
                    gpu[key] = _number(g[key], f"{f}.{key}", 0, GPU_WATTS_MAX, "W")
            gpus.append(gpu)
        out["gpus"] = gpus
    if inv.get("cpu_cores") is not None:
        out["cpu_cores"] = _integer(inv["cpu_cores"], "inventory.cpu_cores", 0, CPU_CORES_MAX)
    if inv.get("memory_gib") is not None:
        out["memory_gib"] = _number(inv["memory_gib"], "inventory.memory_gib", 0, NODE_MEMORY_GIB_MAX, "GiB")
    if inv.get("max_draw_watts") is not None:
        out["max_draw_watts"] = _number(inv["max_draw_watts"], "inventory.max_draw_watts", 1, NODE_POWER_WATTS_MAX, "W")
    for key in ("hostname", "fabric"):
        if inv.get(key) is not None:
            out[key] = _text(inv[key], f"inventory.{key}", MAX_NAME_LENGTH)
    if inv.get("gpu_topology") is not None:
        out["gpu_topology"] = topology = _gpu_topology(inv["gpu_topology"])
        # Row i is the GPU of index i: every GPU listed has its row. The matrix may have more (a card the
        # agent could not read stays in it as a row of nulls, and leaves the list).
        wired = len(topology["links"])
        for i, gpu in enumerate(out.get("gpus", ())):
            if gpu["index"] >= wired:
                raise HeartbeatError(
                    f"inventory.gpus[{i}].index",
                    f"GPU {gpu['index']} is not in inventory.gpu_topology, which wires GPUs 0 to {wired - 1}",
                )
    return out


# -- GPU topology ------------------------------------------------------------------------------------------
#
# `inventory.gpu_topology` says how the node's GPUs are wired, as `nvidia-smi topo -m` prints it:
#
#     "gpu_topology": {
#       "links": [["X", "NV4", "PIX", …], ["NV4", "X", …], …],   # n × n, row and column i: the GPU of index i
#       "numa":  [0, 0, 1, 1, …]                                  # each GPU's NUMA node; -1: the platform has one
#     }
#
# A link is the closest path between two GPUs: "NV<n>" (n NVLinks, direct or through NVSwitches), else the
# PCIe path: "PIX" (one PCIe switch), "PXB" (several switches), "PHB" (a PCIe host bridge), "NODE" (host
# bridges of one NUMA node), "SYS" (across NUMA nodes). "X" on the diagonal and nowhere else; the matrix is
# symmetric. null (a link or a node) is unknown: the agent could not read it.

TOPOLOGY_PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
TOPOLOGY_KEYS = frozenset({"links", "numa"})
NVLINKS_MAX = 64  # links between two GPUs: 18 on Hopper, 36 in NVML's newest bound
NUMA_NODE_MAX = 1023  # the kernel's largest MAX_NUMNODES is 1024
_NVLINK = re.compile(r"NV([1-9][0-9]?)")


def _topology_link(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        nvlink = _NVLINK.fullmatch(value)
        if value in TOPOLOGY_PCIE_LINKS or (nvlink and int(nvlink.group(1)) <= NVLINKS_MAX):
            return value
    raise HeartbeatError(
        field, f"unknown link {_shown(value)}; links are NV1…NV{NVLINKS_MAX}, {', '.join(TOPOLOGY_PCIE_LINKS)} or null"
    )


def _gpu_topology(raw: Any) -> dict[str, list]:
    f = "inventory.gpu_topology"
    topology = _mapping(raw, f)
    _only(topology, f, TOPOLOGY_KEYS)
    for key in ("links", "numa"):
        if topology.get(key) is None:
            raise HeartbeatError(f"{f}.{key}", "is required")
    rows = _list(topology["links"], f"{f}.links", MAX_GPUS)
    size = len(rows)
    links: list[list[str | None]] = []
    for i, row in enumerate(rows):
        row = _list(row, f"{f}.links[{i}]", MAX_GPUS)
        if len(row) != size:
            raise HeartbeatError(f"{f}.links[{i}]", f"must have {size} entries, one a GPU, got {len(row)}")
        checked: list[str | None] = []
        for j, value in enumerate(row):
            where = f"{f}.links[{i}][{j}]"
            if i == j:
                if value != "X":
                    raise HeartbeatError(where, f"a GPU's link to itself is 'X', got {_shown(value)}")
                checked.append("X")
                continue
            link = _topology_link(value, where)
            if j < i and link != links[j][i]:
                raise HeartbeatError(where, f"{_shown(link)}, but links[{j}][{i}] says {_shown(links[j][i])}")
            checked.append(link)
        links.append(checked)
    nodes = _list(topology["numa"], f"{f}.numa", MAX_GPUS)
    if len(nodes) != size:
        raise HeartbeatError(f"{f}.numa", f"one entry a GPU: {size} GPUs in links, {len(nodes)} nodes")
    numa = [None if n is None else _integer(n, f"{f}.numa[{i}]", -1, NUMA_NODE_MAX) for i, n in enumerate(nodes)]
    return {"links": links, "numa": numa}


def _sensors(raw: Any) -> dict[str, Any]:
    """The sensors, checked; a number no sensor reads is dropped into ``implausible`` (the heartbeat kept)."""
    s = _mapping(raw, "sensors")
    dropped: list[dict[str, Any]] = []
    _only(s, "sensors", SENSOR_KEYS | SENSOR_THROUGHPUT_KEYS | BMC_SENSOR_KEYS)
    out: dict[str, Any] = {}
    if s.get("gpus") is not None:
        gpus = []
        seen = set()
        for i, g in enumerate(_list(s["gpus"], "sensors.gpus", MAX_GPUS)):
            f = f"sensors.gpus[{i}]"
            g = _mapping(g, f)
            _only(g, f, GPU_SENSOR_KEYS | GPU_CAPPING_SENSOR_KEYS)
            if "index" not in g:
                raise HeartbeatError(f"{f}.index", "is required")
            gpu: dict[str, Any] = {"index": _integer(g["index"], f"{f}.index", 0, MAX_GPUS - 1)}
            if gpu["index"] in seen:  # its draw would be counted twice in the node's
                raise HeartbeatError(f"{f}.index", f"two GPUs with index {gpu['index']}")
            seen.add(gpu["index"])
            if g.get("uuid") is not None:
                gpu["uuid"] = _text(g["uuid"], f"{f}.uuid", MAX_GPU_UUID_LENGTH)
            _temperature(g, "temperature_celsius", f, gpu, dropped)
            _temperature(g, "memory_temperature_celsius", f, gpu, dropped)
            _temperature(g, "slowdown_temperature_celsius", f, gpu, dropped)
            for key in ("power_watts", "power_limit_watts"):
                _reading(g, key, f, 0, GPU_WATTS_MAX, "W", gpu, dropped)
            if g.get("throttle_reasons") is not None:
                reasons = _list(g["throttle_reasons"], f"{f}.throttle_reasons", len(THROTTLE_REASONS))
                for reason in reasons:
                    if not isinstance(reason, str) or reason not in THROTTLE_REASONS:
                        raise HeartbeatError(
                            f"{f}.throttle_reasons",
                            f"unknown reason {_shown(reason)}; reasons are {', '.join(sorted(THROTTLE_REASONS))}",
                        )
                gpu["throttle_reasons"] = sorted(set(reasons))
            _gpu_capping_sensors(g, f, gpu, dropped)
            _dropped_at_source(g, f, gpu, dropped)
            gpus.append(gpu)
        out["gpus"] = gpus
    _temperature(s, "cpu_temperature_celsius", "sensors", out, dropped)
    _temperature(s, "inlet_temperature_celsius", "sensors", out, dropped)
    _reading(s, "cpu_power_watts", "sensors", 0, CPU_WATTS_MAX, "W", out, dropped)
    if s.get("replicas") is not None:
        out["replicas"] = _replica_throughput(s["replicas"], dropped)
    _bmc_sensors(s, out, dropped)
    if dropped:
        out["implausible"] = dropped
    return out


def _dropped_at_source(g: Mapping[str, Any], field: str, gpu: Mapping[str, Any], dropped: list) -> None:
    """The readings a GPU's agent dropped at the source (its ``dropped``), each flagged as a reading the
    control plane drops is (kind ``at_source``); the GPU carries none of them."""
    if g.get("dropped") is None:
        return
    for j, entry in enumerate(_list(g["dropped"], f"{field}.dropped", len(GPU_DROPPED_READINGS))):
        where = f"{field}.dropped[{j}]"
        entry = _mapping(entry, where)
        _only(entry, where, DROPPED_KEYS)
        reading = entry.get("reading")
        if not isinstance(reading, str) or reading not in GPU_DROPPED_READINGS:
            raise HeartbeatError(
                f"{where}.reading", f"must be one of {', '.join(sorted(GPU_DROPPED_READINGS))}, not {_shown(reading)}"
            )
        if reading in gpu:
            raise HeartbeatError(f"{where}.reading", f"{reading} is read too ({gpu[reading]:g}); a reading dropped is absent")
        if entry.get("why") is None:
            raise HeartbeatError(f"{where}.why", "is required")
        why = _text(entry["why"], f"{where}.why", MAX_DROPPED_WHY_LENGTH)
        value = entry.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise HeartbeatError(f"{where}.value", f"must be a number, not {_shown(value)}")
        dropped.append(implausible_entry(f"{field}.{reading}", value, why, "at_source"))


def _bmc_sensors(s: Mapping[str, Any], out: dict[str, Any], dropped: list) -> None:
    """The BMC's keys of the sensors (BMC_SENSOR_KEYS), checked into `out`."""
    watts, source = s.get("node_power_watts"), s.get("power_source")
    if (watts is None) != (source is None):
        missing = "power_source" if source is None else "node_power_watts"
        raise HeartbeatError(f"sensors.{missing}", "is required with " + (
            "node_power_watts: where the figure comes from" if source is None else "power_source"
        ))
    if watts is not None:
        if not isinstance(source, str) or source not in POWER_SOURCES:
            raise HeartbeatError(
                "sensors.power_source", f"unknown source {_shown(source)}; sources are {', '.join(POWER_SOURCES)}"
            )
        _reading(s, "node_power_watts", "sensors", 0, NODE_POWER_WATTS_MAX, "W", out, dropped)
        if "node_power_watts" in out:  # they come together: a figure dropped takes its source with it
            out["power_source"] = source
    if s.get("bmc") is None:
        return
    f = "sensors.bmc"
    bmc = _mapping(s["bmc"], f)
    _only(bmc, f, BMC_KEYS)
    state = bmc.get("state")
    if not isinstance(state, str) or state not in BMC_STATES:
        raise HeartbeatError(f"{f}.state", f"must be one of {', '.join(BMC_STATES)}, not {_shown(state)}")
    checked: dict[str, Any] = {"state": state}
    if state == "down":
        if bmc.get("reason") is None:
            raise HeartbeatError(f"{f}.reason", "is required when the BMC is down")
        checked["reason"] = _text(bmc["reason"], f"{f}.reason", MAX_BMC_REASON_LENGTH)
        if watts is not None:
            raise HeartbeatError("sensors.node_power_watts", "comes from the BMC, which is down")
    elif bmc.get("reason") is not None:
        raise HeartbeatError(f"{f}.reason", "only when the BMC is down")
    if bmc.get("resource") is not None:
        resource = bmc["resource"]
        if not isinstance(resource, str) or resource not in BMC_RESOURCES:
            raise HeartbeatError(f"{f}.resource", f"must be one of {', '.join(BMC_RESOURCES)}, not {_shown(resource)}")
        checked["resource"] = resource
    out["bmc"] = checked


def _labels(raw: Any) -> dict[str, str]:
    labels = _mapping(raw, "labels")
    if len(labels) > MAX_LABELS:
        raise HeartbeatError("labels", f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        try:
            _text(key, "labels", MAX_LABEL_KEY_LENGTH)
        except HeartbeatError as exc:
            raise HeartbeatError("labels", f"label key {_shown(key)}: {exc.message.removeprefix('labels: ')}") from exc
        _text(value, f"labels.{key}", MAX_LABEL_VALUE_LENGTH)
        try:
            validate_label(key, value)
        except DomainError as exc:
            raise HeartbeatError("labels", str(exc)) from exc
    return dict(labels)


def _replicas(raw: Any) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(_list(raw, "replicas", MAX_REPLICAS)):
        f = f"replicas[{i}]"
        r = _mapping(r, f)
        _only(r, f, REPLICA_KEYS)
        if "id" not in r or "state" not in r:
            raise HeartbeatError(f, "id and state are required")
        item: dict[str, Any] = {"id": _integer(r["id"], f"{f}.id", 1, REPLICA_ID_MAX)}
        if not isinstance(r["state"], str) or r["state"] not in REPLICA_STATES:
            raise HeartbeatError(f"{f}.state", f"unknown state {_shown(r['state'])}; states are {', '.join(sorted(REPLICA_STATES))}")
        item["state"] = r["state"]
        if r.get("port") is not None:
            item["port"] = _integer(r["port"], f"{f}.port", 1, 65535)
        if r.get("restarts") is not None:
            item["restarts"] = _integer(r["restarts"], f"{f}.restarts", 0, RESTARTS_MAX)
        if r.get("pid") is not None:  # checked, not kept: the control plane has no use for it
            _integer(r["pid"], f"{f}.pid", 0, PID_MAX)
        if r.get("message") is not None:
            item["message"] = _text(r["message"], f"{f}.message", MAX_MESSAGE_LENGTH, multiline=True)
        out.append(item)
    return out


def validate_heartbeat(raw: Any) -> dict[str, Any]:
    """The heartbeat, cleaned (nulls dropped: an absent reading is absent, never zero), or HeartbeatError."""
    hb = _mapping(raw, "heartbeat")
    _only(hb, "", HEARTBEAT_KEYS)
    if hb.get("node") is None or hb.get("node") == "":
        raise HeartbeatError("node", "is required")
    node = _text(hb["node"], "node", MAX_NAME_LENGTH)
    if not is_node_name(node):
        raise HeartbeatError("node", node_name_problem(node))
    out: dict[str, Any] = {"node": node}
    if hb.get("agent_version") is not None:
        out["agent_version"] = _text(hb["agent_version"], "agent_version", MAX_AGENT_VERSION_LENGTH)
    if hb.get("interval_seconds") is not None:
        out["interval_seconds"] = _number(
            hb["interval_seconds"], "interval_seconds", INTERVAL_MIN, INTERVAL_MAX, "seconds"
        )
    out["inventory"] = _inventory(hb["inventory"]) if hb.get("inventory") is not None else {}
    out["labels"] = _labels(hb["labels"]) if hb.get("labels") is not None else {}
    out["sensors"] = _sensors(hb["sensors"]) if hb.get("sensors") is not None else {}
    out["replicas"] = _replicas(hb["replicas"]) if hb.get("replicas") is not None else []
    return out


# -- plausibility: readings beyond what the node can draw ----------------------------------------------------
#
# A reading is judged on its own. A number no sensor gives (4,294,967 W: NVML's 0xFFFFFFFF mW) is dropped
# while the heartbeat is checked (_reading); a number inside its field's bounds may still be more than the
# node can draw: a card past its maximum, a card the node's accepted inventory does not list, a node past
# its ceiling, or a BMC reading far less than the node's own cards. Such a reading is dropped (absent,
# never 0) and named, not the heartbeat: its labels, inventory and replica states are kept; the node is
# flagged in its sensors (`implausible`: each reading, its value, why, its kind) and the answer warns.

# The kinds of dropped readings (the label of llmgw_readings_implausible_total).
IMPLAUSIBLE_KINDS = ("out_of_bounds", "at_source", "unknown_gpu", "gpu_power", "node_power", "bmc_low")

# A card's reading is believed up to GPU_READING_TOLERANCE × its maximum + READING_SLACK_WATTS: its 1-s
# average overshoots the limit for a moment. Its maximum is the highest of what the node says of it: the
# top of its limit's range (power_limit_max_watts), its limit (else the facility's gpu_watts) and its
# default limit (a card capped a moment ago still reads near its old limit).
GPU_READING_TOLERANCE = 1.10
READING_SLACK_WATTS = 25.0
# A node's whole draw (its cards' and CPUs' readings, or its BMC's figure) is believed up to
# NODE_CEILING_TOLERANCE × its ceiling where one is declared (the node's max_draw_watts, set by the
# facility, else the inventory's). Without one, up to NODE_READING_MARGIN × (its cards' maximums +
# node_watts) + READING_SLACK_WATTS: node_watts is the facility's estimate of its own part and a chassis at
# full load draws more besides (NVSwitches, fans, PSU losses), so that bound is loose.
NODE_CEILING_TOLERANCE = 1.05
NODE_READING_MARGIN = 2.0
# A BMC figure under this share of what the node's cards alone read is no reading of the node (a BMC
# answering 0 W): the cards' (and CPUs') readings are counted instead.
BMC_LOW_SHARE = 0.5


def card_most_watts(card: Mapping[str, Any], *, gpu_watts: float | None, default: float | None = None) -> float | None:
    """The most a card can draw, by what is known of it (see GPU_READING_TOLERANCE); None: nothing known."""
    figures = [w for w in (card.get("power_limit_max_watts"), card.get("power_limit_watts") or gpu_watts, default) if w]
    return max(figures) if figures else None


def implausible_readings(
    heartbeat: Mapping[str, Any], *, gpu_watts: float | None, node_watts: float | None,
    known_gpus: list[Mapping[str, Any]] | None = None, max_draw_watts: float | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The (validated) heartbeat's sensors without the readings the node cannot have read, and each dropped
    reading as an entry (:func:`implausible_entry`: those dropped by the check of the heartbeat come first);
    the sensors as they were when nothing is.

    ``known_gpus``: the node's accepted cards, where its heartbeat's inventory differs and waits for an
    operator (None: the heartbeat's inventory is the node's). A GPU's ``power_watts`` from a card they do not
    list (by index, and by UUID where both carry one) is dropped, as is one past the card's maximum
    (:func:`card_most_watts`). The node's whole draw — its GPUs' readings and ``cpu_power_watts`` (the CPU
    reading goes first, then the GPUs' if they alone are past it), or its BMC's ``node_power_watts`` (it
    goes with its ``power_source``) — is judged against its ceiling: ``max_draw_watts`` (the node's, set by
    the facility), else the inventory's, else its cards' maximums and ``node_watts`` loosely. A BMC figure
    under BMC_LOW_SHARE of the cards' own readings is dropped: the cards' readings count. A bound nobody
    knows judges nothing.
    """
    sensors = heartbeat.get("sensors") or {}
    dropped: list[dict[str, Any]] = list(sensors.get("implausible") or ())
    inventory = heartbeat.get("inventory") or {}
    cards = {card["index"]: card for card in (inventory.get("gpus") or [] if known_gpus is None else known_gpus)}
    defaults = {g["index"]: g.get("default_power_limit_watts") for g in sensors.get("gpus") or []}
    most_of = {
        index: card_most_watts(card, gpu_watts=gpu_watts, default=defaults.get(index)) for index, card in cards.items()
    }
    listed = "the inventory" if known_gpus is None else "the node's accepted inventory"
    gpus = []
    for i, gpu in enumerate(sensors.get("gpus") or []):
        watts, index = gpu.get("power_watts"), gpu["index"]
        card = cards.get(index)
        where = f"sensors.gpus[{i}].power_watts"
        entry = None
        if watts is not None and (card is None or (card.get("uuid") and gpu.get("uuid") and card["uuid"] != gpu["uuid"])):
            named = f"GPU {index}" if card is None else f"GPU {index} ({gpu['uuid']})"
            entry = implausible_entry(where, watts, f"{watts:g} W from {named}, which {listed} does not list", "unknown_gpu")
        elif watts is not None and (limit := most_of[index]) is not None:
            most = limit * GPU_READING_TOLERANCE + READING_SLACK_WATTS
            if watts > most:
                entry = implausible_entry(
                    where, watts,
                    f"{watts:g} W is more than GPU {index} can draw (its maximum is {limit:g} W; up to {most:g} W is "
                    "believed)",
                    "gpu_power",
                )
        if entry is not None:
            dropped.append(entry)
            gpu = {k: v for k, v in gpu.items() if k != "power_watts"}
        gpus.append(gpu)
    gone: set[str] = set()
    ceiling = max_draw_watts or inventory.get("max_draw_watts")
    known = [limit for limit in most_of.values() if limit is not None]
    most = can = None
    if ceiling:
        most = ceiling * NODE_CEILING_TOLERANCE
        can = f"its ceiling is {ceiling:g} W; up to {most:g} W is believed"
    elif node_watts is not None and len(known) == len(most_of):
        most = (sum(known) + node_watts) * NODE_READING_MARGIN + READING_SLACK_WATTS
        can = f"{sum(known):g} W of its cards' maximums, {node_watts:g} W of its own; up to {most:g} W is believed"
    gpu_total = sum(g["power_watts"] for g in gpus if g.get("power_watts") is not None)
    chassis = sensors.get("node_power_watts")
    if most is not None:
        cpu = sensors.get("cpu_power_watts")
        if cpu is not None and gpu_total + cpu > most:
            dropped.append(implausible_entry(
                "sensors.cpu_power_watts", cpu,
                f"{cpu:g} W puts the node at {gpu_total + cpu:g} W, more than it can draw ({can})", "node_power",
            ))
            gone.add("cpu_power_watts")
        if gpu_total > most:
            dropped.append(implausible_entry(
                "sensors.gpus[].power_watts", gpu_total,
                f"{gpu_total:g} W in all is more than the node can draw ({can})", "node_power",
            ))
            gpus = [{k: v for k, v in g.items() if k != "power_watts"} for g in gpus]
            gpu_total = 0.0
        if chassis is not None and chassis > most:
            dropped.append(implausible_entry(
                "sensors.node_power_watts", chassis, f"{chassis:g} W is more than the node can draw ({can})", "node_power"
            ))
            gone |= {"node_power_watts", "power_source"}  # they come together
    if chassis is not None and "node_power_watts" not in gone and chassis < gpu_total * BMC_LOW_SHARE:
        dropped.append(implausible_entry(
            "sensors.node_power_watts", chassis,
            f"{chassis:g} W is less than half of what its cards alone read ({gpu_total:g} W): their readings count",
            "bmc_low",
        ))
        gone |= {"node_power_watts", "power_source"}
    if not dropped:
        return sensors, []
    kept = {key: value for key, value in sensors.items() if key not in gone and key != "implausible"}
    if "gpus" in sensors:
        kept["gpus"] = gpus
    kept["implausible"] = dropped
    return kept, dropped


# -- capping: GPU power limits and locked clocks ---------------------------------------------------------
#
# The heartbeat ANSWER may carry a `capping` block; the agent applies it through NVML and reports what
# holds in its next heartbeat's sensors. The block, whole (every part but `lever` optional):
#
#     "capping": {
#       "lever": "power_limit" | "locked_clocks",
#       "all":  {"power_limit_watts": 490}              # every GPU of the node not listed below
#       "gpus": [{"uuid": "GPU-…", "power_limit_watts": 450}, …]
#     }
#
# with `locked_clocks_mhz: [min, max]` (SM clock, MHz) in place of `power_limit_watts` when the lever is
# `locked_clocks`. One lever per answer: the other one is restored to its default on every GPU. A GPU
# neither listed nor covered by `all`, and every GPU when the answer has no `capping` block (or `null`),
# is restored to its defaults: the default power limit, clocks unlocked. The agent clamps a wanted limit
# to the card's own constraints; a uuid the node does not have is ignored.
#
# What the agent reports per GPU in `sensors.gpus[]` (each key absent when unknown):
#   enforced_power_limit_watts  the limit in force, read back (after every limiter, capping included)
#   default_power_limit_watts   the card's default limit (what a restore goes back to)
#   max_sm_clock_mhz            the card's top SM clock (nvmlDeviceGetMaxClockInfo, read once per GPU):
#                               a `locked_clocks` cap asks a share of it (an older agent leaves it out)
#   locked_clocks_mhz           [min, max] while the agent holds the SM clocks locked
#   capping                     "not permitted" | "not supported": the last set or reset failed so
#                               (the agent is not root, or the card has no such control)
# and per ready replica in `sensors.replicas[]`: {id, tokens_per_second} (generated tokens per second
# from the replica's own counter; absent until two reads are known). Both live in `sensors`, not in
# `replicas`, because they change every heartbeat: `replicas` is part of a heartbeat's fingerprint and
# a change there takes the slow path.

CAPPING_LEVERS = ("power_limit", "locked_clocks")
CAPPING_STATUSES = frozenset({"not permitted", "not supported"})
LEVER_KEYS = {"power_limit": "power_limit_watts", "locked_clocks": "locked_clocks_mhz"}
CAPPING_KEYS = frozenset({"lever", "all", "gpus"})
SM_CLOCK_MHZ_MAX = 10_000  # no GPU clocks its SMs at 10 GHz: a larger figure is a unit error (kHz)
TOKENS_PER_SECOND_MAX = 100_000_000
GPU_CAPPING_SENSOR_KEYS = frozenset(
    {"enforced_power_limit_watts", "default_power_limit_watts", "max_sm_clock_mhz", "locked_clocks_mhz", "capping"}
)
SENSOR_THROUGHPUT_KEYS = frozenset({"replicas"})
REPLICA_THROUGHPUT_KEYS = frozenset({"id", "tokens_per_second"})


@dataclass(frozen=True)
class GpuCap:
    """What one GPU is asked to hold: a power limit (W) or a locked SM clock range (MHz), one of them."""

    power_limit_watts: float | None = None
    locked_clocks_mhz: tuple[int, int] | None = None


@dataclass(frozen=True)
class Capping:
    """A validated capping block: the lever, the value for every GPU (`all`) and per-uuid values."""

    lever: str
    all: GpuCap | None = None
    gpus: Mapping[str, GpuCap] = dataclass_field(default_factory=dict)

    def for_gpu(self, uuid: str) -> GpuCap | None:
        """What this GPU must hold; None: its defaults."""
        return self.gpus.get(uuid, self.all)


def _gpu_cap(raw: Any, field: str, lever: str, *, with_uuid: bool) -> GpuCap:
    entry = _mapping(raw, field)
    key = LEVER_KEYS[lever]
    _only(entry, field, frozenset({key, "uuid"} if with_uuid else {key}))
    if entry.get(key) is None:
        raise HeartbeatError(f"{field}.{key}", f"is required with lever {lever!r}")
    if lever == "power_limit":
        watts = _number(entry[key], f"{field}.{key}", 1, GPU_WATTS_MAX, "W")
        return GpuCap(power_limit_watts=watts)
    pair = _list(entry[key], f"{field}.{key}", 2)
    if len(pair) != 2:
        raise HeartbeatError(f"{field}.{key}", "must be [min, max] in MHz")
    low = _integer(pair[0], f"{field}.{key}[0]", 1, SM_CLOCK_MHZ_MAX)
    high = _integer(pair[1], f"{field}.{key}[1]", 1, SM_CLOCK_MHZ_MAX)
    if low > high:
        raise HeartbeatError(f"{field}.{key}", f"min {low} MHz is above max {high} MHz")
    return GpuCap(locked_clocks_mhz=(low, high))


def validate_capping(raw: Any) -> Capping | None:
    """The answer's capping block, checked (None: absent, restore every GPU's defaults), or HeartbeatError."""
    if raw is None:
        return None
    block = _mapping(raw, "capping")
    _only(block, "capping", CAPPING_KEYS)
    lever = block.get("lever")
    if not isinstance(lever, str) or lever not in CAPPING_LEVERS:
        raise HeartbeatError("capping.lever", f"must be one of {', '.join(CAPPING_LEVERS)}, not {_shown(lever)}")
    every = _gpu_cap(block["all"], "capping.all", lever, with_uuid=False) if block.get("all") is not None else None
    gpus: dict[str, GpuCap] = {}
    for i, entry in enumerate(_list(block.get("gpus") or [], "capping.gpus", MAX_GPUS)):
        f = f"capping.gpus[{i}]"
        uuid = _text(_mapping(entry, f).get("uuid"), f"{f}.uuid", MAX_GPU_UUID_LENGTH)
        if not uuid:
            raise HeartbeatError(f"{f}.uuid", "is required")
        if uuid in gpus:
            raise HeartbeatError(f"{f}.uuid", f"{uuid!r} is listed twice")
        gpus[uuid] = _gpu_cap(entry, f, lever, with_uuid=True)
    return Capping(lever, every, gpus)


def capping_answer(capping: Capping | None) -> dict[str, Any] | None:
    """The block as the answer carries it (the inverse of validate_capping): what the server sends."""
    if capping is None:
        return None
    key = LEVER_KEYS[capping.lever]

    def value(cap: GpuCap) -> Any:
        return cap.power_limit_watts if capping.lever == "power_limit" else list(cap.locked_clocks_mhz or ())

    block: dict[str, Any] = {"lever": capping.lever}
    if capping.all is not None:
        block["all"] = {key: value(capping.all)}
    if capping.gpus:
        block["gpus"] = [{"uuid": uuid, key: value(cap)} for uuid, cap in capping.gpus.items()]
    return block


def _gpu_capping_sensors(g: Mapping[str, Any], f: str, gpu: dict[str, Any], dropped: list) -> None:
    """The capping keys of one GPU's sensors (GPU_CAPPING_SENSOR_KEYS), checked into `gpu`."""
    for key in ("enforced_power_limit_watts", "default_power_limit_watts"):
        _reading(g, key, f, 0, GPU_WATTS_MAX, "W", gpu, dropped)
    if g.get("max_sm_clock_mhz") is not None:
        gpu["max_sm_clock_mhz"] = _integer(g["max_sm_clock_mhz"], f"{f}.max_sm_clock_mhz", 1, SM_CLOCK_MHZ_MAX)
    if g.get("locked_clocks_mhz") is not None:
        pair = _list(g["locked_clocks_mhz"], f"{f}.locked_clocks_mhz", 2)
        if len(pair) != 2:
            raise HeartbeatError(f"{f}.locked_clocks_mhz", "must be [min, max] in MHz")
        gpu["locked_clocks_mhz"] = [
            _integer(pair[i], f"{f}.locked_clocks_mhz[{i}]", 0, SM_CLOCK_MHZ_MAX) for i in (0, 1)
        ]
    if g.get("capping") is not None:
        if not isinstance(g["capping"], str) or g["capping"] not in CAPPING_STATUSES:
            raise HeartbeatError(
                f"{f}.capping", f"unknown status {_shown(g['capping'])}; statuses are {', '.join(sorted(CAPPING_STATUSES))}"
            )
        gpu["capping"] = g["capping"]


def _replica_throughput(raw: Any, dropped: list) -> list[dict[str, Any]]:
    """`sensors.replicas`: each ready replica's generated tokens per second."""
    out, seen = [], set()
    for i, r in enumerate(_list(raw, "sensors.replicas", MAX_REPLICAS)):
        f = f"sensors.replicas[{i}]"
        r = _mapping(r, f)
        _only(r, f, REPLICA_THROUGHPUT_KEYS)
        if "id" not in r:
            raise HeartbeatError(f"{f}.id", "is required")
        item: dict[str, Any] = {"id": _integer(r["id"], f"{f}.id", 1, REPLICA_ID_MAX)}
        if item["id"] in seen:
            raise HeartbeatError(f"{f}.id", f"replica {item['id']} is listed twice")
        seen.add(item["id"])
        _reading(r, "tokens_per_second", f, 0, TOKENS_PER_SECOND_MAX, "tokens/s", item, dropped)
        out.append(item)
    return out
