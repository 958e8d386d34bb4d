"""Power accounting: what a shard draws, what a domain uses, and the words for a refusal.

Pure: no Django, no clock. The figures come from ``server.yaml``'s ``facility:`` block
(:class:`FacilitySettings`, :class:`Budget`) and from the nodes (placed and measured watts).

The rules, as the seed states them:

- A replica's draw is the profile's ``power_watts`` split over its nodes when declared; otherwise a
  GPU profile takes each card at the power limit its node reports (else ``gpu_watts``) and a CPU
  profile each reserved core at ``cpu_core_watts``. A draw nobody knows is ``None`` and counts as
  nothing: missing data never blocks.
- A domain's use is its ``other_watts`` plus, node by node, ``node_watts`` and the larger of what is
  placed there and what its sensors read while fresh.
- A shard is refused when a budgeted domain's use plus the shard's draw would pass
  ``cap × (1 − margin)``. (Use already counts a node's measurement where it exceeds the placed draw;
  the shard's own draw is added on top, as the refusal text reads: this much in use, this much more.)
"""

from __future__ import annotations

from collections.abc import Iterable
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


def fresh_measured_watts(
    measured_watts: float | None, sensors_at: datetime | None, now: datetime, fresh_seconds: float
) -> float | None:
    """A node's measured draw while it counts for power accounting (read at most `fresh_seconds` ago)."""
    if measured_watts is None or sensors_at is None:
        return None
    if (now - sensors_at).total_seconds() > fresh_seconds:
        return None
    return measured_watts


def node_use_watts(placed_watts: float, measured_watts: float | None, settings: FacilitySettings) -> float:
    """What one node counts for in each of its domains (``measured_watts``: fresh, or None)."""
    # The larger of estimate and measurement: a low estimate is corrected by the room it stops offering.
    return (settings.node_watts or 0) + max(placed_watts, measured_watts or 0)


def node_draw_sql(alias: str, *, placed: str | None = None) -> str:
    """:func:`node_use_watts` less ``node_watts``, as SQL on a node row ``alias``, for sums in the database.

    ``placed`` is the SQL of the node's placed watts (placement keeps them in its own table, joined by
    the caller); ``{alias}.placed_watts`` when not given.

    Takes one parameter: the oldest ``sensors_at`` still fresh (now minus the fresh seconds), so it is
    :func:`fresh_measured_watts` and ``max(placed, measured or 0)`` in one expression. Portable SQL
    (PostgreSQL and SQLite). A test holds it equal to the Python rule on varied rows.
    """
    n = alias
    p = placed or f"{n}.placed_watts"
    return (
        f"CASE WHEN {n}.measured_watts IS NOT NULL AND {n}.sensors_at IS NOT NULL AND {n}.sensors_at >= %s "
        f"AND {n}.measured_watts > {p} THEN {n}.measured_watts ELSE {p} END"
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


def would_pass_limit(use_watts: float, draw_watts: float, limit_watts: float) -> bool:
    """True when adding ``draw_watts`` leaves the domain past its limit (one already past it refuses all)."""
    return use_watts + draw_watts > limit_watts + EPSILON_WATTS


def kw(watts: float) -> str:
    """``14200`` → ``14.2 kW``."""
    return f"{watts / 1000:.1f} kW"


def margin_text(margin: float) -> str:
    """``0.1`` → ``10%``; ``0.125`` → ``12.5%``."""
    return f"{round(margin * 100, 2):g}%"


def power_refusal(
    budget: Budget,
    *,
    use_watts: float,
    need_watts: float | None,
    margin: float,
    combined: bool = False,
) -> str:
    """Why a shard may not go into a domain, with the figures.

    ``rack r12-07: 14.2 kW of a 14.4 kW limit (16.0 kW cap less 10%) in use, the shard needs ~2.8 kW``;
    ``combined`` says it for a multi-node replica's shards that share the domain.
    """
    head = (
        f"{budget.domain.label}: {kw(use_watts)} of a {kw(budget.limit_watts(margin))} limit "
        f"({kw(budget.cap_watts)} cap less {margin_text(margin)}) in use"
    )
    if not need_watts:
        # Nothing known to add, yet refused: the domain is already past its limit.
        return f"{head}, already past it"
    if combined:
        return f"{head}, the replica's shards need ~{kw(need_watts)} here"
    return f"{head}, the shard needs ~{kw(need_watts)}"
