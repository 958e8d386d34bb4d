"""Facility data sources that are not the agents: Prometheus instant queries and replayed scenarios.

Pure of Django: each source turns its input into readings per domain, ``{Domain: {signal: Reading}}``,
and says whether it is up. A source that is down is a fact to show, never a block: its readings
simply go missing and age out.

- **prometheus**: configured instant queries, each a signal whose result label names a domain
  (``max by (rack) (dcim_rack_inlet_temperature_celsius)`` with ``domain_label: rack``).
- **simulated**: a scenario file of signals over time (linear between points), replayed from a start
  time at a speed, for tests and for rehearsing a thermal event on the demo.

Kept in one module: every source's parsing of its server.yaml block, its reading and its status
share the Reading and Domain rules above; split, each part would import the others.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from facility.conditions import INLET, SIGNALS, SLOWDOWN_MARGIN, THROTTLE_SHARE, Reading
from facility.configuration import ConfigError, parse_duration
from facility.domains import LEVELS, Domain, DomainError, parse_domain
from llmgw import outbound
from llmgw.errors import value_shown

# A query result beyond these is a mistake, not a measurement.
MAX_ABS_VALUE = 1e9
MAX_QUERY_LENGTH = 4000
MAX_SERIES = 20_000


@dataclass(frozen=True, slots=True)
class QuerySignal:
    """One configured Prometheus query: which signal it gives, and which label names the domain."""

    signal: str
    query: str
    domain_label: str
    stale_after: float = 120.0

    @property
    def level(self) -> str:
        return self.domain_label


@dataclass
class Poll:
    """What one poll of a source gave: readings per domain, and the errors met (empty when up)."""

    readings: dict[Domain, dict[str, Reading]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def up(self) -> bool:
        return not self.errors


def parse_query_signals(raw: Mapping[str, Any]) -> list[QuerySignal]:
    """``{inlet_temp_c: {query, domain_label, stale_after}}`` → QuerySignals; ValueError names the key."""
    found: list[QuerySignal] = []
    for signal, spec in raw.items():
        if signal not in SIGNALS:
            raise ValueError(f"{signal}: unknown signal; signals are {', '.join(SIGNALS)}")
        if not isinstance(spec, Mapping):
            raise ValueError(f"{signal}: write query, domain_label and stale_after")
        unknown = set(spec) - {"query", "domain_label", "stale_after"}
        if unknown:
            raise ValueError(f"{signal}.{sorted(unknown)[0]}: unknown key")
        query = spec.get("query")
        if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_LENGTH:
            raise ValueError(f"{signal}.query: a PromQL query of 1 to {MAX_QUERY_LENGTH} characters")
        label = spec.get("domain_label")
        if label not in LEVELS:
            raise ValueError(f"{signal}.domain_label: one of {', '.join(LEVELS)}")
        try:
            stale = parse_duration(spec.get("stale_after", 120))
        except ValueError as exc:
            raise ValueError(f"{signal}.stale_after: {exc}") from None
        found.append(QuerySignal(signal, query, label, stale))
    return found


def readings_from_vector(
    signal: QuerySignal, result: Any, *, now: float, source: str = "prometheus"
) -> tuple[dict[Domain, Reading], list[str]]:
    """Readings from one instant query's ``data.result``; series without the label are named as errors."""
    readings: dict[Domain, Reading] = {}
    errors: list[str] = []
    if not isinstance(result, list):
        return readings, [f"{signal.signal}: the answer is not a vector"]
    for item in result[:MAX_SERIES]:
        try:
            labels = item["metric"]
            stamp, text = item["value"]
            value = float(text)
            stamp = float(stamp)
        except (KeyError, TypeError, ValueError):
            errors.append(f"{signal.signal}: a series without a value")
            continue
        name = labels.get(signal.domain_label) if isinstance(labels, Mapping) else None
        if not name:
            errors.append(f"{signal.signal}: a series has no {signal.domain_label!r} label")
            continue
        if not math.isfinite(value) or abs(value) > MAX_ABS_VALUE:
            continue  # NaN from a division by zero, say: no reading rather than a wrong one
        try:
            domain = parse_domain(f"{signal.domain_label}:{name}")
        except DomainError:
            errors.append(f"{signal.signal}: {signal.domain_label}={value_shown(name)} is not a domain name")
            continue
        at = min(stamp, now)
        previous = readings.get(domain)
        if previous is None or value > previous.value:  # two series for one domain: the worse one
            readings[domain] = Reading(value, at, signal.stale_after, source)
    return readings, errors


