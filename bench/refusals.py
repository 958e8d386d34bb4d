"""What refused bodies cost a web process: its resident memory before and after 120 refused 2 MB bodies.

A real `llmgw serve` (the embedded default, or DATABASE_URL's PostgreSQL when set) on 127.0.0.1; the
bodies come ``--concurrency`` at once from no one known: a 2 MB heartbeat that states its length (refused at
once), one sent chunked and a 2 MB post to the API, each with no credentials (refused unread) and with an
unknown token (the heartbeat read to its limit; the post, under the request limit, read whole, then 401). Prints the server's RSS before, after each kind, and at the end; asserts nothing.

Run: ``.venv/bin/python bench/refusals.py`` (``--count``, ``--megabytes``).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def rss_mb(pid: int) -> float:
    """The process's resident set, MB (Linux: /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: bytes, *, chunked: bool = False, token: str = "") -> int:
    """One POST on its own connection; the status the server answered (0: the connection was cut first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        if token:
            head += f"Authorization: Token {token}\r\n"
        head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {len(body)}\r\n\r\n"
        try:
            conn.sendall(head.encode())
            if chunked:
                for i in range(0, len(body), 65536):
                    piece = body[i:i + 65536]
                    conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                conn.sendall(b"0\r\n\r\n")
            else:
                conn.sendall(body)
        except OSError:
            pass  # refused before it was all sent: the answer is already there
        answer = b""
        try:
            while b"\r\n" not in answer:
                got = conn.recv(4096)
                if not got:
                    break
                answer += got
        except OSError:
            pass
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=120, help="bodies of each kind (default 120)")
    parser.add_argument("--megabytes", type=float, default=2.0, help="each body's size (default 2)")
    parser.add_argument("--concurrency", type=int, default=12, help="bodies sent at once (default 12)")
    args = parser.parse_args()
    body = b"{" + b" " * int(args.megabytes * 1_000_000 - 2) + b"}"
    port = free_port()
    data = tempfile.mkdtemp(prefix="llmgw-bench-refusals-")
    env = {**os.environ, "LLMGW_DATA_DIR": data}
    env.pop("REDIS_URL", None)
    env.pop("LLMGW_CONFIG", None)
    llmgw = str(Path(sys.executable).with_name("llmgw"))
    if "DATABASE_URL" not in env:
        subprocess.run([llmgw, "migrate", "-v0"], env=env, check=True)
    server = subprocess.Popen([llmgw, "serve", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        post(port, "/api/v1/nodes", b"{}")  # the first request's imports, before the figure is taken
        time.sleep(1)
        before = rss_mb(server.pid)
        print(f"server RSS before: {before:.1f} MB")
        kinds = [
            ("heartbeat, length stated (413 at once)", "/api/v1/agents/heartbeat", False, ""),
            ("heartbeat, chunked, no credentials (401 unread)", "/api/v1/agents/heartbeat", True, ""),
            ("API post, no credentials (401 unread)", "/api/v1/facility/conditions", False, ""),
            ("heartbeat, chunked, unknown token (413 at the limit)", "/api/v1/agents/heartbeat", True, "x"),
            ("API post, unknown token (read, then 401)", "/api/v1/facility/conditions", False, "x"),
        ]
        for what, path, chunked, token in kinds:
            started = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                sends = [pool.submit(post, port, path, body, chunked=chunked, token=token) for _ in range(args.count)]
                answers = [sent.result() for sent in sends]
            statuses = {status: answers.count(status) for status in sorted(set(answers))}
            took = time.perf_counter() - started
            time.sleep(1)
            print(f"{args.count} × {args.megabytes:g} MB, {args.concurrency} at once, {what}: answers {statuses}, {took:.1f} s; "
                  f"server RSS {rss_mb(server.pid):.1f} MB")
        after = rss_mb(server.pid)
        print(f"server RSS after: {after:.1f} MB ({after - before:+.1f} MB)")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(15)


if __name__ == "__main__":
    main()
