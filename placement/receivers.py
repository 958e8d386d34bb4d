"""Placement's receivers of the signals of the layers below it (connected in placement.apps)."""

from __future__ import annotations

from typing import Any

from agents import readings
from placement.reports import shard_states_report
from placement.tasks import request_reconcile


def reconcile_on_change(**_: Any) -> None:
    """A budget, hold, settings or node change: reconcile once the change commits."""
    request_reconcile()


def record_report(*, node, states, now, **_: Any) -> None:
    """A node's agent reported its replicas: record shard and replica states."""
    shard_states_report(node=node, states=states, now=now)


def forget_assignments(**_: Any) -> None:
    """Placement wrote shards or replicas: the heartbeat's cached map of assignments is read again."""
    readings.invalidate_assignments()
