"""Capping's step: which domains press their nodes, and for every node pressed or capped, its next share of
the default limit — down a step toward the floor, or back up a step once it has been ok for
``restore_after`` — and whether that changes a node's heartbeat answer or only the listing.

Pure: the shell (:mod:`placement.capping`) reads the domains, the nodes' kept caps (NodeCap) and default
limits, and writes what this returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from facility.response import NEAR_LIMIT_FRACTION, CappingConfig
from placement.decisions.domain_state import DomainState, narrowest_first

CLOSE = 1e-9


@dataclass(frozen=True, slots=True)
class Pressure:
    """Why capping acts on a domain (`rack r12-07 warm`) and whether its conditions mode is enforce."""

    reason: str
    enforce: bool


@dataclass(frozen=True, slots=True)
class NodeCapState:
    """A node's cap (placement.models.NodeCap): the share of its default limit sent, the share observe mode
    would send, why, and since when none of its domains has pressed it."""

    fraction: float = 1.0
    would_fraction: float = 1.0
    reason: str = ""
    ok_since: datetime | None = None

    @property
    def is_default(self) -> bool:
        """Nothing asked and nothing that would be: the node holds its defaults, no cap is kept."""
        return self.fraction >= 1 - CLOSE and self.would_fraction >= 1 - CLOSE


@dataclass(frozen=True, slots=True)
class CapNode:
    """A node capping looks at: its name, its kept cap (None: none), its domains (those pressed count), and
    its GPUs' default power limit (None: not known)."""

    node_id: int
    name: str | None
    kept: NodeCapState | None
    domains: tuple[str, ...] = ()
    default_watts: float | None = None


@dataclass(frozen=True, slots=True)
class CapChange:
    """A node whose cap changed: the share now in force (or that would be), in watts where the default is
    known, why, and whether its heartbeat answer carries it."""

    node: str | None
    fraction: float
    watts: int | None
    reason: str
    sent: bool

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "fraction": self.fraction, "watts": self.watts, "reason": self.reason,
                "sent": self.sent}


@dataclass(frozen=True, slots=True)
class CapStep:
    """What :func:`cap_step` decided: the caps to keep (node id → new state, every kept one), the caps to
    release (back to the defaults), the changes to report, whether a node's answer changed (``sent``) and
    whether only the listing did (``shown``)."""

    keep: dict[int, NodeCapState]
    release: tuple[int, ...]
    changes: tuple[CapChange, ...]
    sent: bool
    shown: bool


def pressed_domains(domains: Iterable[DomainState]) -> dict[str, Pressure]:
    """Domain → why capping acts there: warm or hot, or within 5 % of its power limit."""
    found: dict[str, Pressure] = {}
    for domain in domains:
        if domain.condition in ("warm", "hot"):
            found[domain.domain] = Pressure(f"{domain.words} {domain.condition}", domain.enforce)
        elif domain.limit_watts and domain.use_watts >= domain.limit_watts * (1 - NEAR_LIMIT_FRACTION):
            found[domain.domain] = Pressure(
                f"{domain.words} within {NEAR_LIMIT_FRACTION:.0%} of its power limit", domain.enforce
            )
    return found


def node_cap_next(
    kept: NodeCapState, pressure: Pressure | None, config: CappingConfig, now: datetime
) -> NodeCapState:
    """One node's next cap: pressed, a step down (the sent share under enforce, else only the share observe
    mode would send), never under ``floor_fraction``; not pressed for ``restore_after``, a step back up,
    never over the defaults. The ok clock starts at the first step without pressure."""
    if pressure is not None:
        if pressure.enforce:
            fraction = max(config.floor_fraction, kept.fraction - config.step_fraction)
            return NodeCapState(fraction, fraction, pressure.reason, None)
        would = max(config.floor_fraction, kept.would_fraction - config.step_fraction)
        return NodeCapState(kept.fraction, would, pressure.reason, None)
    ok_since = kept.ok_since or now
    if now - ok_since >= timedelta(seconds=config.restore_after):
        return NodeCapState(
            min(1.0, kept.fraction + config.step_fraction), min(1.0, kept.would_fraction + config.step_fraction),
            kept.reason, ok_since,
        )
    return NodeCapState(kept.fraction, kept.would_fraction, kept.reason, ok_since)


def cap_step(
    *, nodes: Iterable[CapNode], pressed: Mapping[str, Pressure], config: CappingConfig, now: datetime
) -> CapStep:
    """Every node's next cap (by name); a node in several pressed domains takes the narrowest's reason and mode.

    A node back at its defaults has its kept cap released (reported `restored`); otherwise its new cap is
    kept, and reported when its shares changed.
    """
    keep: dict[int, NodeCapState] = {}
    release: list[int] = []
    changes: list[CapChange] = []
    sent = shown = False
    for node in sorted(nodes, key=lambda n: n.name or ""):
        before = node.kept or NodeCapState()
        domains = sorted((d for d in node.domains if d in pressed), key=narrowest_first)
        after = node_cap_next(before, pressed[domains[0]] if domains else None, config, now)
        if after.is_default:
            if node.kept is not None:
                release.append(node.node_id)
                sent = sent or before.fraction < 1 - CLOSE
                shown = True
                changes.append(CapChange(node.name, 1.0, None, "restored", True))
            continue
        keep[node.node_id] = after
        shown = shown or after.reason != before.reason
        if (after.fraction, after.would_fraction) != (before.fraction, before.would_fraction):
            shown = True
            enforced = abs(after.fraction - before.fraction) > CLOSE
            sent = sent or enforced
            fraction = after.fraction if enforced else after.would_fraction
            watts = round(node.default_watts * fraction) if node.default_watts else None
            changes.append(CapChange(node.name, round(fraction, 4), watts, after.reason, enforced))
    return CapStep(keep, tuple(release), tuple(changes), sent, shown)
