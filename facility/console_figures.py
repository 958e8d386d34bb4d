"""The Facility page's costly figures — what shedding would do next, the N−1 report and the feeds' loads —
worked out when their inputs change (or once the readings in them are FIGURES_SECONDS old), not on every
load.

Each reads or plans on the whole site (shedding tries each candidate's replacement on the placement index;
N−1 judges every feed's loss; a feed's load is every node behind it), so on a large site they cost more
than the rest of the page. They are kept in Django's cache (locmem embedded, Redis where
REDIS_URL is set, shared by every web process) with the facility's version they were worked out at: one
query of counts, newest ids and times of what they are worked out from (budgets, feeds, settings, holds,
conditions, overrides, nodes and their domains, models, replicas and shards). Readings (measured draw,
inlet) change with every heartbeat: they are not in the version; the figures are worked out again once
FIGURES_SECONDS old.

Who works them out:

- On workers (Redis), the worker (:func:`refresh`, one task pending at a time, llmgw.coalesce). A page that
  finds its figures behind the version or old shows the ones kept, with their age, and asks for the task;
  the task tells the open pages when N−1 or shedding's moves changed, and goes again while the version
  moved under it. A page load then costs a version query, never a plan: in the web process a plan would
  take the CPU its heartbeats need. Only figures older than STALE_SECONDS (no worker has kept
  them) or none at all are worked out by the page itself.
- Embedded (no Redis: no worker), the page, on a new version: figures from before a change are never shown.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from celery import shared_task
from django.conf import settings
from django.core.cache import cache
from django.db import connection

from agents.models import Node, NodeDomain, StoreLabel
from facility import feed_selectors
from facility.models import (
    Budget,
    ConditionEvent,
    ConditionOverride,
    DomainCondition,
    FacilitySettings,
    Feed,
    Hold,
)
from placement.models import Model, Replica, Shard

CACHE_PREFIX = "llmgw:facility-figures:"

log = logging.getLogger(__name__)
# The clock the figures' age is read on (a test moves it).
clock = time.time
# A cache that failed to answer (Redis down) is not asked again for this long: each try costs up to
# LLMGW_REDIS_TIMEOUT, and a page asks for three figures.
CACHE_DOWN_SECONDS = 30.0
_cache_down_until = 0.0


def figures_seconds() -> float:
    """How old the figures may grow before they are worked out again (LLMGW_FACILITY_FIGURES_SECONDS)."""
    return float(getattr(settings, "FACILITY_FIGURES_SECONDS", 30.0))


def _version_sql() -> str:
    def table(model: type) -> str:
        return connection.ops.quote_name(model._meta.db_table)

    parts = []
    for model, columns in (
        (Budget, ("COUNT(*)", "MAX(updated_at)")),
        (Feed, ("COUNT(*)", "MAX(updated_at)")),
        (FacilitySettings, ("MAX(updated_at)",)),
        (Hold, ("COUNT(*)", "MAX(id)")),
        (ConditionOverride, ("COUNT(*)", "MAX(id)")),
        (ConditionEvent, ("MAX(id)",)),
        (DomainCondition, ("COUNT(*)",)),
        (Node, ("COUNT(*)", "MAX(id)")),
        (NodeDomain, ("COUNT(*)", "MAX(id)")),
        (StoreLabel, ("COUNT(*)", "MAX(updated_at)")),
        (Model, ("COUNT(*)", "MAX(updated_at)")),
        (Replica, ("COUNT(*)", "MAX(id)")),
        (Shard, ("COUNT(*)", "MAX(id)")),
    ):
        parts.extend(f"(SELECT {column} FROM {table(model)})" for column in columns)
    # The conditions' changes: a domain turning hot writes its DomainCondition row and an event.
    parts.append(f"(SELECT COUNT(*) FROM {table(DomainCondition)} WHERE {connection.ops.quote_name('condition')} IN ('hot', 'warm'))")
    return "SELECT " + ", ".join(parts)


def facility_version() -> str:
    """A fingerprint of what the figures are worked out from (one query): equal while nothing changed."""
    with connection.cursor() as cursor:
        cursor.execute(_version_sql())
        row = cursor.fetchone()
    return hashlib.blake2s(repr(row).encode(), digest_size=8).hexdigest()


def stale_seconds() -> float:
    """How old kept figures may be and still be shown while the worker works them out again."""
    return max(300.0, 10 * figures_seconds())


def _on_workers() -> bool:
    from llmgw.celery import app

    return not app.conf.task_always_eager


def _cache_get(key: str) -> tuple[Any, bool]:
    """The cache's value for `key` (None when absent), and whether the cache answered."""
    global _cache_down_until
    if time.monotonic() < _cache_down_until:
        return None, False
    try:
        return cache.get(key), True
    except Exception:  # Redis down: worked out here; LLMGW_REDIS_TIMEOUT bounds the try
        log.warning("facility figures: the cache did not answer; not asked again for %g s", CACHE_DOWN_SECONDS,
                    exc_info=True)
        _cache_down_until = time.monotonic() + CACHE_DOWN_SECONDS
        return None, False


