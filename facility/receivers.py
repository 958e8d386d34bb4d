"""The facility's receivers of the signals of the nodes layer below it (connected in facility.apps).

Apart from the services and the tasks they call, so that neither imports the other: the feeds' writes
never import the tasks that run them.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from facility.feed_services import _refresh_and_signal


def refresh_after_labels(*, heartbeat: bool = False, domains_moved: bool = False, **_: Any) -> None:
    """nodes_changed: a node's rack or PDUs may have moved; rewrite derived caps once the change commits.

    Deferred to the commit so a change holding its node's row never waits for a budget row (a placement
    locks budgets first, then nodes). A heartbeat never does it itself: it locks every budget row, and a
    thousand nodes joining would each wait for the others. A join whose domains moved asks for one
    coalesced task (facility.tasks.feed_caps_queue); a comeback, or new GPUs, asks for nothing (a
    heartbeat that does not say ``domains_moved`` moved none).
    """
    if heartbeat:
        if domains_moved:
            from facility.tasks import feed_caps_queue  # here: a ctl listing loads this module, never Celery

            transaction.on_commit(feed_caps_queue)
        return
    transaction.on_commit(_refresh_and_signal)
