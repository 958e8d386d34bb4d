"""Server time of the console's Facility page at 1,000 nodes, 40 racks and 80 PDUs, with 48 h of history.

Makes its own database (``llmgw_bench_facility`` on the server of DATABASE_URL), bulk-loads the cluster of
bench/placements.py (budgets on every rack and PDU, a few holds), writes 48 h of minute points and their
quarter-hour roll-ups for every domain, then times GET /facility/ (the whole page), the filtered
body htmx asks for, and what the live socket renders (facility.views.facility_fragments: every part it
compares, sending those that changed).

With ``--busy`` (the default) the site is as a facility team sees it on a bad day: a feed per PDU (N−1 is
judged), replicas on most nodes, shedding on under enforce mode and a quarter of the racks hot, so what
shedding would do next plans its moves. The page is timed twice: with its figures (N−1, the shedding moves)
worked out on each load — as every load did before they were kept (facility.console_figures) — and read
from the cache as a page load now does.
Run: ``.venv/bin/python bench/facility_page.py`` (``--nodes``, ``--runs``, ``--quiet-site``). Prints figures,
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.placements import load_cluster, percentile  # noqa: E402

BENCH_DB = "llmgw_bench_facility"


def load_history(hours: int = 48) -> int:
    """Minute and quarter-hour points for every domain over `hours` (what history_record leaves)."""
    from django.utils import timezone

    from facility.models import DomainSample, Resolution
    from placement.selectors import facility_overview

    domains = [d["domain"] for d in facility_overview()["domains"]]
    now = timezone.now().replace(second=0, microsecond=0)
    rows = []
    for minute in range(hours * 60):
        at = now - timedelta(minutes=minute)
        resolutions = [Resolution.MINUTE] + ([Resolution.QUARTER] if at.minute % 15 == 0 else [])
        for resolution in resolutions:
            rows += [
                DomainSample(domain=d, resolution=resolution, at=at, use_watts=1000.0 + minute,
                             reserved_watts=900.0, measured_peak_watts=1100.0)
                for d in domains
            ]
        if len(rows) > 20000:
            DomainSample.objects.bulk_create(rows, batch_size=5000)
            rows = []
    DomainSample.objects.bulk_create(rows, batch_size=5000)
    return DomainSample.objects.count()


def timed(runs: int, fn) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return percentile(samples, 0.5), percentile(samples, 0.99)


def prepare(nodes: int) -> str:
    """Make the bench database and load the cluster (nodes, 40 racks, 80 PDUs, holds, 48 h of history);
    returns its URL (also set as DATABASE_URL)."""
    import bench.placements as placements

    placements.BENCH_DB = BENCH_DB  # bench_database makes the database this names
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    os.environ["DATABASE_URL"] = placements.bench_database(base)
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
        hold_create(domain=f"rack:{rack}", reason="bench", drain=rack == "r017")
    points = load_history()
    print(f"loaded {nodes} nodes, 40 racks, 80 PDUs, {points} history points in {time.perf_counter() - t0:.1f} s")
    return os.environ["DATABASE_URL"]


def make_busy(nodes: int) -> str:
    """A feed per PDU, replicas on most nodes, shedding on under enforce and every fourth rack hot."""
    from bench.placements import NODES_PER_RACK
    from facility.services import condition_override_set, facility_apply
    from placement.models import Replica
    from placement.reconcile import reconcile_all
    from placement.services import models_apply

    racks = sorted({f"r{i // NODES_PER_RACK:03}" for i in range(nodes)})
    feeds = "".join(
        f"    - {{name: F-{rack}-{side}, voltage: 415, amperage: 63, phase: three, pdus: [{rack}-{side}]}}\n"
        for rack in racks for side in "ab"
    )
    facility_apply(text=(
        "facility:\n  conditions: {mode: enforce}\n  sources: {agents: false}\n"
        "  shedding: {enabled: true, shed_after: 10m, interval: 5m}\n"
        f"  feeds:\n{feeds}"
    ), confirm=True)
    models_apply(text="---\n".join(
        f"kind: Model\nname: bench{m:02}\nreplicas: {nodes * 6 // 10 // 20}\nclass: {('batch', 'standard')[m % 2]}\n"
        "min_ready: 0\nprofile: {gpus: 8, min_ready_seconds: 0, command: 'serve {model} --port {port}'}\n"
        for m in range(20)
    ))
    reconcile_all()
    for rack in racks[::4]:
        condition_override_set(domain=f"rack:{rack}", condition="hot", reason="bench: CRAC down", seconds=86400)
    return f"{len(racks) * 2} feeds, {Replica.objects.count()} replicas, {len(racks[::4])} racks hot, shedding on"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quiet-site", action="store_true", help="no feeds, replicas, shedding or heat")
    args = parser.parse_args()
    prepare(args.nodes)
    if not args.quiet_site:
        t0 = time.perf_counter()
        print(f"{make_busy(args.nodes)} in {time.perf_counter() - t0:.1f} s")
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.test import Client

    from facility.console_figures import facility_version
    from facility.views import facility_fragments
    from llmgw.users_cli import token_create
    from placement.shedding import shed_plan

    token_create(username="bench", role="viewer")
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    size = len(client.get("/facility/").content)
    gzipped = len(client.get("/facility/", HTTP_ACCEPT_ENCODING="gzip").content)
    print(f"shedding's next moves: {len(shed_plan())}")

    def worked_out():
        cache.clear()  # the figures worked out again, as on every load before they were kept
        client.get("/facility/")

    p50, p99 = timed(args.runs, worked_out)
    print(f"GET /facility/ with its figures worked out (every load, before): p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    p50, p99 = timed(args.runs, lambda: client.get("/facility/"))
    print(f"GET /facility/ (whole page, {size // 1024} KiB, {gzipped // 1024} KiB gzipped), its figures "
          f"from the cache: p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    p50, p99 = timed(args.runs, facility_version)
    print(f"the facility's version (the cache key's query): p50 {p50:.1f} ms")
    p50, p99 = timed(args.runs, lambda: client.get("/facility/?q=r01", HTTP_HX_REQUEST="true"))
    print(f"GET /facility/?q=r01 (htmx body): p50 {p50:.0f} ms, p99 {p99:.0f} ms")

    def live():
        facility_fragments({})  # every part the socket compares (and sends, when it changed)

    p50, p99 = timed(args.runs, live)
    print(f"live render (socket): p50 {p50:.0f} ms, p99 {p99:.0f} ms")


if __name__ == "__main__":
    main()
