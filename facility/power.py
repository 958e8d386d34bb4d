"""Power accounting: what a shard draws, what a domain uses, and the words for a refusal.

Pure: no Django, no clock. The figures come from ``server.yaml``'s ``facility:`` block
(:class:`FacilitySettings`, :class:`Budget`) and from the nodes (placed and measured watts).

The rules, as the seed states them:

- A replica's draw is the profile's ``power_watts`` split over its nodes when declared; otherwise a
  GPU profile takes each card at the power limit its node reports (else ``gpu_watts``) and a CPU
  profile each reserved core at ``cpu_core_watts``. A draw nobody knows is ``None`` and counts as
  nothing: missing data never blocks.
- A domain's use is its ``other_watts`` plus, node by node, ``node_watts`` and the larger of what is
  placed there and what its sensors read while fresh. What the sensors read is the node's measured
  peak: the second-highest reading of the last ``measured_window`` (15 minutes by default, kept in
  buckets of a fifteenth of it by :func:`measured_peak`), since prefill reaches a card's limit in
  milliseconds while decode draws far below it; the second, so that one sample never holds the peak.
- A shard is refused when a budgeted domain's use **after** it would pass ``cap × (1 − margin)``.
  The shard changes its node's term from ``max(placed, measured)`` to ``max(placed + shard,
  measured)`` (:func:`node_use_added_watts`): a node's measured idle draw is not counted twice.
  A multi-node replica's shards in one domain are counted together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from facility.domains import Domain

# Watts below this are rounding noise: a shard that lands exactly on the limit fits.
EPSILON_WATTS = 1e-6
# A domain using more than this share of its limit is near it: the console colours it, and the
# LlmgwDomainNearPowerLimit alert (deploy/prometheus/alerts.yaml) fires on the same share.
NEAR_LIMIT_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class FacilitySettings:
    """The ``facility:`` figures of server.yaml that are not budgets."""

    margin: float = 0.1
    gpu_watts: float | None = 700
    cpu_core_watts: float | None = 10
    node_watts: float | None = 350


@dataclass(frozen=True, slots=True)
class Budget:
    """A domain's power cap, and what else in it draws (switches, storage)."""

    domain: Domain
    cap_watts: float
    other_watts: float = 0

    def limit_watts(self, margin: float) -> float:
        """What placement may fill: the cap less the margin kept free."""
        return self.cap_watts * (1 - margin)


@dataclass(frozen=True, slots=True)
class NodePower:
    """One node's figures for domain accounting; ``measured_watts`` is None when absent or stale."""

    placed_watts: float
    measured_watts: float | None = None


@dataclass(frozen=True, slots=True)
class DomainPower:
    """A domain's power as ``llmgw ctl facility`` and the API report it."""

    domain: Domain
    nodes: int
    reserved_watts: float
    measured_watts: float | None
    use_watts: float
    cap_watts: float | None
    limit_watts: float | None
    margin: float

    @property
    def is_over_limit(self) -> bool:
        """True when the domain is past its limit and so takes no new shard."""
        return self.limit_watts is not None and self.use_watts > self.limit_watts + EPSILON_WATTS


def shard_draw_watts(
    *,
    gpus: int,
    cpu_cores: int,
    nodes: int,
    power_watts: float | None,
    node_gpu_power_limit_watts: float | None,
    settings: FacilitySettings,
) -> float | None:
    """The estimated draw of one shard of a replica on a node, or None when nobody knows it."""
    if power_watts is not None:
        return power_watts / max(nodes, 1)
    if gpus > 0:
        per_card = (
            node_gpu_power_limit_watts if node_gpu_power_limit_watts is not None else settings.gpu_watts
        )
        return None if per_card is None else gpus * per_card
    if settings.cpu_core_watts is None:
        return None
    return cpu_cores * settings.cpu_core_watts


# The rolling peak is kept in this many buckets over the window: exact to a fifteenth of it.
PEAK_BUCKETS = 15


