"""Browser load time of the console's Facility page at 1,000 nodes and 40 racks, in Chromium.

Loads the cluster of bench/facility_page.py (its own database, 48 h of history), starts ``llmgw serve`` on
it, logs in with Playwright (Debian's /usr/bin/chromium, 1440×900) and loads /facility/ ``--runs`` times,
reading the browser's Navigation Timing: time to the first byte (the server), to the page being
interactive (``domInteractive``: parsed, scripts may run; ``domContentLoadedEventEnd``: htmx has bound
the page), to the load event (styles, scripts and images in), and until the live socket says "live".
Run: ``.venv/bin/python bench/facility_browser.py`` (``--nodes``, ``--runs``). Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.facility_page import prepare  # noqa: E402
from bench.placements import percentile  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "bench-pass-9"
TIMING = """() => {
  const n = performance.getEntriesByType('navigation')[0];
  return {ttfb: n.responseStart, interactive: n.domInteractive, dcl: n.domContentLoadedEventEnd,
          load: n.loadEventEnd, bytes: n.transferSize, height: document.documentElement.scrollHeight};
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(database_url: str) -> tuple[subprocess.Popen, str, Path]:
    """``llmgw serve`` on the bench database; the process, its base URL and its log."""
    port = free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="llmgw-bench-browser-"))
    env = {**os.environ, "DATABASE_URL": database_url, "LLMGW_DATA_DIR": str(data_dir),
           "ALLOWED_HOSTS": "127.0.0.1,localhost", "LOG_LEVEL": "WARNING"}
    for key in ("REDIS_URL", "LLMGW_CONFIG", "DJANGO_SETTINGS_MODULE"):
        env.pop(key, None)
    llmgw = shutil.which("llmgw", path=str(Path(sys.executable).parent)) or "llmgw"
    log = data_dir / "server.log"
    proc = subprocess.Popen([llmgw, "serve", f"127.0.0.1:{port}"], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/login/", timeout=1).status_code == 200:
                return proc, base, log
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"llmgw serve did not start: {log.read_text()[-3000:]}")


def figures(name: str, samples: list[float]) -> str:
    return f"{name} p50 {percentile(samples, 0.5):.0f} ms, p99 {percentile(samples, 0.99):.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    database_url = prepare(args.nodes)

    from django.contrib.auth import get_user_model

    from llmgw.users_cli import token_create

    token_create(username="bench", role="viewer")
    user = get_user_model().objects.get(username="bench")
    user.set_password(PASSWORD)
    user.save()
    from django.db import connection

    connection.close()

    proc, base, log = serve(database_url)
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            context = browser.new_context(base_url=base, viewport={"width": 1440, "height": 900})
            page = context.new_page()
            page.set_default_timeout(30_000)
            page.goto("/login/")
            page.fill("input[name=username]", "bench")
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url("**/nodes/")
            page.goto("/facility/")  # warm: the server's first render, the browser's cache of static files
            samples: dict[str, list[float]] = {"ttfb": [], "interactive": [], "dcl": [], "load": [], "live": []}
            last: dict = {}
            for _ in range(args.runs):
                t0 = time.perf_counter()
                page.goto("/facility/", wait_until="load")
                page.wait_for_function("document.getElementById('live-status')?.textContent === 'live'")
                live = (time.perf_counter() - t0) * 1000
                last = page.evaluate(TIMING)
                for key in ("ttfb", "interactive", "dcl", "load"):
                    samples[key].append(last[key])
                samples["live"].append(live)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"GET /facility/ in Chromium at {args.nodes} nodes, 40 racks ({args.runs} loads, "
          f"{last['bytes'] // 1024} KiB transferred, page {last['height']} px tall):")
    print("  " + figures("first byte (server)", samples["ttfb"]))
    print("  " + figures("interactive (domInteractive)", samples["interactive"]))
    print("  " + figures("DOMContentLoaded done (htmx bound)", samples["dcl"]))
    print("  " + figures("load event", samples["load"]))
    print("  " + figures("socket live (wall, from goto)", samples["live"]))


if __name__ == "__main__":
    main()
