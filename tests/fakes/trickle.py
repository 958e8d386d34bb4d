"""A server that answers a byte at a time: the status line, the headers or the body trickled, so a timeout
per wait never fires (each byte comes in time) and only one deadline for the whole call ends it.

Real sockets on 127.0.0.1; a whole trickle takes minutes, far more than any deadline a test gives.
"""

from __future__ import annotations

import socket
import threading
import time

STATUS = b"HTTP/1.1 200 OK\r\n"
HEADERS = b"Content-Type: application/json\r\nX-Slow: " + b"s" * 200 + b"\r\nContent-Length: 2\r\n\r\n{}"
BODY = b'{"replicas": [], "slow": "' + b"s" * 400 + b'"}'
EVERY = 0.5  # seconds between two bytes
CUT_WITHIN = 30  # seconds: far more than any deadline the tests give, far less than a trickle (100 s and more)
PARTS = ("status", "headers", "body")


class Trickle:
    """Answers every request a byte every EVERY seconds from ``part`` on: ``status`` (the status line's first
    byte), ``headers`` (after a whole status line) or ``body`` (after whole headers); ``cut`` is set when the
    client went away."""

    def __init__(self, part: str):
        assert part in PARTS, part
        self.part = part
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = False

    def __enter__(self):
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._stop = True
        self.listener.close()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket):
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)  # the request (small, one segment)
                if self.part == "status":
                    whole, slow = b"", STATUS + HEADERS
                elif self.part == "headers":
                    whole, slow = STATUS, HEADERS
                else:
                    whole = STATUS + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
                    slow = BODY
                conn.sendall(whole)
                for byte in slow:
                    if self._stop:
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(EVERY)
                    # A client that went away: its end is readable (EOF or a reset) before the send fails.
                    conn.setblocking(False)
                    try:
                        if conn.recv(1) == b"":
                            break
                    except BlockingIOError:
                        pass
                    finally:
                        conn.setblocking(True)
                        conn.settimeout(5)
            except OSError:
                pass
            self.cut.set()
