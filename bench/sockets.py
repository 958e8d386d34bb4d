"""A console socket's handshake with many sockets open on one web process.

Starts ``llmgw serve`` (embedded: SQLite in a fresh data directory, unless DATABASE_URL is set; REDIS_URL,
when set, is used for the channel layer), logs a viewer in, opens ``--open`` sockets (default 200) to the
Facility, Models and Nodes pages in turn, each sending its filter as the page does. With the demo's facility
and models applied, it then changes a model's replicas through the API every ``--every`` seconds (each change
renders every open Facility and Models page again), and opens ``--probes`` more sockets one at a time: it
prints how long each handshake took (connect to accept) and how long until its first render.
Run: ``.venv/bin/python bench/sockets.py`` (``--open``, ``--probes``, ``--every``). Prints figures, asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.facility_browser import free_port  # noqa: E402

PASSWORD = "bench-pass-9"
PAGES = ["/ws/facility/", "/ws/models/", "/ws/nodes/"]


def start(data_dir: Path) -> tuple[subprocess.Popen, str, Path]:
    env = {**os.environ, "LLMGW_DATA_DIR": str(data_dir), "ALLOWED_HOSTS": "127.0.0.1,localhost",
           "LOG_LEVEL": "WARNING", "LLMGW_MAX_SOCKETS": os.environ.get("LLMGW_MAX_SOCKETS", "10000")}
    env.pop("LLMGW_CONFIG", None)
    llmgw = shutil.which("llmgw", path=str(Path(sys.executable).parent)) or "llmgw"
    subprocess.run([llmgw, "migrate", "-v", "0"], env=env, check=True)
    subprocess.run([llmgw, "shell", "-c", (
        "from django.contrib.auth import get_user_model; "
        f"get_user_model().objects.create_superuser('bench', '', '{PASSWORD}')")], env=env, check=True)
    subprocess.run([llmgw, "ctl", "facility", "apply", "-f", str(ROOT / "llmgw/demo/server.yaml")], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    log = data_dir / "server.log"
    proc = subprocess.Popen([llmgw, "serve", f"127.0.0.1:{port}"], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    return proc, f"127.0.0.1:{port}", log


def token(data_dir: Path) -> str:
    env = {**os.environ, "LLMGW_DATA_DIR": str(data_dir)}
    llmgw = shutil.which("llmgw", path=str(Path(sys.executable).parent)) or "llmgw"
    return subprocess.run([llmgw, "ctl", "token", "create", "bench-operator", "--role", "operator"], env=env,
                          check=True, capture_output=True, text=True).stdout.strip()


async def changes(host: str, key: str, every: float) -> None:
    """The demo's models applied with llama-70b's replicas 4, 5, 4, …: each a placement change."""
    import httpx

    text = (ROOT / "llmgw/demo/models.yaml").read_text()
    async with httpx.AsyncClient(base_url=f"http://{host}/api/v1", timeout=60,
                                 headers={"Authorization": f"Token {key}"}) as client:
        for n in range(10**6):
            body = text.replace("replicas: 4", f"replicas: {4 + n % 2}", 1)
            answer = await client.post("/apply", json={"text": body, "filename": "models.yaml"})
            if answer.status_code >= 400:
                print(f"apply: {answer.status_code} {answer.text[:200]}")
                return
            await asyncio.sleep(every)


def login(host: str, proc: subprocess.Popen, log: Path) -> str:
    import httpx

    deadline = time.monotonic() + 60
    with httpx.Client(base_url=f"http://{host}", timeout=10) as client:
        while True:
            try:
                page = client.get("/login/")
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"llmgw serve did not start: {log.read_text()[-3000:]}") from None
                time.sleep(0.3)
        csrf = page.cookies["csrftoken"]
        client.post("/login/", data={"username": "bench", "password": PASSWORD, "csrfmiddlewaretoken": csrf},
                    headers={"Referer": f"http://{host}/login/"})
        return client.cookies["sessionid"]


async def run(host: str, session: str, key: str, opened: int, probes: int, every: float) -> None:
    from websockets.asyncio.client import connect

    headers = {"Cookie": f"sessionid={session}", "Origin": f"http://{host}"}

    async def one(path: str) -> tuple[object, float, float]:
        began = time.perf_counter()
        ws = await connect(f"ws://{host}{path}", additional_headers=headers, open_timeout=300, max_size=None)
        accepted = time.perf_counter()
        await ws.send('{"filter": ""}' if path != "/ws/nodes/" else '{"shown": "", "filter": ""}')
        first = 0.0
        if path == "/ws/facility/":  # the page that answers its first filter with a render
            await asyncio.wait_for(ws.recv(), 120)
            first = time.perf_counter() - began
        return ws, accepted - began, first

    began = time.perf_counter()
    sockets = await asyncio.gather(*(one(PAGES[i % len(PAGES)]) for i in range(opened)))
    print(f"{opened} sockets opened (each sent its filter) in {time.perf_counter() - began:.1f} s")
    changing = asyncio.ensure_future(changes(host, key, every))
    await asyncio.sleep(10)
    handshakes, firsts = [], []
    for _ in range(probes):
        ws, handshake, first = await one("/ws/facility/")
        handshakes.append(handshake * 1000)
        firsts.append(first * 1000)
        await ws.close()
    handshakes.sort()
    firsts.sort()
    print(f"with {opened} open: handshake median {handshakes[len(handshakes) // 2]:.0f} ms, "
          f"max {handshakes[-1]:.0f} ms; first render median {firsts[len(firsts) // 2]:.0f} ms, "
          f"max {firsts[-1]:.0f} ms ({probes} probes)")
    changing.cancel()
    for ws, _, _ in sockets:
        await ws.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--open", type=int, default=200)
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between placement changes")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="llmgw-bench-sockets-"))
    proc, host, log = start(data_dir)
    try:
        session = login(host, proc, log)
        asyncio.run(run(host, session, token(data_dir), args.open, args.probes, args.every))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            print("llmgw serve did not stop within 30 s of SIGTERM")
        errors = [line for line in log.read_text().splitlines() if "Traceback" in line or "ERROR" in line]
        if errors:
            print(f"server log: {len(errors)} error lines, the first: {errors[0]}")
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
