"""Why a replica waits, in a facility team's words: its nodes' rejections grouped by cause, the facility's
causes first (``3 racks held: r003, r017, r031 (75 nodes)``, ``rack r12-07 at its power limit (25 nodes)``),
then the nodes' own (``16 nodes lack gpu.model = H200``, ``40 nodes with fewer than 8 GPUs free``).

Pure: it reads the rejection texts the planner writes (placement.planner, facility.power's refusal), so a
test can pin each form. A text it does not know is kept as it is, counted.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping

from facility.domains import LEVELS

# Domains named in a cause before the rest are counted ("r003, r017, r031, …").
NAMES_SHOWN = 3

_LEVEL = "|".join(LEVELS)
_HELD = re.compile(rf"^({_LEVEL}) (\S+) is held(?:: .*)?$", re.S)
_HOT = re.compile(rf"^({_LEVEL}) (\S+) is hot(?: \(.*\))?$", re.S)
_POWER = re.compile(rf"^({_LEVEL}) (\S+): \S+ kW of a \S+ kW limit .* in use", re.S)
_NEEDS = re.compile(r"^needs (.+)$", re.S)
_GPU = re.compile(r"^gpu: (\d+) requested, \d+ free$")
_CPU = re.compile(r"^cpu: (\d+) requested, \d+ free$")
_MEMORY = re.compile(r"^memory: (\S+) GiB requested, \S+ GiB free$")
_NO_LABEL = re.compile(r"^no llmgw\.io/(\w+) label \(keep_within: \w+\)$")
_TOO_FEW = re.compile(r"^no (\w+) with (\d+) nodes that fit$")
_TOPOLOGY = re.compile(r"^topology: no (\d+ free GPUs (?:all joined by NVLink|on one NUMA node)) \(free: [0-9,-]*(?:; NUMA node unknown[^)]*)?\)$")

# What a domain's cause says, one domain and several: (singular, plural).
_FACILITY_WORDS = {
    "held": ("held", "held"),
    "hot": ("hot", "hot"),
    "power": ("at its power limit", "at their power limit"),
}
_FACILITY_ORDER = ("held", "hot", "power")
LACK = "lack"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def node_cause(reason: str) -> str:
    """What a rejection that is the node's own says of it, after ``16 nodes`` (``lack gpu.model = H200``)."""
    if reason == "not ready":
        return "not ready"
    if reason == "cordoned":
        return "cordoned"
    if reason == "excluded (lost a race)":
        return "lost a race to another placement"
    if match := _NEEDS.match(reason):
        return f"{LACK} {match.group(1)}"
    if match := _GPU.match(reason):
        return f"with fewer than {match.group(1)} GPUs free"
    if match := _CPU.match(reason):
        return f"with fewer than {match.group(1)} CPU cores free"
    if match := _MEMORY.match(reason):
        return f"with less than {match.group(1)} GiB of memory free"
    if match := _TOO_FEW.match(reason):
        return f"in no {match.group(1)} with {match.group(2)} nodes that fit"
    if reason.startswith("no fabric ("):
        return "on no fabric"
    if match := _NO_LABEL.match(reason):
        return f"with no {match.group(1)} label"
    if match := _TOPOLOGY.match(reason):
        return f"without {match.group(1)}"
    if reason.startswith("topology: the node reports no GPU topology"):
        return "reporting no GPU topology"
    return f": {reason}"


def facility_cause(reason: str) -> tuple[str, str, str] | None:
    """(kind, level, name) when the rejection is the facility's: a hold, a hot domain, a power limit."""
    for kind, pattern in (("held", _HELD), ("hot", _HOT), ("power", _POWER)):
        if match := pattern.match(reason):
            return kind, match.group(1), match.group(2)
    return None


def nofit_causes(rejections: Mapping[str, str], counts: Mapping[str, int] | None = None) -> list[str]:
    """Every cause of a no-fit once, the facility's first (holds, hot domains, power limits, by level),
    then the nodes' own, the most nodes first. ``counts``: each reason's count, where already known."""
    if counts is None:
        counts = Counter(rejections.values())
    # kind → level → domain name → nodes
    facility: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    nodes: Counter = Counter()
    for reason, count in counts.items():
        found = facility_cause(reason)
        if found is None:
            nodes[node_cause(reason)] += count
        else:
            kind, level, name = found
            facility[kind][level][name] += count
    out: list[str] = []
    for kind in _FACILITY_ORDER:
        for level in LEVELS:
            domains = facility.get(kind, {}).get(level)
            if not domains:
                continue
            one, many = _FACILITY_WORDS[kind]
            held_nodes = _plural(sum(domains.values()), "node")
            names = sorted(domains)
            if len(names) == 1:
                out.append(f"{level} {names[0]} {one} ({held_nodes})")
                continue
            shown = ", ".join(names[:NAMES_SHOWN]) + (", …" if len(names) > NAMES_SHOWN else "")
            out.append(f"{_plural(len(names), level)} {many}: {shown} ({held_nodes})")
    # The most nodes first; a reason not known here after the known ones of as many nodes.
    for cause, count in sorted(nodes.items(), key=lambda item: (-item[1], item[0].startswith(":"), item[0])):
        if count == 1 and cause.startswith(LACK):
            cause = "lacks" + cause.removeprefix(LACK)
        out.append(f"{_plural(count, 'node')}{'' if cause.startswith(':') else ' '}{cause}")
    return out
