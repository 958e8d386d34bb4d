"""The console's Models page at 1,000 nodes and twenty models of 150 replicas each, in Chromium.

Makes its own database (``llmgw_bench_models``), bulk-loads the cluster of bench/placements.py (budgets on
every rack and PDU, three racks held) and its twenty models with ``--per-model`` replicas each, places
them (about two thirds fit: the rest wait with their reasons), starts ``llmgw serve`` on it and loads
/models/ ``--runs`` times in Debian's Chromium (1440×900), reading Navigation Timing: bytes, page height,
first byte, load event and the socket going live. Also times the live socket's render.
Run: ``.venv/bin/python bench/models_browser.py`` (``--nodes``, ``--per-model``, ``--runs``).
Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.facility_browser import CHROMIUM, PASSWORD, TIMING, figures, serve  # noqa: E402
from bench.placements import load_cluster, load_models, percentile  # noqa: E402

BENCH_DB = "llmgw_bench_models"


def prepare(nodes: int, per_model: int) -> str:
    """The bench database with the cluster, three held racks and the models placed; its URL."""
    from bench.placements import bench_database

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    os.environ["DATABASE_URL"] = bench_database(base, BENCH_DB)
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    load_cluster(nodes)
    from facility.services import hold_create

    for rack in ("r003", "r017", "r031"):
        hold_create(domain=f"rack:{rack}", reason="bench", drain=False)
    load_models(per_model)
    from placement.models import Replica, ReplicaState
    from placement.reconcile import reconcile_all

    reconcile_all()
    pending = Replica.objects.filter(state=ReplicaState.PENDING).count()
    total = Replica.objects.count()
    print(f"loaded {nodes} nodes, {total} replicas ({pending} pending) in {time.perf_counter() - t0:.1f} s")
    return os.environ["DATABASE_URL"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--per-model", type=int, default=150)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    database_url = prepare(args.nodes, args.per_model)

    from django.contrib.auth import get_user_model
    from django.template.loader import render_to_string

    from agents.consumers import ModelsConsumer
    from llmgw.users_cli import token_create

    token_create(username="bench", role="viewer")
    user = get_user_model().objects.get(username="bench")
    user.set_password(PASSWORD)
    user.save()

    consumer = ModelsConsumer()
    consumer.filter = ""
    renders = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        html = consumer.html()
        renders.append((time.perf_counter() - t0) * 1000)
    del render_to_string
    from django.db import connection

    connection.close()

    proc, base, _log = serve(database_url)
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            context = browser.new_context(base_url=base, viewport={"width": 1440, "height": 900})
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto("/login/")
            page.fill("input[name=username]", "bench")
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url("**/nodes/")
            page.goto("/models/")  # warm: the server's first render, the browser's cache of static files
            samples: dict[str, list[float]] = {"ttfb": [], "load": [], "live": []}
            last: dict = {}
            for _ in range(args.runs):
                t0 = time.perf_counter()
                page.goto("/models/", wait_until="load")
                page.wait_for_function("document.getElementById('live-status')?.textContent === 'live'")
                samples["live"].append((time.perf_counter() - t0) * 1000)
                last = page.evaluate(TIMING)
                samples["ttfb"].append(last["ttfb"])
                samples["load"].append(last["load"])
                # The cards in view ask for their headroom (a dry run each): done before the next load.
                page.wait_for_load_state("networkidle")
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"GET /models/ in Chromium at {args.nodes} nodes, 20 models × {args.per_model} replicas ({args.runs} loads, "
          f"{last['bytes'] // 1024} KiB transferred, page {last['height']} px tall):")
    print("  " + figures("first byte (server)", samples["ttfb"]))
    print("  " + figures("load event", samples["load"]))
    print("  " + figures("socket live (wall, from goto)", samples["live"]))
    print(f"  live render (socket, {len(html) // 1024} KiB): p50 {percentile(renders, 0.5):.0f} ms, "
          f"p99 {percentile(renders, 0.99):.0f} ms")


if __name__ == "__main__":
    main()
