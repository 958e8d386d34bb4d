"""The periodic evaluation of thermal conditions: poll the sources, judge each domain, keep the changes.

Run by Celery beat (``facility.tasks.evaluate_conditions``) or by the embedded server's periodic thread.
Each round reads the configured sources (agents, prometheus, static, simulated), merges their fresh
readings per domain, runs :func:`facility.conditions.evaluate` from the stored state, writes the state
and a :class:`ConditionEvent` per change, and sends ``facility_changed`` when a condition that
placement reads has changed. A source that fails is marked down and its readings age out; it never
stops the round.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from agents.models import Node, NodeDomain, measured_fresh_seconds
from facility import conditions as cond
from facility import sources
from facility.domains import Domain, parse_domain
from facility.models import (
    ConditionEvent,
    ConditionOverride,
    DomainCondition,
    FacilitySettings,
    ScenarioRun,
    SourceStatus,
)
from facility.signals import conditions_evaluated, facility_changed
from facility.sources import (
    MAX_ABS_VALUE,
    MIN_ABS_SENSOR,
    THERMAL_REASONS,
    NodeThermal,
    Poll,
    SourcesConfig,
    agents_readings,
    merge_readings,
    node_thermal,
    parse_scenario,
    parse_sources_config,
    poll_prometheus,
    static_readings,
)
from llmgw import outbound

log = logging.getLogger(__name__)

EVENTS_KEPT_DAYS = 30
_TIMER_FIELDS = (
    "above_warm_since",
    "above_hot_since",
    "under_warm_band_since",
    "under_hot_band_since",
    "throttle_hot_since",
)


def conditions_config() -> cond.ConditionsConfig:
    """The stored facility.conditions (validated when applied)."""
    return cond.parse_conditions_config(FacilitySettings.load().conditions or None)


def sources_config() -> SourcesConfig:
    """The stored facility.sources (validated when applied)."""
    return parse_sources_config(FacilitySettings.load().sources or None)


def _epoch(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _moment(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.get_current_timezone())


def _figure_sql(value: str) -> str:
    """facility.sources.sensor_figure in SQL: a JSON number within ±MAX_ABS_VALUE (zero, or at least
    MIN_ABS_SENSOR from it) as float8, else NULL. The CASEs nest so that no cast meets what it cannot take."""
    number = f"CAST({value} AS numeric)"
    return (
        f"CASE WHEN jsonb_typeof({value}) = 'number' THEN CASE WHEN abs({number}) <= {MAX_ABS_VALUE:.0f} "
        f"AND ({number} = 0 OR abs({number}) >= {MIN_ABS_SENSOR!r}) THEN CAST({value} AS float8) END END"
    )


# Every node's sensors summed up by the database, as facility.sources.node_thermal sums up one: its
# inlet, its GPUs (the objects of sensors.gpus), those throttling for heat and the smallest margin.
# A lateral join over each document's GPUs; nothing but six figures a node comes back (the documents
# themselves, ~3 KB a node, would each be read and decoded by a worker on every round).
_THERMAL_SQL = f"""
SELECT n.id, n.sensors_at, {_figure_sql("n.sensors -> 'inlet_temperature_celsius'")}, g.cards, g.throttling, g.margin
FROM {Node._meta.db_table} n
CROSS JOIN LATERAL (
    SELECT count(*) AS cards,
           count(*) FILTER (WHERE jsonb_typeof(e -> 'throttle_reasons') = 'array'
                            AND e -> 'throttle_reasons' ?| %s) AS throttling,
           min({_figure_sql("e -> 'slowdown_temperature_celsius'")} - {_figure_sql("e -> 'temperature_celsius'")})
               AS margin
    FROM jsonb_array_elements(
        CASE WHEN jsonb_typeof(n.sensors -> 'gpus') = 'array' THEN n.sensors -> 'gpus' ELSE '[]'::jsonb END
    ) AS e
    WHERE jsonb_typeof(e) = 'object'
) AS g
WHERE n.sensors_at IS NOT NULL
"""


def _node_sensors() -> list[NodeThermal]:
    """Each node's latest sensors, summed up for the agents' source, with the node's domains."""
    domains: dict[int, list[Domain]] = {}
    parsed: dict[str, Domain] = {}  # a site's 50,000 rows name ~1,000 domains
    for node_id, text in NodeDomain.objects.values_list("node_id", "domain"):
        domain = parsed.get(text)
        if domain is None:
            domain = parsed[text] = parse_domain(text)
        domains.setdefault(node_id, []).append(domain)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_THERMAL_SQL, [sorted(THERMAL_REASONS)])
            return [
                NodeThermal(tuple(domains[node_id]), at.timestamp(), inlet, cards, throttling, margin)
                for node_id, at, inlet, cards, throttling, margin in cursor.fetchall()
                if node_id in domains
            ]
    # The embedded default (SQLite, a small cluster): the documents read and summed up here.
    return [
        node_thermal(tuple(domains[node_id]), sensors, at.timestamp())
        for node_id, sensors, at in Node.objects.exclude(sensors_at=None).values_list("id", "sensors", "sensors_at")
        if node_id in domains
    ]


