"""The server's log handler: records go to the standard error stream as it is when each one is written."""

from __future__ import annotations

import logging
import sys


class StderrHandler(logging.StreamHandler):
    """A StreamHandler bound to ``sys.stderr`` at each record, not to the stream of the moment it was made.

    A process that swaps its standard error (a test runner capturing output, a daemon redirecting it)
    would otherwise leave the handler writing to a closed stream: every record then ends in a
    ``--- Logging error --- ValueError: I/O operation on closed file`` traceback instead of the line.
    """

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass  # always the current sys.stderr