# One poll of every query together: past this the source is down for this round, never placement's wait.
PROMETHEUS_DEADLINE_SECONDS = 5.0
# A query's answer: a vector of a few thousand series is well below it.
PROMETHEUS_MAX_BYTES = 8 * 1024 * 1024


def poll_prometheus(
    url: str, signals: list[QuerySignal], *, client: Any, now: float,
    deadline_seconds: float = PROMETHEUS_DEADLINE_SECONDS,
) -> Poll:
    """Run each query against ``url`` (``client``: llmgw.outbound.client()), all within ``deadline_seconds``
    (connect, status line, headers and body together) and each answer within PROMETHEUS_MAX_BYTES; never
    raises for a bad or slow answer (a task's time limit still goes through)."""
    poll = Poll()
    base = url.rstrip("/")
    deadline_at = time.monotonic() + deadline_seconds
    for signal in signals:
        left = deadline_at - time.monotonic()
        try:
            if left <= 0:
                raise outbound.OutboundError(f"not asked: the poll's {deadline_seconds:g} s were spent")
            answer = outbound.get(
                client, f"{base}/api/v1/query", params={"query": signal.query},
                deadline_seconds=left, max_bytes=PROMETHEUS_MAX_BYTES,
            )
            body = answer.json()
        except outbound.OutboundError as exc:
            poll.errors.append(f"{signal.signal}: {exc}")
            continue
        except Exception as exc:  # a source that is down is a fact, never a crash
            if outbound.is_time_limit(exc):
                raise
            poll.errors.append(f"{signal.signal}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        if answer.status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            poll.errors.append(f"{signal.signal}: HTTP {answer.status} {str(error or '')[:200]}".rstrip())
            continue
        data = body.get("data") or {}
        found, errors = readings_from_vector(signal, data.get("result"), now=now)
        poll.errors.extend(errors)
        for domain, reading in found.items():
            poll.readings.setdefault(domain, {})[signal.signal] = reading
    return poll


# --- simulated: a scenario replayed in time ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Track:
    """One signal of one or more domains over time: (seconds, value) points, linear between them."""

    domains: tuple[Domain, ...]
    signal: str
    points: tuple[tuple[float, float], ...]
    stale_after: float = 120.0

    def value_at(self, elapsed: float) -> float | None:
        """The value ``elapsed`` seconds into the scenario; the last point holds after the end."""
        if not self.points or elapsed < self.points[0][0]:
            return None
        for (t0, v0), (t1, v1) in zip(self.points, self.points[1:], strict=False):
            if t0 <= elapsed <= t1:
                return v0 if t1 == t0 else v0 + (v1 - v0) * (elapsed - t0) / (t1 - t0)
        return self.points[-1][1]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named list of tracks: ``llmgw/demo/scenarios/crac-failure.yaml``."""

    name: str
    tracks: tuple[Track, ...]
    duration: float

    def readings_at(self, elapsed: float, now: float) -> dict[Domain, dict[str, Reading]]:
        """Every track's reading at ``elapsed`` seconds into the scenario, stamped ``now``."""
        found: dict[Domain, dict[str, Reading]] = {}
        for track in self.tracks:
            value = track.value_at(elapsed)
            if value is None:
                continue
            for domain in track.domains:
                found.setdefault(domain, {})[track.signal] = Reading(value, now, track.stale_after, "simulated")
        return found


MAX_TRACKS = 1000
MAX_POINTS = 10_000
# A scenario is read again at each evaluation: all its tracks together stay within these.
MAX_TOTAL_POINTS = 100_000
MAX_TOTAL_DOMAINS = 20_000


def parse_scenario(data: Any) -> Scenario:
    """A scenario from its YAML data; ValueError names the path that is wrong (``tracks.0.points.2``)."""
    if not isinstance(data, Mapping):
        raise ValueError("a scenario is a mapping with name and tracks")
    unknown = set(data) - {"kind", "name", "tracks"}
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: unknown key; a scenario has kind, name and tracks")
    if data.get("kind", "FacilityScenario") != "FacilityScenario":
        raise ValueError("kind: a scenario's kind is FacilityScenario")
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name):
        raise ValueError("name: 1 to 100 letters, digits, '.', '_' or '-'")
    raw_tracks = data.get("tracks")
    if not isinstance(raw_tracks, list) or not raw_tracks or len(raw_tracks) > MAX_TRACKS:
        raise ValueError(f"tracks: a list of 1 to {MAX_TRACKS} tracks")
    tracks: list[Track] = []
    total_points = total_domains = 0
    for i, raw in enumerate(raw_tracks):
        where = f"tracks.{i}"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: a track has domains, signal and points")
        for key, limit in (("points", MAX_TOTAL_POINTS), ("domains", MAX_TOTAL_DOMAINS)):
            items = raw.get(key)
            count = len(items) if isinstance(items, list) else 1
            if key == "points":
                total_points += count
                total = total_points
            else:
                total_domains += count
                total = total_domains
            if total > limit:
                raise ValueError(f"{where}.{key}: more than {limit:,} {key} in all the tracks together")
        unknown = set(raw) - {"domains", "signal", "points", "stale_after"}
        if unknown:
            raise ValueError(f"{where}.{sorted(unknown)[0]}: unknown key")
        names = raw.get("domains")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names or len(names) > MAX_SERIES:
            raise ValueError(f"{where}.domains: one domain (rack:r1-01) or a list of them")
        domains = []
        for j, text in enumerate(names):
            try:
                domains.append(parse_domain(text))
            except DomainError as exc:
                raise ValueError(f"{where}.domains.{j}: {exc}") from None
        signal = raw.get("signal")
        if signal not in SIGNALS:
            raise ValueError(f"{where}.signal: one of {', '.join(SIGNALS)}")
        points_raw = raw.get("points")
        if not isinstance(points_raw, list) or not points_raw or len(points_raw) > MAX_POINTS:
            raise ValueError(f"{where}.points: a list of [time, value] pairs, 1 to {MAX_POINTS}")
        points: list[tuple[float, float]] = []
        for j, point in enumerate(points_raw):
            if not isinstance(point, list | tuple) or len(point) != 2:
                raise ValueError(f"{where}.points.{j}: write [time, value], e.g. [5m, 31.5]")
            try:
                at = parse_duration(point[0])
            except ValueError as exc:
                raise ValueError(f"{where}.points.{j}: {exc}") from None
            value = point[1]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or abs(value) > MAX_ABS_VALUE:
                raise ValueError(f"{where}.points.{j}: the value is a number within ±{MAX_ABS_VALUE:g}")
            if points and at < points[-1][0]:
                raise ValueError(f"{where}.points.{j}: times go forward")
            points.append((at, float(value)))
        try:
            stale = parse_duration(raw.get("stale_after", 120))
        except ValueError as exc:
            raise ValueError(f"{where}.stale_after: {exc}") from None
        tracks.append(Track(tuple(domains), signal, tuple(points), stale))
    duration = max(t.points[-1][0] for t in tracks)
    return Scenario(name, tuple(tracks), duration)