def _status(name: str, poll: Poll | None, now: datetime, error: str = "") -> None:
    up = poll.up if poll is not None else not error
    errors = "; ".join(poll.errors) if poll is not None else error
    values: dict[str, Any] = {"up": up, "last_error": errors[:2000], "last_poll_at": now}
    if up:
        values["last_success_at"] = now
    SourceStatus.objects.update_or_create(name=name, defaults=values)


def _stored_poll(status: SourceStatus | None) -> dict[Domain, dict[str, cond.Reading]]:
    found: dict[Domain, dict[str, cond.Reading]] = {}
    for text, signals in ((status.readings if status else None) or {}).items():
        for signal, r in signals.items():
            found.setdefault(parse_domain(text), {})[signal] = cond.Reading(
                r["value"], r["at"], r["stale_after"], "prometheus"
            )
    return found


def _prometheus(config: SourcesConfig, now: datetime, client: Any) -> dict[Domain, dict[str, cond.Reading]]:
    """The last poll's readings; polls again when the interval has passed since the last poll."""
    source = config.prometheus
    status = SourceStatus.objects.filter(name="prometheus").first()
    due = status is None or status.last_poll_at is None or (now - status.last_poll_at).total_seconds() >= source.interval
    if not due:
        return _stored_poll(status)
    own_client = client is None
    if own_client:
        client = outbound.client(timeout=sources.PROMETHEUS_DEADLINE_SECONDS)
    try:
        poll = poll_prometheus(source.url, list(source.signals), client=client, now=now.timestamp())
    finally:
        if own_client:
            client.close()
    # Readings a poll did not give again (the source down, a series gone) keep their time and age out.
    readings = _stored_poll(status)
    for domain, signals in poll.readings.items():
        readings.setdefault(domain, {}).update(signals)
    stored = {
        str(domain): {s: {"value": r.value, "at": r.at, "stale_after": r.stale_after} for s, r in signals.items()}
        for domain, signals in readings.items()
        if any(r.is_fresh(now.timestamp()) for r in signals.values())
    }
    _status("prometheus", poll, now)
    SourceStatus.objects.filter(name="prometheus").update(readings=stored)
    return readings


def gather_readings(*, now: datetime, client: Any = None) -> dict[Domain, dict[str, cond.Reading]]:
    """Every configured source's fresh readings, merged per domain; each source's status written."""
    config = sources_config()
    epoch = now.timestamp()
    parts: list[Mapping[Domain, Mapping[str, cond.Reading]]] = []
    if config.agents:
        try:
            with transaction.atomic():  # a savepoint: a refusal here leaves the round's transaction usable
                nodes = _node_sensors()
        except DatabaseError as exc:  # a document the summary cannot read: the source is down, not the round
            log.warning("agents source failed: %s", exc)
            _status("agents", None, now, error=f"{type(exc).__name__}: {exc}"[:2000])
        else:
            parts.append(agents_readings(nodes, now=epoch, stale_after=measured_fresh_seconds()))
            _status("agents", None, now)
    if config.prometheus is not None:
        try:
            parts.append(_prometheus(config, now, client))
        except Exception as exc:  # a source that is down is a fact, never a crash; a time limit goes on
            if outbound.is_time_limit(exc):
                raise
            log.warning("prometheus source failed: %s", exc)
            _status("prometheus", None, now, error=f"{type(exc).__name__}: {exc}"[:2000])
    if config.static:
        parts.append(static_readings(config.static, now=epoch))
        _status("static", None, now)
    run = ScenarioRun.objects.first()
    if run is not None:
        try:
            scenario = parse_scenario(run.data)
            elapsed = (now - run.started_at).total_seconds() * run.speed
            parts.append(scenario.readings_at(elapsed, epoch))
            _status("simulated", None, now)
        except ValueError as exc:
            _status("simulated", None, now, error=str(exc))
    return merge_readings(*parts, now=epoch)