def measured_peak(
    buckets: Iterable[Sequence[float]], watts: float | None, at: float, window_seconds: float
) -> tuple[list[list[float]], float | None]:
    """A node's peak buckets with a reading taken at ``at`` (epoch seconds) added, and the peak over them.

    ``buckets`` is ``[[start, highest, second], ...]`` (oldest first; ``second`` absent while the bucket
    holds one reading); a bucket is kept while any of it lies within the window before ``at``. The peak is
    the second-highest reading of the window (to a bucket): one sample — a spike, a sensor's glitch — never
    holds it, two do. None while fewer than two readings were taken in it.
    """
    width = window_seconds / PEAK_BUCKETS
    kept = [
        [float(bucket[0]), *(float(v) for v in bucket[1:3] if v is not None)]
        for bucket in buckets
        if bucket[0] + width > at - window_seconds
    ]
    if watts is not None:
        start = math.floor(at / width) * width
        if kept and kept[-1][0] == start:
            kept[-1] = [start, *sorted([*kept[-1][1:], float(watts)], reverse=True)[:2]]
        else:
            kept.append([start, float(watts)])
    values = sorted((v for bucket in kept for v in bucket[1:]), reverse=True)
    return kept, values[1] if len(values) > 1 else None


def measured_peak_sql(peaks: str, at: str, watts: str, window_seconds: float) -> tuple[str, str]:
    """:func:`measured_peak` as two PostgreSQL expressions: the new buckets (jsonb) and the peak.

    ``peaks`` is the stored buckets column, ``at`` a timestamptz and ``watts`` the reading (NULL: none),
    all SQL expressions; both results read the old row, as an UPDATE's SET does. A test holds them equal
    to the Python rule.
    """
    width = float(window_seconds) / PEAK_BUCKETS
    epoch = f"CAST(EXTRACT(EPOCH FROM {at}) AS double precision)"
    # Every reading a bucket keeps (its highest and second), and the new one, as rows (s, v).
    rows = (
        f"SELECT CAST(e->>0 AS double precision) AS s, CAST(x.v AS double precision) AS v "
        f"FROM jsonb_array_elements(COALESCE({peaks}, '[]'::jsonb)) e "
        f"CROSS JOIN LATERAL (VALUES (e->>1), (e->>2)) x(v) WHERE x.v IS NOT NULL "
        f"UNION ALL SELECT floor({epoch} / {width!r}) * {width!r}, {watts} WHERE {watts} IS NOT NULL"
    )
    kept = (
        f"SELECT s, (array_agg(v ORDER BY v DESC))[1:2] AS top FROM ({rows}) r "
        f"WHERE s + {width!r} > {epoch} - {float(window_seconds)!r} GROUP BY s"
    )
    buckets = (
        f"(SELECT COALESCE(jsonb_agg(to_jsonb(ARRAY[s]) || to_jsonb(top) ORDER BY s), '[]'::jsonb) FROM ({kept}) b)"
    )
    peak = f"(SELECT v FROM ({kept}) b, unnest(b.top) v ORDER BY v DESC OFFSET 1 LIMIT 1)"
    return buckets, peak


def fresh_measured_watts(
    measured_watts: float | None, sensors_at: datetime | None, now: datetime, fresh_seconds: float
) -> float | None:
    """A node's measured draw (its peak) while it counts for power accounting (last read at most
    ``fresh_seconds`` ago: a node whose sensors went quiet blocks nothing)."""
    if measured_watts is None or sensors_at is None:
        return None
    if (now - sensors_at).total_seconds() > fresh_seconds:
        return None
    return measured_watts


def node_use_watts(placed_watts: float, measured_watts: float | None, settings: FacilitySettings) -> float:
    """What one node counts for in each of its domains (``measured_watts``: fresh, or None)."""
    # The larger of estimate and measurement: a low estimate is corrected by the room it stops offering.
    return (settings.node_watts or 0) + max(placed_watts, measured_watts or 0)


def node_use_added_watts(
    placed_watts: float, measured_watts: float | None, draw_watts: float | None, settings: FacilitySettings,
    *, before: float | None = None,
) -> float:
    """What placing ``draw_watts`` more on a node adds to the use of each of its domains.

    The node's term after less its term before, both by :func:`node_use_watts`: a shard on a node
    whose sensors already read more than it has placed adds only what passes the reading. ``before``: the
    term now, where the caller keeps it (the placement index, per node).
    """
    if before is None:
        before = node_use_watts(placed_watts, measured_watts, settings)
    return node_use_watts(placed_watts + (draw_watts or 0), measured_watts, settings) - before


