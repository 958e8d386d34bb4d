"""How many costly parses (an operator's YAML or JSON) one web process runs at once.

Parsing is CPU under Python's one lock: a dozen documents that each take seconds to be refused (an alias
or merge-key bomb walks 500,000 values first) would hold every thread of the process, and the database
connections their requests took, for as long — heartbeats waited past the pool's timeout and were answered
503. So parses take one of a few slots; a parse that finds none free within PARSE_WAIT_SECONDS is refused
with :class:`Busy` (the API: 429 with Retry-After). A parse inside a parse (a scenario file named in
server.yaml) uses its caller's slot. Without :func:`configure` (the CLI, the agent, a worker) there is no
limit. Pure: no Django (the node agent reads YAML through llmgw.yamldoc).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from llmgw.errors import LlmgwError

# How long a parse waits for a slot before it is refused.
PARSE_WAIT_SECONDS = 1.0
# What a refused client is told to wait (seconds).
RETRY_AFTER_SECONDS = 2

_slots: threading.BoundedSemaphore | None = None
_size = 0
_held = threading.local()


class Busy(LlmgwError):
    """Every parsing slot of this process is taken: nothing was read or applied; try again shortly."""

    status = 429
    retry_after = RETRY_AFTER_SECONDS


def configure(slots: int | None) -> None:
    """At most ``slots`` parses at once in this process from now on (None or 0: no limit)."""
    global _slots, _size
    _slots = threading.BoundedSemaphore(slots) if slots else None
    _size = slots or 0


@contextmanager
def parse_slot(what: str) -> Iterator[None]:
    """Hold a parsing slot while the body of the ``with`` runs, or raise Busy naming ``what``."""
    slots = _slots
    if slots is None or getattr(_held, "depth", 0):
        _held.depth = getattr(_held, "depth", 0) + 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    if not slots.acquire(timeout=PARSE_WAIT_SECONDS):
        raise Busy(
            f"{what}: this server is parsing {_size} other documents now; try again in {RETRY_AFTER_SECONDS} seconds"
        )
    _held.depth = 1
    try:
        yield
    finally:
        _held.depth = 0
        slots.release()
