"""`llmgw serve [ADDR:PORT]`: the console, the API and the live updates, through Daphne (ASGI)."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

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

    def loop() -> None:
        from placement.tasks import reconcile

        while True:
            time.sleep(interval)
            try:
                reconcile()
            except Exception:  # the next round tries again; a failed one must not end the loop
                log.exception("periodic reconcile failed")
            finally:
                close_old_connections()

    thread = threading.Thread(target=loop, name="llmgw-reconcile", daemon=True)
    thread.start()
    return thread


class Command(BaseCommand):
    help = (
        "Serve the console, the API (/api/v1) and /metrics with Daphne. Applies LLMGW_CONFIG first; without "
        "REDIS_URL it also runs the periodic reconcile in-process."
    )

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000", help="default 127.0.0.1:8000")
        parser.add_argument("--access-log", action="store_true", help="log every request (heartbeats included)")

    def handle(self, *args, addrport: str, access_log: bool = False, **options):
        from daphne.cli import CommandLineInterface

        host, _, port = addrport.rpartition(":")
        apply_server_config()
        start_inprocess_reconcile(settings.RECONCILE_INTERVAL_SECONDS)
        self.stdout.write(f"llmgw serving at http://{host or '127.0.0.1'}:{port}/")
        argv = ["-b", host or "127.0.0.1", "-p", port]
        if not access_log:
            argv += ["-v", "0"]
        CommandLineInterface().run([*argv, "llmgw.asgi:application"])
