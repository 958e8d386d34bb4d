"""Thermal conditions of a domain: ok, warm, hot or unknown, from readings, with hysteresis.

Pure: no Django, no clock (the time is passed in). A domain's condition moves only when a
reading has stayed past a threshold for a hold time, and leaves only when it has stayed back under
the threshold less a band for a longer one, so a probe that jitters around 27 °C does not flap.

| condition | enters when | leaves when |
|---|---|---|
| warm | inlet above ``warm_inlet_c`` for ``enter_seconds``, a GPU within ``slowdown_margin_c`` of its
  slowdown temperature, or any GPU throttling for heat | ``leave_seconds`` below ``warm_inlet_c −
  band_c``, nothing throttling, every GPU clear of its slowdown margin |
| hot | inlet above ``hot_inlet_c`` for ``enter_seconds``, a cooling alarm, or at least
  ``hot_throttle_share`` of the GPUs throttling for heat for ``enter_seconds`` | ``leave_seconds``
  under ``hot_inlet_c − band_c``, no alarm, throttling under the share |
| unknown | no fresh reading at all | a fresh reading |

Defaults: ASHRAE's recommended inlet envelope tops out at 27 °C and class A1 allows 32 °C
(REFERENCE.md); a Hopper card slows down at 89 °C.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from facility.configuration import ConfigError, parse_duration
from facility.domains import DomainError, parse_domain
from llmgw.errors import value_shown

OK, WARM, HOT, UNKNOWN = "ok", "warm", "hot", "unknown"
CONDITIONS: tuple[str, ...] = (OK, WARM, HOT, UNKNOWN)
# How bad a condition is, for "a node's condition is the worst of its domains'" (unknown places as ok).
SEVERITY = {UNKNOWN: 0, OK: 1, WARM: 2, HOT: 3}

# The signals a source may give for a domain.
INLET = "inlet_temp_c"
COOLING_ALARM = "cooling_alarm"
THROTTLE_SHARE = "thermal_throttle_share"
SLOWDOWN_MARGIN = "slowdown_margin_c"
POWER = "power_watts"
SIGNALS: tuple[str, ...] = (INLET, COOLING_ALARM, THROTTLE_SHARE, SLOWDOWN_MARGIN, POWER)

MODES = ("observe", "enforce")


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The figures a domain's condition is decided by; server.yaml may override each per domain."""

    warm_inlet_c: float = 27.0
    hot_inlet_c: float = 32.0
    band_c: float = 1.0
    enter_seconds: float = 120.0
    leave_seconds: float = 300.0
    slowdown_margin_c: float = 5.0
    hot_throttle_share: float = 0.25


@dataclass(frozen=True, slots=True)
class Reading:
    """A measured value with the time it was taken (epoch seconds) and how long it stays fresh."""

    value: float
    at: float
    stale_after: float = 120.0
    source: str = ""

    def is_fresh(self, now: float) -> bool:
        return now - self.at <= self.stale_after


