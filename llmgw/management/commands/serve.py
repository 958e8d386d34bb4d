"""`llmgw serve [ADDR:PORT]`: the console, the API and the live updates, through Daphne (ASGI)."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand


def apply_server_config() -> None:
    """Apply LLMGW_CONFIG's facility block at server start, when it is set."""
    if settings.LLMGW_CONFIG:
        from facility.services import facility_apply_file

        facility_apply_file(path=settings.LLMGW_CONFIG)


class Command(BaseCommand):
    help = "Serve the console, the API (/api/v1) and /metrics with Daphne. Applies LLMGW_CONFIG first."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000", help="default 127.0.0.1:8000")

    def handle(self, *args, addrport: str, **options):
        from daphne.cli import CommandLineInterface

        host, _, port = addrport.rpartition(":")
        apply_server_config()
        self.stdout.write(f"llmgw serving at http://{host or '127.0.0.1'}:{port}/")
        CommandLineInterface().run(["-b", host or "127.0.0.1", "-p", port, "llmgw.asgi:application"])
