"""`llmgw demo`: migrate, load the demo facility, print an admin login, serve the console, run the sim.

The simulated agents of the demo's nodes run in a thread beside the server and post their heartbeats to it
over HTTP, so the console shows live sensor values and the nodes stay ready.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from llmgw.management import LlmgwCommand
from llmgw.whereabouts import demo_record_write

DEMO_DIR = Path(__file__).resolve().parent.parent.parent / "demo"



def demo_nodes() -> list[dict]:
    from agents.simulator.cluster import load_cluster_file

    return load_cluster_file(DEMO_DIR / "cluster.yaml")


def start_sim(server: str, *, interval: int, ready_delay: float = 5.0) -> threading.Thread:
    """Run the demo nodes' simulated agents in a daemon thread, once the server at `server` answers."""
    from agents.simulator.client import run_nodes
    from agents.simulator.nodes import SimNode
    from agents.simulator.tokens import KeptTokens, tokens_path, tokens_write
    from llmgw.management.commands.sim import sim_tokens

    specs = demo_nodes()
    # Kept where a token made later for one of these nodes (llmgw ctl node token gpu01) is handed over.
    path = tokens_path(settings.DATA_DIR)
    path.unlink(missing_ok=True)  # the last run's nodes are handed nothing while the new tokens are made
    tokens_write(path, sim_tokens(specs))
    tokens = KeptTokens(path)
    nodes = [SimNode(s, interval=interval, ready_delay=ready_delay) for s in specs]

    def run() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the server starts in this process's main thread, after us
            try:
                httpx.get(server, timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        asyncio.run(run_nodes(nodes, tokens, server, interval=interval))

    thread = threading.Thread(target=run, name="llmgw-sim", daemon=True)
    thread.start()
    return thread


def load_demo() -> None:
    """The demo's budgets, and each node as its first heartbeat would make it."""
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for
    from facility.services import facility_apply_file
    from placement.services import models_apply_file

    facility_apply_file(path=DEMO_DIR / "server.yaml")
    for spec in demo_nodes():
        heartbeat_record(node_name=spec["name"], heartbeat=heartbeat_for(spec))
    models_apply_file(path=DEMO_DIR / "models.yaml")


def ensure_free(addrport: str) -> None:
    """CommandError naming the address unless ADDR:PORT parses and nothing listens there yet."""
    host, _, port = addrport.rpartition(":")
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise CommandError(f"--addr: {addrport!r} is not ADDR:PORT (e.g. 127.0.0.1:8000)")
    host = (host or "127.0.0.1").strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no obstacle
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            raise CommandError(
                f"cannot serve at {host}:{port}: {exc.strerror or exc} (another server is there?). Stop it, or "
                f"pick another address: llmgw demo --addr 127.0.0.1:8001 (make demo ADDR=127.0.0.1:8001)"
            ) from exc


class Command(LlmgwCommand):
    help = "Load the demo facility (2 rooms, 8 racks, 32 nodes) and serve the console at http://127.0.0.1:8000"

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--addr", help="ADDR:PORT to serve at (the same as the argument; make demo ADDR=…)")
        parser.add_argument("--no-serve", action="store_true", help="load the demo and exit")
        parser.add_argument("--no-sim", action="store_true", help="serve without the simulated agents")
        parser.add_argument("--interval", type=int, default=5, help="the simulated agents' heartbeat seconds, 1–10")

    def handle(self, *args, addrport: str, addr: str | None, no_serve: bool, no_sim: bool, interval: int, **options):
        if not 1 <= interval <= 10:
            raise CommandError(f"--interval: {interval} is not from 1 to 10 seconds")
        addrport = addr or addrport
        if not no_serve:
            # Before anything is loaded or printed: a login for a server that is not ours helps no one.
            ensure_free(addrport)
        call_command("migrate", verbosity=0, interactive=False)
        load_demo()
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        host, _, port = addrport.rpartition(":")
        if not os.environ.get("DATABASE_URL"):
            # llmgw ctl, run from any directory with nothing set, works on this data (llmgw.whereabouts).
            url = None if no_serve else f"http://{host or '127.0.0.1'}:{port}"
            demo_record_write(data_dir=settings.DATA_DIR, url=url)
        self.stdout.write(
            f"\nDemo facility loaded: 32 nodes in 8 racks.\n"
            f"  console:  http://{host or '127.0.0.1'}:{port}/   (log in as admin / {password})\n"
            f"  admin:    http://{host or '127.0.0.1'}:{port}/admin/\n"
        )
        if no_serve:
            return
        if not no_sim:
            sim_host = host if host and host not in {"0.0.0.0", "::", "[::]"} else "127.0.0.1"
            start_sim(f"http://{sim_host}:{port}", interval=interval)
            self.stdout.write(f"  simulated agents: {len(demo_nodes())} nodes, a heartbeat every {interval} s\n")
        call_command("serve", addrport)
        # The server has stopped (Ctrl-C, SIGTERM). The simulator's event loop and its resolver threads
        # would hold the interpreter's exit open while they retry a server that is gone: leave now.
        self.stdout.flush()
        os._exit(0)
