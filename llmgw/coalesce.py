"""Single-flight flags for tasks many events ask for: one pending at a time, not one task per event.

A node joining, a node coming back, a relabel: each asks for a reconcile (and a join for the caps its
feeds give). A thousand nodes joining in a minute must queue one task, not a thousand. The first ask sets
a flag in Redis (``SET NX EX``) and sends the task; the asks after it, while the flag stands, send
nothing. The task takes the flag down as it starts (:func:`pending_clear`), before it reads anything, so a
change that commits after that read asks again and is not lost. A task lost on its way (a worker killed,
a message expired) holds the flag no longer than its window: the next ask sends again.

Only on workers (Redis): in-process, tasks run where they are sent and the embedded server's reconcile
thread gathers the asks itself (llmgw.inprocess).
"""

from __future__ import annotations

import logging

from django.conf import settings

log = logging.getLogger(__name__)

# How long a flag stands at most: a pending task lost on its way holds the next ask back no longer.
PENDING_WINDOW_SECONDS = 60

_client = None
_client_url = ""


def _redis():
    """The broker's Redis (the flags live beside the messages they stand for), bounded by LLMGW_REDIS_TIMEOUT;
    None without one."""
    global _client, _client_url
    from llmgw.celery import app

    url = app.conf.broker_url or ""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    if _client is None or _client_url != url:
        import redis

        timeout = settings.LLMGW_REDIS_TIMEOUT_SECONDS
        _client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        _client_url = url
    return _client


def _key(name: str) -> str:
    return f"llmgw:pending:{name}"


def pending_claim(name: str, window: float = PENDING_WINDOW_SECONDS) -> bool | None:
    """Whether this ask is the one to send ``name``'s task: True when no task of that name is pending
    (the flag is now set), False when one is; None when Redis did not answer (a send would wait as long
    again: the caller says the task was not queued instead). Without Redis (in-process): True."""
    client = _redis()
    if client is None:
        return True
    try:
        return bool(client.set(_key(name), "1", nx=True, ex=max(1, int(window))))
    except Exception as exc:  # the caller reports the broker's trouble (llmgw.dependencies)
        log.info("pending flag of %s not read (%s)", name, exc)
        return None


def pending_clear(name: str) -> None:
    """``name``'s task has started (or was not sent): the next ask sends another."""
    client = _redis()
    if client is None:
        return
    try:
        client.delete(_key(name))
    except Exception as exc:  # the flag lapses within its window on its own
        log.info("pending flag of %s not cleared (%s); it lapses on its own", name, exc)


def is_pending(name: str) -> bool:
    """Whether a task of ``name`` is pending (its flag stands)."""
    client = _redis()
    if client is None:
        return False
    try:
        return bool(client.exists(_key(name)))
    except Exception:
        return False

