"""The HTTP server's own limits (`llmgw serve`): header size, a deadline for a request's headers,
keep-alive and connections, so a slow or greedy client holds no connection for long.

Bodies have their limits in :mod:`llmgw.bodies` (413, 408); these come before a request reaches it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import h11
import uvicorn
from django.conf import settings
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("llmgw.serve")

# After the graceful part of a stop (LLMGW_SHUTDOWN_SECONDS), this long more for the cancelled sockets to leave
# their groups (ReaderConsumer.LEAVE_SECONDS) before the process ends regardless.
STOP_MARGIN_SECONDS = 8.0


class HeaderDeadlineH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request headers do not arrive in time.

    uvicorn times out an idle kept-alive connection, but not one that sends its headers a byte at a time
    (slowloris): each such connection would be held for as long as its sender likes.
    """

    _header_timer = None
    _head_bytes = 0  # of the request head now arriving

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            # h11 bounds only a head still incomplete; one sent whole in a single write would pass.
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end
            if self._head_bytes > settings.LLMGW_MAX_HEADER_BYTES:
                self._refuse_head()
                return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head_bytes = 0
        if self.transport.get_protocol() is not self:
            self._disarm_header_deadline()  # upgraded to a WebSocket: its own protocol now
        elif self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._header_timer is None:
                self._arm_header_deadline()  # a next request's headers have begun
        else:
            self._disarm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _refuse_head(self) -> None:
        text = f"request headers over the {settings.LLMGW_MAX_HEADER_BYTES}-byte limit\n".encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\ncontent-length: " + str(len(text)).encode() + b"\r\n\r\n" + text
        )
        self._disarm_header_deadline()
        self.transport.close()

    def _arm_header_deadline(self) -> None:
        self._header_timer = self.loop.call_later(settings.LLMGW_HEADER_TIMEOUT_SECONDS, self._header_deadline)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self.transport.get_protocol() is self and self.conn.their_state is h11.IDLE:
            self.transport.close()  # no request came whole in time: nothing to answer, nothing lost


def uvicorn_limits() -> dict[str, Any]:
    """The keyword arguments of uvicorn.run/Config that bound what one client can hold."""
    return {
        "http": HeaderDeadlineH11Protocol,
        "h11_max_incomplete_event_size": settings.LLMGW_MAX_HEADER_BYTES,
        "timeout_keep_alive": settings.LLMGW_KEEP_ALIVE_SECONDS,
        "limit_concurrency": settings.LLMGW_MAX_CONNECTIONS,
        # A console socket's messages are small; a larger one closes the socket (1009).
        "ws_max_size": settings.LLMGW_WS_MAX_BYTES,
        # On SIGTERM every socket is closed at once (1012, going away); what still runs after this is cancelled.
        "timeout_graceful_shutdown": settings.LLMGW_SHUTDOWN_SECONDS,
    }


class BoundedStopServer(uvicorn.Server):
    """uvicorn's server, whose stop (SIGTERM, Ctrl-C) ends the process within LLMGW_SHUTDOWN_SECONDS and a
    margin, whatever still runs.

    uvicorn closes the sockets and cancels what outlives its graceful timeout, but a console socket's render
    blocked in its thread (a slow query, a lock held elsewhere) is not stopped by cancelling: the socket's end
    waits for it in the one thread sync consumers share, and the interpreter's exit joins that thread. The
    stop deadline ends the process then, as systemd would with SIGKILL, but before TimeoutStopSec and with a
    line in the log saying why."""

    _stop_deadline: threading.Timer | None = None

    def handle_exit(self, sig, frame) -> None:
        if self._stop_deadline is None:
            seconds = settings.LLMGW_SHUTDOWN_SECONDS + STOP_MARGIN_SECONDS
            self._stop_deadline = threading.Timer(seconds, stop_now, args=(seconds,))
            self._stop_deadline.daemon = True
            self._stop_deadline.start()
        super().handle_exit(sig, frame)


def stop_now(seconds: float) -> None:
    log.warning("stopping: work still running %g s after the stop was asked; ending the process", seconds)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(0)
