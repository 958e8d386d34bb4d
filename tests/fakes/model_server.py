"""A stand-in model server for the replica runtime's tests: a few lines of http.server.

    python tests/fakes/model_server.py --port {port} [--ready-after 0.5] [--crash-after N]
        [--exit-code 3] [--ignore-sigterm] [--spawn-child] [--tag TEXT]

GET /health answers 503 until --ready-after seconds have passed, then 200. GET /env answers
JSON with the server's pid, argv, environment and the pid of the child it spawned (with
--spawn-child), so a test can see what the runtime handed it. --crash-after N exits with
--exit-code after N seconds; --ignore-sigterm makes only SIGKILL stop it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ready-after", type=float, default=0.0, help="seconds before /health answers 200")
    parser.add_argument("--crash-after", type=float, default=None, help="exit after this many seconds")
    parser.add_argument("--exit-code", type=int, default=3, help="the status --crash-after exits with")
    parser.add_argument("--ignore-sigterm", action="store_true", help="only SIGKILL stops it")
    parser.add_argument("--spawn-child", action="store_true", help="start a long-sleeping child process")
    parser.add_argument("--tag", action="append", default=[], help="ignored; echoed in /env's argv")
    args = parser.parse_args(argv)

    started = time.monotonic()
    child = None
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 — http.server's name
            if self.path == "/health":
                ready = time.monotonic() - started >= args.ready_after
                self._answer(200 if ready else 503, {"ready": ready})
            elif self.path == "/env":
                self._answer(
                    200,
                    {
                        "pid": os.getpid(),
                        "argv": sys.argv,
                        "env": dict(os.environ),
                        "child_pid": child.pid if child else None,
                    },
                )
            else:
                self._answer(404, {"error": "not found"})

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 — http.server's name
            pass

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if args.crash_after is not None:
        timer = threading.Timer(args.crash_after, lambda: os._exit(args.exit_code))
        timer.daemon = True
        timer.start()

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