@dataclass(frozen=True, slots=True)
class DomainState:
    """What the evaluator keeps about a domain between readings: the condition and its timers.

    Each ``*_since`` is when a predicate became continuously true (None while it is false or its
    reading is missing); ``since`` is when the condition last changed.
    """

    condition: str = UNKNOWN
    since: float | None = None
    above_warm_since: float | None = None
    above_hot_since: float | None = None
    under_warm_band_since: float | None = None
    under_hot_band_since: float | None = None
    throttle_hot_since: float | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of condition, with the readings that caused it and the reason in words."""

    before: str
    after: str
    at: float
    reason: str
    readings: Mapping[str, float] = field(default_factory=dict)


def _since(flag: bool, previous: float | None, now: float) -> float | None:
    if not flag:
        return None
    return previous if previous is not None else now


def _held(since: float | None, now: float, seconds: float) -> bool:
    return since is not None and now - since >= seconds


def minutes_text(seconds: float) -> str:
    """A duration as the condition texts say it (``40 s``, ``6 min``)."""
    return _minutes(seconds)


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1 else f"{seconds:.0f} s"


def evaluate(
    state: DomainState,
    readings: Mapping[str, Reading],
    now: float,
    thresholds: Thresholds = Thresholds(),
) -> tuple[DomainState, Transition | None]:
    """The domain's state after the readings at ``now``, and the transition if its condition changed."""
    t = thresholds
    fresh = {name: r for name, r in readings.items() if r.is_fresh(now)}
    inlet = fresh.get(INLET)
    alarm = fresh.get(COOLING_ALARM)
    throttle = fresh.get(THROTTLE_SHARE)
    margin = fresh.get(SLOWDOWN_MARGIN)

    has_inlet = inlet is not None
    above_warm = _since(has_inlet and inlet.value > t.warm_inlet_c, state.above_warm_since, now)
    above_hot = _since(has_inlet and inlet.value > t.hot_inlet_c, state.above_hot_since, now)
    under_warm = _since(
        has_inlet and inlet.value < t.warm_inlet_c - t.band_c, state.under_warm_band_since, now
    )
    under_hot = _since(has_inlet and inlet.value < t.hot_inlet_c - t.band_c, state.under_hot_band_since, now)
    throttling_hot = _since(
        throttle is not None and throttle.value >= t.hot_throttle_share, state.throttle_hot_since, now
    )
    alarmed = alarm is not None and alarm.value > 0
    throttling = throttle is not None and throttle.value > 0
    near_slowdown = margin is not None and margin.value <= t.slowdown_margin_c

    # Entry, worst first.
    hot_reasons: list[str] = []
    if _held(above_hot, now, t.enter_seconds):
        hot_reasons.append(
            f"inlet {inlet.value:.1f} °C for {_minutes(now - above_hot)}, hot above {t.hot_inlet_c:g} °C"
        )
    if alarmed:
        hot_reasons.append("cooling alarm")
    if _held(throttling_hot, now, t.enter_seconds):
        hot_reasons.append(
            f"{throttle.value:.0%} of GPUs throttling for heat for {_minutes(now - throttling_hot)}"
        )
    warm_reasons: list[str] = []
    if _held(above_warm, now, t.enter_seconds):
        warm_reasons.append(
            f"inlet {inlet.value:.1f} °C for {_minutes(now - above_warm)}, warm above {t.warm_inlet_c:g} °C"
        )
    if near_slowdown:
        warm_reasons.append(f"a GPU {margin.value:.0f} °C from its slowdown temperature")
    if throttling:
        warm_reasons.append(f"{throttle.value:.0%} of GPUs throttling for heat")

    current = state.condition
    if not fresh:
        after, reason = UNKNOWN, "no fresh reading"
    elif hot_reasons:
        after, reason = HOT, "; ".join(hot_reasons)
    elif current == HOT and not _held(under_hot, now, t.leave_seconds):
        # Stays hot until the inlet has been back under the band for the hold time (or nothing says).
        after, reason = (HOT, "") if has_inlet else (_settle(warm_reasons), "no inlet reading")
    elif warm_reasons:
        after, reason = WARM, "; ".join(warm_reasons)
    elif current in (HOT, WARM) and has_inlet and not _held(under_warm, now, t.leave_seconds):
        after, reason = WARM, ""
    else:
        after, reason = OK, ""

    if after == current:
        reason = ""
    elif current == UNKNOWN and after == OK:
        reason = "fresh readings"
    elif current == HOT and after == WARM and has_inlet:
        left = f"inlet {inlet.value:.1f} °C under {t.hot_inlet_c - t.band_c:g} °C for {_minutes(t.leave_seconds)}"
        reason = f"{left}; {reason}" if reason else left
    elif after == OK:
        value = f"inlet {inlet.value:.1f} °C" if has_inlet else "readings"
        reason = f"{value} back to normal for {_minutes(t.leave_seconds)}"

    new_state = DomainState(
        condition=after,
        since=now if after != current else state.since,
        above_warm_since=above_warm,
        above_hot_since=above_hot,
        under_warm_band_since=under_warm,
        under_hot_band_since=under_hot,
        throttle_hot_since=throttling_hot,
    )
    if after == current:
        return new_state, None
    values = {name: r.value for name, r in fresh.items()}
    return new_state, Transition(current, after, now, reason, values)


def _settle(warm_reasons: list[str]) -> str:
    return WARM if warm_reasons else OK


def worst(conditions: list[str]) -> str:
    """A node's condition: the worst of its domains' (unknown counts only when nothing else is known)."""
    if not conditions:
        return UNKNOWN
    return max(conditions, key=lambda c: SEVERITY[c])


def replace(state: DomainState, **changes) -> DomainState:
    """A copy of ``state`` with ``changes`` (for overrides and tests)."""
    return dataclasses.replace(state, **changes)


# --- server.yaml's facility.conditions --------------------------------------------------------------

THRESHOLD_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Thresholds))
# Hold times are written as durations; the rest are numbers.
_DURATION_KEYS = frozenset({"enter_seconds", "leave_seconds"})
THRESHOLD_BOUNDS: dict[str, tuple[float, float]] = {
    "warm_inlet_c": (-40.0, 150.0),
    "hot_inlet_c": (-40.0, 150.0),
    "band_c": (0.0, 50.0),
    "enter_seconds": (0.0, 86_400.0),
    "leave_seconds": (0.0, 86_400.0),
    "slowdown_margin_c": (0.0, 100.0),
    "hot_throttle_share": (0.0, 1.0),
}


@dataclass(frozen=True, slots=True)
class DomainRule:
    """A domain's thresholds and mode: the cluster-wide ones, or its own override."""

    thresholds: Thresholds = Thresholds()
    mode: str = "observe"

    @property
    def enforce(self) -> bool:
        return self.mode == "enforce"


@dataclass(frozen=True, slots=True)
class ConditionsConfig:
    """``facility.conditions``: the mode (observe by default), thresholds, and per-domain overrides."""

    default: DomainRule = DomainRule()
    domains: Mapping[str, DomainRule] = field(default_factory=dict)

    def rule(self, domain: str) -> DomainRule:
        """The rule of a domain (``rack:r12-07``): its own, or the cluster's."""
        return self.domains.get(domain, self.default)


