"""Python's cyclic garbage collector paused for a placement run."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_collector_lock = threading.Lock()


_collector_pauses = 0


_collector_was_enabled = False


_collected_at = 0.0


# Runs that overlap without end (threads of one served process) still collect this often.
COLLECT_EVERY_SECONDS = 30.0


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a placement run, back as it was after the last of
    nested (or concurrent) runs ends.

    A run allocates a tuple or two per node it ranks and per plan it makes, and every few thousand
    allocations the collector walks every object the process holds (the index, Django's models and
    querysets), walks that find next to nothing to free during a run (bench/placements.py). What is
    freed by reference counting is freed as ever; only cycles made during the run wait for the
    collector's next pass after it, and runs that keep overlapping (threads of one process) collect once
    every COLLECT_EVERY_SECONDS as each ends.
    """
    global _collector_pauses, _collector_was_enabled, _collected_at
    with _collector_lock:
        if _collector_pauses == 0:
            _collector_was_enabled = gc.isenabled()
            _collected_at = time.monotonic()
            gc.disable()
        _collector_pauses += 1
    try:
        yield
    finally:
        collect = False
        with _collector_lock:
            _collector_pauses -= 1
            if _collector_pauses == 0:
                if _collector_was_enabled:
                    gc.enable()
            elif _collector_was_enabled and time.monotonic() - _collected_at >= COLLECT_EVERY_SECONDS:
                _collected_at = time.monotonic()
                collect = True
        if collect:
            gc.collect()
