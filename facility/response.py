"""What llmgw does about a hot or over-limit domain, as configured: ``facility.shedding`` and ``facility.capping``.

Pure: the server.yaml blocks parsed whole (all or nothing), a :class:`facility.configuration.ConfigError`
naming the path of a wrong value, which facility.services words with the file and line.

Shedding (off by default) moves replicas off a domain that has been hot under enforce mode, or past its
power limit, for longer than ``shed_after``: one replica per domain per ``interval``, replacement
first. Capping (off by default) asks a warm or nearly full domain's GPUs to draw less, down to
``floor_fraction`` of their default limit, and restores them once the domain has been ok a while.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from facility.conditions import domain_overrides
from facility.configuration import ConfigError, parse_duration
from llmgw.errors import value_shown

SHED_KEYS = ("enabled", "shed_after", "interval", "drop_batch")
CAPPING_KEYS = ("enabled", "floor_fraction", "lever", "step_fraction", "restore_after")
LEVERS = ("power_limit", "locked_clocks")
# A domain this close to its power limit (a share of the limit) is capped as a warm one is.
NEAR_LIMIT_FRACTION = 0.05


@dataclass(frozen=True, slots=True)
class ShedRule:
    """One domain's shedding: whether it runs, after how long, how often, and whether batch may just stop."""

    enabled: bool = False
    shed_after: float = 600.0
    interval: float = 300.0
    drop_batch: bool = False


@dataclass(frozen=True, slots=True)
class SheddingConfig:
    """``facility.shedding``: the cluster's rule and per-domain overrides (``rack:r12-07: {enabled: true}``)."""

    default: ShedRule = ShedRule()
    domains: Mapping[str, ShedRule] = field(default_factory=dict)

    def rule(self, domain: str) -> ShedRule:
        return self.domains.get(domain, self.default)

    @property
    def any_enabled(self) -> bool:
        return self.default.enabled or any(r.enabled for r in self.domains.values())


@dataclass(frozen=True, slots=True)
class CappingConfig:
    """``facility.capping``: lower a warm (or nearly full) domain's GPU limits in steps toward the floor."""

    enabled: bool = False
    floor_fraction: float = 0.7
    lever: str = "power_limit"
    step_fraction: float = 0.1
    restore_after: float = 600.0


def _duration(value: object, path: tuple) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigError(path, str(exc)) from None


def _flag(value: object, path: tuple) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"true or false, not {value_shown(value)}")
    return value


def _fraction(value: object, path: tuple, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(path, f"a number, not {value_shown(value)}")
    if not lo <= value <= hi:
        raise ConfigError(path, f"between {lo:g} and {hi:g}, got {value:g}")
    return float(value)


def _shed_rule(raw: object, base: ShedRule, path: tuple, *, allow_domains: bool) -> tuple[ShedRule, object]:
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"a mapping of {', '.join(SHED_KEYS)}")
    allowed = (*SHED_KEYS, *(("domains",) if allow_domains else ()))
    for key in raw:
        if key not in allowed:
            raise ConfigError((*path, key), f"unknown key; this block takes: {', '.join(allowed)}")
    values: dict[str, object] = {}
    for key in ("enabled", "drop_batch"):
        if key in raw:
            values[key] = _flag(raw[key], (*path, key))
    for key in ("shed_after", "interval"):
        if key in raw:
            values[key] = _duration(raw[key], (*path, key))
    rule = replace(base, **values)
    if rule.interval <= 0:
        raise ConfigError((*path, "interval"), "more than 0: one replica per domain per interval")
    return rule, raw.get("domains")


def parse_shedding_config(raw: object) -> SheddingConfig:
    """``{enabled, shed_after, interval, drop_batch, domains: {rack:r1: {...}}}`` → SheddingConfig."""
    if raw is None:
        return SheddingConfig()
    default, domains_raw = _shed_rule(raw, ShedRule(), (), allow_domains=True)
    domains = domain_overrides(
        domains_raw, "{enabled, shed_after, interval, drop_batch}",
        lambda rule_raw, path: _shed_rule(rule_raw, default, path, allow_domains=False)[0],
    )
    return SheddingConfig(default, domains)


def parse_capping_config(raw: object) -> CappingConfig:
    """``{enabled, floor_fraction, lever, step_fraction, restore_after}`` → CappingConfig."""
    if raw is None:
        return CappingConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError((), f"a mapping of {', '.join(CAPPING_KEYS)}")
    for key in raw:
        if key not in CAPPING_KEYS:
            raise ConfigError((key,), f"unknown key; this block takes: {', '.join(CAPPING_KEYS)}")
    values: dict[str, object] = {}
    if "enabled" in raw:
        values["enabled"] = _flag(raw["enabled"], ("enabled",))
    if "floor_fraction" in raw:
        values["floor_fraction"] = _fraction(raw["floor_fraction"], ("floor_fraction",), 0.3, 1.0)
    if "step_fraction" in raw:
        values["step_fraction"] = _fraction(raw["step_fraction"], ("step_fraction",), 0.01, 0.5)
    if "lever" in raw:
        if raw["lever"] not in LEVERS:
            raise ConfigError(("lever",), f"one of {', '.join(LEVERS)}, not {value_shown(raw['lever'])}")
        values["lever"] = raw["lever"]
    if "restore_after" in raw:
        values["restore_after"] = _duration(raw["restore_after"], ("restore_after",))
    return CappingConfig(**values)


def capped_step(current: float, default: float, config: CappingConfig) -> float:
    """The next lower limit: one step (a share of the default) down from ``current``, not under the floor."""
    floor = default * config.floor_fraction
    return max(floor, current - default * config.step_fraction)


def restored_step(current: float, default: float, config: CappingConfig) -> float:
    """The next higher limit on the way back: one step up, not over the default."""
    return min(default, current + default * config.step_fraction)