# --- server.yaml's facility.sources --------------------------------------------------------------------

SOURCE_NAMES = ("agents", "prometheus", "static", "simulated")
MAX_SPEED = 10_000.0


@dataclass(frozen=True, slots=True)
class PrometheusSource:
    """Where the Prometheus is, how often to ask it, and which queries give which signal."""

    url: str
    interval: float = 30.0
    signals: tuple[QuerySignal, ...] = ()


@dataclass(frozen=True, slots=True)
class SourcesConfig:
    """``facility.sources``: which sources give readings (the agents' unless turned off)."""

    agents: bool = True
    prometheus: PrometheusSource | None = None
    static: Mapping[Domain, Mapping[str, float]] = field(default_factory=dict)
    simulated_file: str | None = None
    simulated_speed: float = 1.0


def parse_sources_config(raw: Any) -> SourcesConfig:
    """The sources block → SourcesConfig; ConfigError names the path (``prometheus.signals.inlet_temp_c``)."""

    if raw is None:
        return SourcesConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError((), f"a mapping with any of {', '.join(SOURCE_NAMES)}")
    for key in raw:
        if key not in SOURCE_NAMES:
            raise ConfigError((key,), f"unknown source; sources are {', '.join(SOURCE_NAMES)}")
    agents = raw.get("agents", True)
    if not isinstance(agents, bool):
        raise ConfigError(("agents",), "true or false")
    prometheus = None
    if raw.get("prometheus") is not None:
        block = raw["prometheus"]
        if not isinstance(block, Mapping):
            raise ConfigError(("prometheus",), "a mapping of url, interval and signals")
        for key in block:
            if key not in ("url", "interval", "signals"):
                raise ConfigError(("prometheus", key), "unknown key; prometheus takes: url, interval, signals")
        url = block.get("url")
        if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s]{1,1000}", url):
            raise ConfigError(("prometheus", "url"), "an http(s) URL, e.g. http://monitoring:9090")
        try:
            interval = parse_duration(block.get("interval", 30))
        except ValueError as exc:
            raise ConfigError(("prometheus", "interval"), str(exc)) from None
        if not 1 <= interval <= 3600:
            raise ConfigError(("prometheus", "interval"), "between 1 s and 1 h")
        signals_raw = block.get("signals")
        if not isinstance(signals_raw, Mapping) or not signals_raw:
            raise ConfigError(("prometheus", "signals"), "a mapping of signal to {query, domain_label, stale_after}")
        try:
            signals = parse_query_signals(signals_raw)
        except ValueError as exc:
            where, _, message = str(exc).partition(": ")
            raise ConfigError(("prometheus", "signals", *where.split(".")), message) from None
        prometheus = PrometheusSource(url, interval, tuple(signals))
    static: dict[Domain, dict[str, float]] = {}
    static_raw = raw.get("static") or {}
    if not isinstance(static_raw, Mapping):
        raise ConfigError(("static",), "a mapping of domain (rack:r1-01) to {signal: value}")
    for name, values in static_raw.items():
        try:
            domain = parse_domain(name)
        except DomainError as exc:
            raise ConfigError(("static", name), str(exc)) from None
        if not isinstance(values, Mapping):
            raise ConfigError(("static", name), "a mapping of signal to value")
        for signal, value in values.items():
            if signal not in SIGNALS:
                raise ConfigError(("static", name, signal), f"unknown signal; signals are {', '.join(SIGNALS)}")
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or abs(value) > MAX_ABS_VALUE:
                raise ConfigError(("static", name, signal), "a number")
            static.setdefault(domain, {})[signal] = float(value)
    simulated_file, speed = None, 1.0
    if raw.get("simulated") is not None:
        block = raw["simulated"]
        if not isinstance(block, Mapping):
            raise ConfigError(("simulated",), "a mapping of file and speed")
        for key in block:
            if key not in ("file", "speed"):
                raise ConfigError(("simulated", key), "unknown key; simulated takes: file, speed")
        simulated_file = block.get("file")
        if not isinstance(simulated_file, str) or not simulated_file.strip():
            raise ConfigError(("simulated", "file"), "the path of a scenario file")
        speed = block.get("speed", 1)
        if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0 < speed <= MAX_SPEED:
            raise ConfigError(("simulated", "speed"), f"a number above 0, at most {MAX_SPEED:g}")
        speed = float(speed)
    return SourcesConfig(agents, prometheus, static, simulated_file, speed)


