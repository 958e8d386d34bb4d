"""The server's log handler writes to the standard error of the moment, never to one closed since."""

from __future__ import annotations

import io
import logging
import sys

from llmgw.logs import StderrHandler


def _log_through(handler: logging.Handler, monkeypatch) -> str:
    logger = logging.getLogger("llmgw.test-log-handler")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        first = io.StringIO()
        monkeypatch.setattr(sys, "stderr", first)
        if not isinstance(handler, StderrHandler):
            handler.setStream(first)
        first.close()  # the capture of an earlier test, closed
        now = io.StringIO()
        monkeypatch.setattr(sys, "stderr", now)
        logger.warning("the line")
        return now.getvalue()
    finally:
        logger.removeHandler(handler)


def test_a_record_after_stderr_was_swapped_is_written_to_the_new_one(monkeypatch):
    written = _log_through(StderrHandler(), monkeypatch)
    assert written == "the line\n"


def test_a_plain_stream_handler_would_end_in_a_logging_error(monkeypatch):
    # The failure the handler exists for: the stream it was given is closed, and logging says so on stderr.
    written = _log_through(logging.StreamHandler(), monkeypatch)
    assert "--- Logging error ---" in written and "I/O operation on closed file" in written
