"""Placement's receivers of the signals of the layers below it (connected in placement.apps)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from agents import readings
from llmgw import inprocess
from placement.reports import shard_states_report

log = logging.getLogger(__name__)


def reconcile_on_request(*, after: float | None = None, **_: Any) -> None:
    """placement.signals.reconcile_requested: the task, sent now (on commit) or ``after`` seconds."""
    from placement.tasks import reconcile_after, request_reconcile

    if after is None:
        request_reconcile()
    else:
        reconcile_after(after)


def reconcile_on_change(*, heartbeat: bool = False, **_: Any) -> None:
    """A budget, hold, settings or node change: reconcile once the change commits."""
    if heartbeat and inprocess.running():
        # The embedded server: its reconcile thread, once for a burst of nodes joining, rather than one
        # reconcile per joining node's request, each holding SQLite's one write lock.
        transaction.on_commit(inprocess.wake)
        return
    # Here, not at the top: Celery is loaded by the processes that send a task, not by every one that
    # starts Django (`llmgw ctl`'s listings connect these receivers and never send).
    from placement.tasks import request_reconcile

    request_reconcile()


def record_report(*, node, states, now, **_: Any) -> None:
    """A node's agent reported its replicas: record shard and replica states."""
    shard_states_report(node=node, states=states, now=now)


def forget_assignments(*, nodes: list[str] | None = None, **_: Any) -> None:
    """Placement wrote shards or replicas: the heartbeat's map of assignments is read again (only the
    named nodes' entries when the sender named them)."""
    readings.invalidate_assignments(nodes=nodes)


def respond_to_conditions(*, now, **_: Any) -> None:
    """After each evaluation of conditions: keep the tokens per joule measured, step the GPU caps, then
    shed what is due (capping and shedding are off by default)."""
    from placement.capping import capping_run
    from placement.shedding import shed_run
    from placement.throughput import efficiency_record

    for name, step in (("tokens per joule", efficiency_record), ("capping", capping_run), ("shedding", shed_run)):
        try:
            step(now=now)
        except Exception:  # the evaluation's round is done; a failed step is logged and tried next round
            log.exception("%s failed", name)