def _state_of(row: DomainCondition) -> cond.DomainState:
    timers = row.timers or {}
    return cond.DomainState(
        condition=row.condition, since=_epoch(row.since), **{f: timers.get(f) for f in _TIMER_FIELDS}
    )


def _replay() -> tuple[float, set[str]]:
    """The running scenario's speed and the domains it gives readings for (none at speed 1)."""
    run = ScenarioRun.objects.first()
    if run is None or run.speed == 1.0:
        return 1.0, set()
    try:
        tracks = parse_scenario(run.data).tracks
    except ValueError:
        return 1.0, set()
    return run.speed, {str(domain) for track in tracks for domain in track.domains}


def scenario_thresholds(thresholds: cond.Thresholds, speed: float) -> cond.Thresholds:
    """A replayed scenario's domain judged on the scenario's clock: its hold times shrink with the replay's
    speed as its readings do (at ×10 the 2 minutes above 32 °C that make a rack hot are 12 s of wall time)."""
    return dataclasses.replace(
        thresholds, enter_seconds=thresholds.enter_seconds / speed, leave_seconds=thresholds.leave_seconds / speed
    )


# What a round writes of each domain's row: all of it but its key.
_JUDGED_FIELDS = [f.name for f in DomainCondition._meta.concrete_fields if f.name not in {"id", "domain"}]


def conditions_evaluate(*, now: datetime | None = None, client: Any = None) -> list[ConditionEvent]:
    """One round: gather readings, judge every known domain, keep state and events; returns the events."""
    now = now or timezone.now()
    epoch = now.timestamp()
    readings = gather_readings(now=now, client=client)
    config = conditions_config()
    speed, replayed = _replay()
    rows = {row.domain: row for row in DomainCondition.objects.all()}
    domains = set(rows) | {str(d) for d in readings} | set(NodeDomain.objects.values_list("domain", flat=True))
    events: list[ConditionEvent] = []
    judged: list[DomainCondition] = []
    with transaction.atomic():
        for text in sorted(domains):
            row = rows.get(text) or DomainCondition(domain=text)
            fresh = readings.get(parse_domain(text), {})
            thresholds = config.rule(text).thresholds
            if text in replayed:
                thresholds = scenario_thresholds(thresholds, speed)
            state, change = cond.evaluate(_state_of(row), fresh, epoch, thresholds)
            row.condition = state.condition
            row.since = _moment(state.since)
            row.timers = {f: getattr(state, f) for f in _TIMER_FIELDS}
            # A signal that went stale keeps its last reading, so its age shows (and the stale alert fires).
            row.readings = {
                **(row.readings or {}),
                **{s: {"value": r.value, "at": r.at, "source": r.source} for s, r in fresh.items()},
            }
            row.evaluated_at = now
            if change is not None:
                row.reason = change.reason[:1000]
                events.append(
                    ConditionEvent(
                        domain=text, before=change.before, after=change.after, reason=change.reason[:1000],
                        readings=dict(change.readings), at=now,
                    )
                )
            judged.append(row)
        # Every domain's row in a few statements (one UPDATE a domain would be a round trip for each of
        # a large room's domains): the new ones inserted, the known ones updated by their domain.
        DomainCondition.objects.bulk_create(
            judged, update_conflicts=True, unique_fields=["domain"], update_fields=_JUDGED_FIELDS, batch_size=500
        )
        ConditionEvent.objects.bulk_create(events)
        ConditionEvent.objects.filter(at__lt=now - timedelta(days=EVENTS_KEPT_DAYS)).delete()
        expired = ConditionOverride.objects.filter(until__lte=now)
        changed = bool(events) or expired.exists()
        expired.delete()
        if changed:
            facility_changed.send(sender=DomainCondition)
    # After the round, outside its transaction: shedding and capping act on what it judged.
    conditions_evaluated.send(sender=DomainCondition, now=now)
    return events


