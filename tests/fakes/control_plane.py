"""A tiny stand-in for the control plane's heartbeat endpoint, for the agent's tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEADLINE_SECONDS = 10.0

REPLICA = {
    "id": 17,
    "model": "llama-70b",
    "command": "python -m http.server {port}",
    "gpus": [0, 1],
    "cpu_cores": 16,
    "memory_gib": 256,
}


class ControlPlane:
    """A tiny stand-in for the heartbeat endpoint: records requests, answers from a script."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        """`clock`: each request is recorded with its reading (`at`), the sender's clock when it sent it."""
        self.requests: list[dict] = []
        self.script: list[tuple[int, object]] = []
        self.answer: object = {"node": "gpu01", "interval_seconds": 10, "replicas": [REPLICA]}
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                length = int(self.headers.get("Content-Length", 0))
                plane.requests.append(
                    {
                        "path": self.path,
                        "authorization": self.headers.get("Authorization"),
                        "body": json.loads(self.rfile.read(length)),
                        "at": clock() if clock is not None else None,
                    }
                )
                status, body = plane.script.pop(0) if plane.script else (200, plane.answer)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def agent_yaml(server: str, **extra: object) -> str:
    lines = [
        f"server: {server}",
        "node: gpu01",
        "token: node_secret",
        "fabric: ib-a",
        "labels:",
        "  llmgw.io/rack: r12-07",
    ]
    lines += [f"{key}: {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"not reached within {DEADLINE_SECONDS} s")
