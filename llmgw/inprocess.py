"""The embedded default's reconcile thread: a reconcile every interval, and soon after a heartbeat asks.

Without Redis there is no worker and no beat, so `llmgw serve` runs reconciles in a thread of its own.
Heartbeats that change the fleet (a node joins, comes back, or reports new labels or GPUs) wake it rather
than reconcile in their own request: a thousand nodes joining at once then cost a few reconciles, not a
thousand, each holding SQLite's one write lock while every other heartbeat waits behind it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import close_old_connections

log = logging.getLogger("llmgw.serve")

# After a wake, wait this long for more (the next nodes of a burst) before reconciling once for all.
GATHER_SECONDS = 0.5

_wake = threading.Event()
_thread: threading.Thread | None = None
# Work asked of the thread before its next reconcile, by name: many asks of one name are one run.
_jobs: dict[str, Callable[[], None]] = {}
_jobs_lock = threading.Lock()


def running() -> bool:
    """Whether this process has the reconcile thread (`llmgw serve` without Redis)."""
    return _thread is not None and _thread.is_alive()


def wake() -> None:
    """Ask the thread for a reconcile soon; many asks before it runs are one reconcile."""
    _wake.set()


def ask(name: str, job: Callable[[], None]) -> None:
    """Have the thread run ``job`` before its next reconcile (the facility work a heartbeat asks for: never
    in the heartbeat's own request); asks of one ``name`` before it runs are one run."""
    with _jobs_lock:
        _jobs[name] = job
    _wake.set()


def _jobs_run() -> None:
    with _jobs_lock:
        jobs = list(_jobs.items())
        _jobs.clear()
    for name, job in jobs:
        try:
            job()
        except Exception:  # the next ask runs it again; a failed one must not end the loop
            log.exception("%s failed", name)


def start(interval: float, reconcile: Callable[[], None]) -> threading.Thread:
    """Start the thread: `reconcile` every `interval` seconds, and GATHER_SECONDS after a wake."""
    global _thread

    def loop() -> None:
        while True:
            if _wake.wait(interval):
                time.sleep(GATHER_SECONDS)
            _wake.clear()
            try:
                _jobs_run()
                reconcile()
            except Exception:  # the next round tries again; a failed one must not end the loop
                log.exception("periodic reconcile failed")
            finally:
                close_old_connections()

    _thread = threading.Thread(target=loop, name="llmgw-reconcile", daemon=True)
    _thread.start()
    return _thread


def start_periodic(name: str, interval: float, task: Callable[[], None]) -> threading.Thread:
    """Run `task` every `interval` seconds in a daemon thread (the embedded server's stand-in for beat)."""

    def loop() -> None:
        while True:
            time.sleep(interval)
            try:
                task()
            except Exception:  # the next round tries again
                log.exception("periodic %s failed", name)
            finally:
                close_old_connections()

    thread = threading.Thread(target=loop, name=f"llmgw-{name}", daemon=True)
    thread.start()
    return thread