def condition_stale_after() -> float:
    """How long ago a domain's condition may have been judged before it is shown as stale: three rounds of
    the evaluation (LLMGW_CONDITIONS_INTERVAL), at least two minutes. Past it, the round that judges
    conditions has stopped (the beat or the worker is down) and the condition is not today's."""
    return max(120.0, 3 * float(getattr(settings, "CONDITIONS_INTERVAL_SECONDS", 15.0)))


def effective_conditions(*, now: datetime | None = None) -> dict[str, dict[str, Any]]:
    """Each domain's condition as placement reads it: the override where one is set, else the evaluated one.

    ``{domain: {condition, enforce, detail, overridden, readings, age_seconds, since, inlet}}``; ``inlet`` is
    the latest inlet reading (``{celsius, at, source, warm_c, hot_c, above_since}``: epoch seconds, the
    thresholds, and since when it has stood above the edge of its warm or hot condition) or None, for a
    page that shows the figure and counts its time up live rather than a text frozen at its render.
    """
    now = now or timezone.now()
    epoch = now.timestamp()
    config = conditions_config()
    found: dict[str, dict[str, Any]] = {}
    for row in DomainCondition.objects.all():
        rule = config.rule(row.domain)
        values = {s: r["value"] for s, r in (row.readings or {}).items()}
        ages = [epoch - r["at"] for r in (row.readings or {}).values()]
        state = _state_of(row)
        found[row.domain] = {
            "condition": row.condition,
            "enforce": rule.enforce,
            "detail": cond.describe(row.condition, state, values, epoch, row.reason, rule.thresholds),
            "overridden": False,
            "readings": values,
            "age_seconds": max(0.0, max(ages)) if ages else None,
            "since": row.since,
            "inlet": _inlet_of(row, state, rule.thresholds),
            # Who read it (agents, prometheus, static, simulated), stale readings included.
            "sources": sorted({str(r.get("source") or "") for r in (row.readings or {}).values()}),
            # When it was last judged (epoch seconds): a condition judged long ago is not today's.
            "evaluated_at": row.evaluated_at.timestamp() if row.evaluated_at else None,
        }
    for override in ConditionOverride.objects.all():
        if override.until is not None and override.until <= now:
            continue
        entry = found.setdefault(
            override.domain,
            {"readings": {}, "age_seconds": None, "since": None, "inlet": None, "sources": [], "evaluated_at": None,
             "enforce": config.rule(override.domain).enforce},
        )
        entry.update(condition=override.condition, detail=f"set by hand: {override.reason}", overridden=True)
    return found


def _inlet_of(row: DomainCondition, state: cond.DomainState, thresholds: cond.Thresholds) -> dict[str, Any] | None:
    """The domain's latest inlet reading with its time, source and thresholds (None without one)."""
    reading = (row.readings or {}).get(cond.INLET)
    if not reading:
        return None
    above = state.above_hot_since if row.condition == cond.HOT else state.above_warm_since
    return {
        "celsius": reading["value"], "at": reading["at"], "source": reading.get("source") or "",
        "warm_c": thresholds.warm_inlet_c, "hot_c": thresholds.hot_inlet_c,
        "above_since": above if row.condition in (cond.HOT, cond.WARM) else None,
        "entering": _entering(row.condition, state, thresholds),
    }


def _entering(condition: str, state: cond.DomainState, thresholds: cond.Thresholds) -> dict[str, Any] | None:
    """The worse condition the inlet is on its way to, while it stands above that edge for less than the
    time a condition takes to enter (``{to, edge_c, since, after}``), else None: a rack reading 35 °C for
    20 s is still ok, and the page says how long until it is hot rather than "ok" beside 35 °C alone."""
    if condition != cond.HOT and state.above_hot_since is not None:
        to, edge, since = cond.HOT, thresholds.hot_inlet_c, state.above_hot_since
    elif condition in (cond.OK, cond.UNKNOWN) and state.above_warm_since is not None:
        to, edge, since = cond.WARM, thresholds.warm_inlet_c, state.above_warm_since
    else:
        return None
    return {"to": to, "edge_c": edge, "since": since, "after": cond.minutes_text(thresholds.enter_seconds)}