def static_readings(values: Mapping[Domain, Mapping[str, float]], *, now: float) -> dict[Domain, dict[str, Reading]]:
    """The static source's fixed values, fresh whenever asked."""
    return {
        domain: {signal: Reading(value, now, math.inf, "static") for signal, value in signals.items()}
        for domain, signals in values.items()
    }


# --- the agents' source: what nodes read about themselves, per domain ------------------------------------

THERMAL_REASONS = frozenset({"sw_thermal", "hw_thermal"})


@dataclass(frozen=True, slots=True)
class NodeThermal:
    """What the agents' source takes of one node's latest sensors (:func:`node_thermal`), and when
    they were taken: its inlet temperature, how many of its GPUs report and how many of those throttle
    for heat, and its hottest GPU's margin to the slowdown temperature (None where none says)."""

    domains: tuple[Domain, ...]
    at: float
    inlet: float | None = None
    cards: int = 0
    throttling: int = 0
    margin: float | None = None


# Below this (and not zero) a figure is no reading: PostgreSQL cannot hold it as a double.
MIN_ABS_SENSOR = 1e-300


def sensor_figure(value: Any) -> float | None:
    """A figure of a sensors document as the agents' source takes it: a JSON number within
    ±MAX_ABS_VALUE (zero, or at least MIN_ABS_SENSOR from it), else None (absent). The database's
    summary of the documents says the same; -0.0 is 0.0, as the database has no negative zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if abs(value) > MAX_ABS_VALUE or (value and abs(value) < MIN_ABS_SENSOR):
        return None
    return float(value) + 0.0


def node_thermal(domains: tuple[Domain, ...], sensors: Any, at: float) -> NodeThermal:
    """One node's sensors document, as its agent sent it, summed up for the agents' source.

    The reference for the database's summary of every node at once (facility.evaluation on PostgreSQL,
    held to this by a test): a GPU is an object of ``sensors.gpus``; it throttles for heat when its
    ``throttle_reasons`` list names a thermal reason; its margin needs both temperatures."""
    s = sensors if isinstance(sensors, Mapping) else {}
    gpus = s.get("gpus")
    cards = [g for g in gpus if isinstance(g, Mapping)] if isinstance(gpus, list) else []
    throttling = 0
    margins = []
    for g in cards:
        reasons = g.get("throttle_reasons")
        if isinstance(reasons, list) and any(isinstance(r, str) and r in THERMAL_REASONS for r in reasons):
            throttling += 1
        slowdown, temperature = sensor_figure(g.get("slowdown_temperature_celsius")), sensor_figure(g.get("temperature_celsius"))
        if slowdown is not None and temperature is not None:
            margins.append(slowdown - temperature)
    return NodeThermal(domains, at, sensor_figure(s.get("inlet_temperature_celsius")), len(cards), throttling,
                       min(margins) if margins else None)


def agents_readings(
    nodes: list[NodeThermal], *, now: float, stale_after: float = 120.0
) -> dict[Domain, dict[str, Reading]]:
    """Per domain: inlet (the highest of its nodes'), the share of its GPUs throttling for heat, and the
    hottest GPU's margin to its slowdown temperature (where the driver gives it). Stale nodes are left out."""
    inlet: dict[Domain, tuple[float, float]] = {}
    gpus: dict[Domain, list[int]] = {}  # [throttling, total]
    margin: dict[Domain, float] = {}
    oldest: dict[Domain, float] = {}
    for node in nodes:
        if now - node.at > stale_after:
            continue
        node_inlet, cards, node_margin = node.inlet, node.cards, node.margin
        for domain in node.domains:
            if node_inlet is not None and (domain not in inlet or node_inlet > inlet[domain][0]):
                inlet[domain] = (node_inlet, node.at)
            if cards:
                counts = gpus.setdefault(domain, [0, 0])
                counts[0] += node.throttling
                counts[1] += cards
            if node_margin is not None:
                margin[domain] = min(margin.get(domain, math.inf), node_margin)
            if node_inlet is not None or cards:
                oldest[domain] = min(oldest.get(domain, node.at), node.at)
    found: dict[Domain, dict[str, Reading]] = {}
    for domain, (value, at) in inlet.items():
        found.setdefault(domain, {})[INLET] = Reading(value, at, stale_after, "agents")
    for domain, (throttling, total) in gpus.items():
        found.setdefault(domain, {})[THROTTLE_SHARE] = Reading(throttling / total, oldest[domain], stale_after, "agents")
    for domain, value in margin.items():
        found.setdefault(domain, {})[SLOWDOWN_MARGIN] = Reading(value, oldest[domain], stale_after, "agents")
    return found


def merge_readings(
    *sources: Mapping[Domain, Mapping[str, Reading]], now: float
) -> dict[Domain, dict[str, Reading]]:
    """Several sources' fresh readings in one: for a signal given twice, the worse value (the smaller margin)."""
    merged: dict[Domain, dict[str, Reading]] = {}
    for readings in sources:
        for domain, signals in readings.items():
            into = merged.setdefault(domain, {})
            for signal, reading in signals.items():
                old = into.get(signal)
                if not reading.is_fresh(now):
                    continue
                if old is None:
                    into[signal] = reading
                elif signal == SLOWDOWN_MARGIN:
                    into[signal] = reading if reading.value < old.value else old
                elif reading.value > old.value:
                    into[signal] = reading
    return merged