def node_draw_sql(alias: str, *, placed: str) -> str:
    """:func:`node_use_watts` less ``node_watts``, as SQL on a node row ``alias``, for sums in the database.

    ``placed`` is the SQL of the node's placed watts (placement keeps them in its own table, joined by
    the caller).

    Reads the node's ``measured_peak_watts``. Takes one parameter: the oldest ``sensors_at`` still fresh
    (now minus the fresh seconds), so it is
    :func:`fresh_measured_watts` and ``max(placed, measured or 0)`` in one expression. Portable SQL
    (PostgreSQL and SQLite). A test holds it equal to the Python rule on varied rows.
    """
    n = alias
    p = placed
    return (
        f"CASE WHEN {n}.measured_peak_watts IS NOT NULL AND {n}.sensors_at IS NOT NULL AND {n}.sensors_at >= %s "
        f"AND {n}.measured_peak_watts > {p} THEN {n}.measured_peak_watts ELSE {p} END"
    )


def domain_use_watts(
    members: Iterable[NodePower], *, other_watts: float, settings: FacilitySettings
) -> float:
    """A domain's use: its other_watts plus each member node's term."""
    return other_watts + sum(node_use_watts(m.placed_watts, m.measured_watts, settings) for m in members)


def domain_power(
    domain: Domain, members: Iterable[NodePower], budget: Budget | None, settings: FacilitySettings
) -> DomainPower:
    """The reporting figures of one domain from its member nodes' figures."""
    members = list(members)
    readings = [m.measured_watts for m in members if m.measured_watts is not None]
    use = domain_use_watts(members, other_watts=budget.other_watts if budget else 0, settings=settings)
    return DomainPower(
        domain=domain,
        nodes=len(members),
        reserved_watts=sum(m.placed_watts for m in members),
        measured_watts=sum(readings) if readings else None,
        use_watts=use,
        cap_watts=budget.cap_watts if budget else None,
        limit_watts=budget.limit_watts(settings.margin) if budget else None,
        margin=settings.margin,
    )


def would_pass_limit(use_after_watts: float, limit_watts: float) -> bool:
    """True when the domain's use after a placement is past its limit (one already past it refuses all)."""
    return use_after_watts > limit_watts + EPSILON_WATTS


def kw(watts: float) -> str:
    """``14200`` → ``14.2 kW``; never ``-0.0 kW`` (a budget of -0, a use of -1e-12 after subtracting)."""
    return f"{round(watts / 1000, 1) + 0.0:.1f} kW"


def margin_text(margin: float) -> str:
    """``0.1`` → ``10%``; ``0.125`` → ``12.5%``."""
    return f"{round(margin * 100, 2):g}%"


def power_refusal(
    budget: Budget,
    *,
    use_watts: float,
    after_watts: float,
    draw_watts: float | None,
    margin: float,
    combined: bool = False,
) -> str:
    """Why a shard may not go into a domain, with both figures: the use now and the use after it.

    ``rack r12-07: 14.2 kW of a 14.4 kW limit (16.0 kW cap less 10%) in use, 16.3 kW with the shard
    (~2.8 kW)``; ``combined`` says it for a multi-node replica's shards that share the domain.
    """
    head = f"{budget.domain.label}: {kw(use_watts)} of a {limit_text(budget, margin)} in use"
    return power_refusal_at(head, use_watts=use_watts, after_watts=after_watts, draw_watts=draw_watts, combined=combined)


def limit_text(budget: Budget, margin: float) -> str:
    """``14.4 kW limit (16.0 kW cap less 10%)``: a refusal's words for the domain's limit."""
    return f"{kw(budget.limit_watts(margin))} limit ({kw(budget.cap_watts)} cap less {margin_text(margin)})"


def power_refusal_at(
    head: str, *, use_watts: float, after_watts: float, draw_watts: float | None, combined: bool = False
) -> str:
    """:func:`power_refusal` from its ``head`` (the domain, its use and limit: alike for every shard refused
    at that use, and kept so by the placement index)."""
    if not draw_watts or after_watts <= use_watts + EPSILON_WATTS:
        # Nothing added, yet refused: the domain is already past its limit.
        return f"{head}, already past it"
    if combined:
        return f"{head}, {kw(after_watts)} with the replica's shards here (~{kw(draw_watts)})"
    return f"{head}, {kw(after_watts)} with the shard (~{kw(draw_watts)})"
