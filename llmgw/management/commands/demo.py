"""`llmgw demo`: migrate, load the demo facility, print an admin login, and serve the console."""

from __future__ import annotations

import secrets
from pathlib import Path

import yaml
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

DEMO_DIR = Path(__file__).resolve().parent.parent.parent / "demo"


def demo_nodes() -> list[dict]:
    return yaml.safe_load((DEMO_DIR / "cluster.yaml").read_text())["nodes"]


def load_demo() -> None:
    """The demo's budgets, and each node as its first heartbeat would make it."""
    from agents.sim import heartbeat_for
    from agents.services import heartbeat_record
    from facility.services import facility_apply_file

    facility_apply_file(path=DEMO_DIR / "server.yaml")
    for spec in demo_nodes():
        heartbeat_record(node_name=spec["name"], heartbeat=heartbeat_for(spec))


class Command(BaseCommand):
    help = "Load the demo facility (2 rooms, 8 racks, 32 nodes) and serve the console at http://127.0.0.1:8000"

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--no-serve", action="store_true", help="load the demo and exit")

    def handle(self, *args, addrport: str, no_serve: bool, **options):
        call_command("migrate", verbosity=0, interactive=False)
        load_demo()
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        host, _, port = addrport.rpartition(":")
        self.stdout.write(
            f"\nDemo facility loaded: 32 nodes in 8 racks.\n"
            f"  console:  http://{host or '127.0.0.1'}:{port}/   (log in as admin / {password})\n"
            f"  admin:    http://{host or '127.0.0.1'}:{port}/admin/\n"
        )
        if not no_serve:
            call_command("serve", addrport)