def _threshold_value(key: str, value: object, path: tuple) -> float:
    if key in _DURATION_KEYS:
        try:
            number = parse_duration(value)
        except ValueError as exc:
            raise ConfigError(path, str(exc)) from None
    elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(path, f"a number, not {value_shown(value)}")
    else:
        number = float(value)
    lo, hi = THRESHOLD_BOUNDS[key]
    if not lo <= number <= hi:
        raise ConfigError(path, f"between {lo:g} and {hi:g}, got {number:g}")
    return number


def _rule(raw: object, base: DomainRule, path: tuple, *, allow_domains: bool) -> tuple[DomainRule, object]:
    if not isinstance(raw, Mapping):
        raise ConfigError(path, "a mapping of mode and thresholds")
    allowed = ("mode", "thresholds", *(("domains",) if allow_domains else ()))
    for key in raw:
        if key not in allowed:
            raise ConfigError((*path, key), f"unknown key; this block takes: {', '.join(allowed)}")
    mode = raw.get("mode", base.mode)
    if mode not in MODES:
        raise ConfigError((*path, "mode"), f"one of {', '.join(MODES)}, not {value_shown(mode)}")
    thresholds_raw = raw.get("thresholds") or {}
    if not isinstance(thresholds_raw, Mapping):
        raise ConfigError((*path, "thresholds"), f"a mapping of {', '.join(THRESHOLD_KEYS)}")
    values = {}
    for key, value in thresholds_raw.items():
        if key not in THRESHOLD_KEYS:
            raise ConfigError((*path, "thresholds", key), f"unknown threshold; thresholds are {', '.join(THRESHOLD_KEYS)}")
        values[key] = _threshold_value(key, value, (*path, "thresholds", key))
    thresholds = dataclasses.replace(base.thresholds, **values)
    if thresholds.hot_inlet_c < thresholds.warm_inlet_c:
        raise ConfigError((*path, "thresholds", "hot_inlet_c"), "at least warm_inlet_c")
    return DomainRule(thresholds, mode), raw.get("domains")


def parse_conditions_config(raw: object) -> ConditionsConfig:
    """``{mode, thresholds, domains: {rack:r12-07: {mode, thresholds}}}`` → ConditionsConfig; ConfigError names the path."""
    if raw is None:
        return ConditionsConfig()
    default, domains_raw = _rule(raw, DomainRule(), (), allow_domains=True)
    domains = domain_overrides(
        domains_raw, "{mode, thresholds}",
        lambda rule_raw, path: _rule(rule_raw, default, path, allow_domains=False)[0],
    )
    return ConditionsConfig(default, domains)


def domain_overrides(raw: object, keys: str, parse_one) -> dict[str, Any]:
    """A block's ``domains:`` mapping (``rack:r12-07: {...}``): each domain checked and its rule parsed
    by ``parse_one(rule_raw, path)``; ConfigError names the path. Shared by conditions and shedding."""
    found: dict[str, Any] = {}
    if raw is None:
        return found
    if not isinstance(raw, Mapping):
        raise ConfigError(("domains",), f"a mapping of domain (rack:r12-07) to {keys}")
    for name, rule_raw in raw.items():
        try:
            domain = str(parse_domain(name))
        except DomainError as exc:
            raise ConfigError(("domains", name), str(exc)) from None
        found[domain] = parse_one(rule_raw, ("domains", name))
    return found


def describe(
    condition: str, state: DomainState, values: Mapping[str, float], now: float, reason: str,
    thresholds: Thresholds = Thresholds(),
) -> str:
    """A condition's reading in words, now, from the latest reading: ``inlet 33.1 °C for 6 min, hot above
    32 °C``; while the condition waits to leave, the reading now and how long it has been back under
    (``inlet 24.0 °C, under 31 °C for 40 s of the 5 min hot takes to leave``), never the reading that made
    it hot; else ``reason`` (an alarm, GPUs throttling, or no inlet reading)."""
    inlet = values.get(INLET)
    t = thresholds
    if condition not in (HOT, WARM) or inlet is None:
        return reason
    above = state.above_hot_since if condition == HOT else state.above_warm_since
    edge = t.hot_inlet_c if condition == HOT else t.warm_inlet_c
    if above is not None:
        return f"inlet {inlet:.1f} °C for {_minutes(now - above)}, {condition} above {edge:g} °C"
    if reason and not reason.startswith("inlet "):
        # Entered for an alarm or GPUs throttling: that reason, with the inlet as it reads now.
        return f"{reason}; inlet {inlet:.1f} °C now"
    under = state.under_hot_band_since if condition == HOT else state.under_warm_band_since
    if under is not None:
        return (
            f"inlet {inlet:.1f} °C, under {edge - t.band_c:g} °C for {_minutes(now - under)} of the "
            f"{_minutes(t.leave_seconds)} {condition} takes to leave"
        )
    return f"inlet {inlet:.1f} °C, {condition} until it stays under {edge - t.band_c:g} °C for {_minutes(t.leave_seconds)}"