def keep(name: str, value: Any, *, at: float, version: str) -> None:
    """Keep `name`'s figures, worked out at `at` (epoch seconds) on the facility's `version`."""
    global _cache_down_until
    if time.monotonic() < _cache_down_until:
        return
    try:
        # Kept past the age at which they are shown, so that a page finds them while the worker works
        # out the next; a newer version replaces them.
        cache.set(f"{CACHE_PREFIX}{name}", (value, at, version), timeout=stale_seconds() + 60)
    except Exception:
        log.warning("facility figures: the cache did not keep them", exc_info=True)
        _cache_down_until = time.monotonic() + CACHE_DOWN_SECONDS


def _cached(name: str, work, *, version: str | None = None) -> tuple[Any, float]:
    """`work()`'s value and when it was worked out (epoch seconds): the kept one while it is of the
    facility's version and younger than figures_seconds(); on workers, the kept one while the worker works
    it out again (younger than stale_seconds()); else worked out here."""
    version = version or facility_version()
    found, up = _cache_get(f"{CACHE_PREFIX}{name}")
    now = clock()
    if found is not None:
        value, at, kept_version = found
        if kept_version == version and now - at < figures_seconds():
            return value, at
        if _on_workers() and now - at < stale_seconds():
            refresh_ask()
            return value, at
    value = work()
    if up:
        keep(name, value, at=now, version=version)
    return value, now


def _feed_loss() -> dict[str, Any] | None:
    return feed_selectors.feed_loss_report() if Feed.objects.exists() else None


def _feeds() -> list[dict[str, Any]]:
    return feed_selectors.feeds_overview()["feeds"]


def _shed() -> list[dict[str, Any]]:
    from placement.shedding import shed_plan

    return shed_plan()


# The figures by name, each worked out on the whole site.
WORK = {"feed-loss": _feed_loss, "feeds": _feeds, "shed": _shed}


def feed_loss_figures(*, version: str | None = None) -> tuple[dict[str, Any] | None, float]:
    """The N−1 report (feed_selectors.feed_loss_report), None without feeds, and when it was worked out."""
    return _cached("feed-loss", _feed_loss, version=version)


def feeds_figures(*, version: str | None = None) -> tuple[list[dict[str, Any]], float]:
    """Each feed with its capacity, load, reserved and measured draw (feed_selectors.feeds_overview: the load
    of every node behind it), and when it was worked out."""
    return _cached("feeds", _feeds, version=version)


def shed_figures(*, version: str | None = None) -> tuple[list[dict[str, Any]], float]:
    """What shedding would do next (placement.shedding.shed_plan: empty while it is off), and when it was
    worked out."""
    return _cached("shed", _shed, version=version)


FIGURES_PENDING = "facility-figures"
# Between two rounds of the task while the version keeps moving (a thousand nodes joining).
REFRESH_SPACING_SECONDS = 5.0
REFRESH_COST_TIMES = 3.0


def refresh_ask(*, countdown: float = 0.0) -> None:
    """Ask the worker for the figures, once for a burst of asks (one task pending at a time)."""
    from kombu.exceptions import OperationalError as BrokerUnreachable

    from llmgw.coalesce import pending_claim, pending_clear

    if not pending_claim(FIGURES_PENDING):  # one is pending, or Redis did not answer: the next ask asks
        return
    try:
        refresh_task.apply_async(countdown=countdown, expires=countdown + 60)
    except BrokerUnreachable as exc:
        pending_clear(FIGURES_PENDING)
        log.warning("facility figures not queued (%s); the next page asks again", exc)


def refresh() -> tuple[str, float]:
    """Work out every figure on the facility's version now and keep them; the version, and how long it took.
    The open pages are told when what shedding would do or the N−1 report changed; the feeds' loads move
    with the readings, which render an open page again every few seconds anyway."""
    from agents import events

    started = time.monotonic()
    version = facility_version()
    moved = False
    for name, work in WORK.items():
        at = clock()
        value = work()
        if name != "feeds":
            kept, _ = _cache_get(f"{CACHE_PREFIX}{name}")
            moved = moved or kept is None or kept[0] != value
        keep(name, value, at=at, version=version)
    if moved:
        events.placement_changed()
    return version, time.monotonic() - started


@shared_task(name="facility.console_figures.refresh", ignore_result=True, soft_time_limit=120, time_limit=150)
def refresh_task() -> None:
    """The worker's round: the figures on the version it finds; again while the version moved under it (the
    flag taken down first, so that an ask after the check is not lost), after REFRESH_SPACING_SECONDS or
    REFRESH_COST_TIMES what the round took, whichever is longer: the worker's time is the reconciles' too."""
    from llmgw.coalesce import pending_clear

    version, took = refresh()
    pending_clear(FIGURES_PENDING)
    if facility_version() != version:
        refresh_ask(countdown=max(REFRESH_SPACING_SECONDS, REFRESH_COST_TIMES * took))
