"""The Facility page's costly figures — what shedding would do next, the N−1 report and the feeds' loads —
worked out when their inputs change (or once the readings in them are FIGURES_SECONDS old), not on every
load.

Each reads or plans on the whole site (shedding tries each candidate's replacement on the placement index;
N−1 judges every feed's loss; a feed's load is every node behind it), so at a thousand nodes they cost
most of a page's render. They are kept in
Django's cache (locmem embedded, Redis where REDIS_URL is set, shared by every web process) under a key
made of the facility's version: one query of counts, newest ids and times of what they are worked out from
(budgets, feeds, settings, holds, conditions, overrides, nodes and their domains, models, replicas and
shards). A change to any of those is a new key, so the page never shows figures from before it. Readings
(measured draw, inlet) change with every heartbeat: they are not in the key; the figures are worked out
again once FIGURES_SECONDS old, and the page says how old they are.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

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


def _cached(name: str, work, *, version: str | None = None) -> tuple[Any, float]:
    """`work()`'s value and when it was worked out (epoch seconds), from the cache while the facility's
    version is the same and the value is younger than figures_seconds()."""
    global _cache_down_until
    key = f"{CACHE_PREFIX}{name}:{version or facility_version()}"
    up = time.monotonic() >= _cache_down_until
    found = None
    if up:
        try:
            found = cache.get(key)
        except Exception:  # Redis down: worked out here; LLMGW_REDIS_TIMEOUT bounds the try
            log.warning("facility figures: the cache did not answer; not asked again for %g s", CACHE_DOWN_SECONDS,
                        exc_info=True)
            _cache_down_until, up = time.monotonic() + CACHE_DOWN_SECONDS, False
    now = clock()
    if found is not None and now - found[1] < figures_seconds():
        return found
    value = (work(), now)
    if up:
        try:
            # Kept a little past its age so that a page rendered at the edge still finds it; a newer
            # version is a new key, and the old one simply expires.
            cache.set(key, value, timeout=figures_seconds() * 2 + 1)
        except Exception:
            log.warning("facility figures: the cache did not keep them", exc_info=True)
            _cache_down_until = time.monotonic() + CACHE_DOWN_SECONDS
    return value


def feed_loss_figures(*, version: str | None = None) -> tuple[dict[str, Any] | None, float]:
    """The N−1 report (feed_selectors.feed_loss_report), None without feeds, and when it was worked out."""
    return _cached(
        "feed-loss", lambda: feed_selectors.feed_loss_report() if Feed.objects.exists() else None, version=version
    )


def feeds_figures(*, version: str | None = None) -> tuple[list[dict[str, Any]], float]:
    """Each feed with its capacity, load, reserved and measured draw (feed_selectors.feeds_overview: the load
    of every node behind it), and when it was worked out."""
    return _cached("feeds", lambda: feed_selectors.feeds_overview()["feeds"], version=version)


def shed_figures(*, version: str | None = None) -> tuple[list[dict[str, Any]], float]:
    """What shedding would do next (placement.shedding.shed_plan: empty while it is off), and when it was
    worked out."""
    from placement.shedding import shed_plan

    return _cached("shed", shed_plan, version=version)
