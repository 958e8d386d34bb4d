"""`llmgw serve [ADDR:PORT]`: the console, the API and the live updates, through Daphne (ASGI)."""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.core.management.base import CommandError

from llmgw.management import LlmgwCommand

log = logging.getLogger("llmgw.serve")


def apply_server_config() -> None:
    """Apply LLMGW_CONFIG's facility block at server start, when it is set."""
    if settings.LLMGW_CONFIG:
        from facility.services import facility_apply_file

        facility_apply_file(path=settings.LLMGW_CONFIG)


def start_inprocess_reconcile(interval: float) -> threading.Thread | None:
    """Without Redis there is no beat: run the periodic reconcile in a thread of the server instead."""
    if settings.REDIS_URL:
        return None
    from facility.history import history_record
    from facility.tasks import netbox_sync_tick
    from llmgw import inprocess

    # Beat's other tasks: the minute's power history points, and the NetBox sync when it is due.
    inprocess.start_periodic("history", settings.HISTORY_INTERVAL_SECONDS, history_record)
    inprocess.start_periodic("netbox-sync", 60.0, netbox_sync_tick)
    return inprocess.start(interval, periodic_round)


def periodic_round() -> None:
    """What beat runs on workers, in one round: thermal conditions judged, then a reconcile."""
    from facility.evaluation import conditions_evaluate
    from placement.tasks import reconcile

    try:
        conditions_evaluate()
    except Exception:  # conditions are a fact to show; a failed round must not stop the reconcile
        log.exception("evaluating facility conditions failed")
    reconcile()


class Command(LlmgwCommand):
    help = (
        "Serve the console, the API (/api/v1), the live updates and /metrics (ASGI, uvicorn). Applies "
        "LLMGW_CONFIG first; without REDIS_URL it also runs the periodic reconcile in-process."
    )

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000", help="default 127.0.0.1:8000")
        parser.add_argument("--access-log", action="store_true", help="log every request (heartbeats included)")
        parser.add_argument(
            "--workers", type=int, default=1,
            help="server processes (default 1; more need REDIS_URL, so live updates reach every process)",
        )

    def handle(self, *args, addrport: str, access_log: bool = False, workers: int = 1, **options):
        import uvicorn

        from llmgw.serving import BoundedStopServer, uvicorn_limits

        host, _, port = addrport.rpartition(":")
        if not (port.isascii() and port.isdigit()):
            raise CommandError(f"addrport: {addrport!r} is not ADDR:PORT (e.g. 127.0.0.1:8000)")
        if workers < 1:
            raise CommandError("--workers: at least 1")
        if workers > 1 and not settings.REDIS_URL:
            raise CommandError(
                "--workers: more than one server process needs REDIS_URL (the in-memory channel layer and the "
                "in-process reconcile live in one process)"
            )
        apply_server_config()
        if workers == 1:
            start_inprocess_reconcile(settings.RECONCILE_INTERVAL_SECONDS)
        self.stdout.write(f"llmgw serving at http://{host or '127.0.0.1'}:{port}/")
        self.stdout.flush()
        served = {
            "host": host or "127.0.0.1",
            "port": int(port),
            "workers": workers,
            "access_log": access_log,
            "log_level": "info" if access_log else "warning",
            "lifespan": "off",
            **uvicorn_limits(),
        }
        if workers == 1:
            # The stop bounded in time (SIGTERM: out within LLMGW_SHUTDOWN_SECONDS and a margin).
            server = BoundedStopServer(uvicorn.Config("llmgw.asgi:application", **served))
            server.run()
            if not server.started:
                raise SystemExit(3)  # uvicorn.run's own code for a server that never started
        else:
            # uvicorn's own processes: each stops after LLMGW_SHUTDOWN_SECONDS (its graceful timeout).
            uvicorn.run("llmgw.asgi:application", **served)
