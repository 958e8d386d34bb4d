"""`llmgw demo`: migrate, load the demo facility, print an admin login, serve the console, run the sim.

The simulated agents of the demo's nodes run in a thread beside the server and post their heartbeats to it
over HTTP, so the console shows live sensor values and the nodes stay ready.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from llmgw.management import LlmgwCommand
from llmgw.whereabouts import DemoRunning, demo_lock_take, demo_record_write

DEMO_DIR = Path(__file__).resolve().parent.parent.parent / "demo"
# The facility scenarios `llmgw demo --scenario NAME` replays (and `llmgw sim facility -f` takes as files).
SCENARIOS_DIR = DEMO_DIR / "scenarios"  # package data: found by name from any install



def demo_nodes() -> list[dict]:
    from agents.simulator.cluster import load_cluster_file

    return load_cluster_file(DEMO_DIR / "cluster.yaml")


def start_sim(
    server: str, *, interval: int, ready_delay: float = 5.0, answered: Callable[[], None] | None = None
) -> threading.Thread:
    """Run the demo nodes' simulated agents in a daemon thread, once the server at `server` answers
    (``answered`` is called then, before the first heartbeat)."""
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
        if answered is not None:
            answered()
        asyncio.run(run_nodes(nodes, tokens, server, interval=interval))

    thread = threading.Thread(target=run, name="llmgw-sim", daemon=True)
    thread.start()
    return thread


def load_demo() -> None:
    """The demo's budgets, and each node as its first heartbeat would make it."""
    from django.utils import timezone

    from agents.models import Node
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for
    from facility.services import facility_apply_file
    from placement.services import models_apply_file

    facility_apply_file(path=DEMO_DIR / "server.yaml")
    specs = demo_nodes()
    for spec in specs:
        heartbeat_record(node_name=spec["name"], heartbeat=heartbeat_for(spec))
    # Heard from as the load ends, as the simulated agents are about to beat: on a loaded machine 32 joins
    # can take longer than three heartbeats' intervals, and the first nodes would be not ready (and passed
    # over) when the models are placed.
    Node.objects.filter(name__in=[spec["name"] for spec in specs]).update(last_heartbeat_at=timezone.now())
    models_apply_file(path=DEMO_DIR / "models.yaml")


def demo_scenario(name: str) -> tuple[Path, dict]:
    """The scenario `--scenario` names: one of llmgw/demo/scenarios by its name (crac-failure), or a file; read
    and checked before anything is loaded, or CommandError naming what there is."""
    from facility.sources import parse_scenario
    from llmgw.errors import InvalidInput
    from llmgw.yamldoc import load_one, read_text

    path = Path(name)
    if path.suffix not in (".yaml", ".yml") and "/" not in name:
        path = SCENARIOS_DIR / f"{name}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml"))) or "none"
            raise CommandError(f"--scenario: no scenario {name!r} (the demo's: {known}; or give a scenario file)")
    try:
        data = load_one(read_text(path), str(path), what="scenario").data
        parse_scenario(data)
    except InvalidInput as exc:
        raise CommandError(f"--scenario: {exc.message}") from exc
    except ValueError as exc:
        raise CommandError(f"--scenario: {path}: {exc}") from exc
    return path, data


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
    help = (
        "Load the demo facility (2 rooms, 8 racks, 32 nodes) and serve the console at http://127.0.0.1:8000 "
        "(another address: --addr)"
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "addrport", nargs="?", default="127.0.0.1:8000", help="ADDR:PORT to serve at (default 127.0.0.1:8000)"
        )
        parser.add_argument("--addr", help="ADDR:PORT to serve at (the same as the argument; make demo ADDR=…)")
        parser.add_argument("--no-serve", action="store_true", help="load the demo and exit")
        parser.add_argument("--no-sim", action="store_true", help="serve without the simulated agents")
        parser.add_argument("--interval", type=int, default=5, help="the simulated agents' heartbeat seconds, 1–10")
        parser.add_argument(
            "--scenario",
            help="replay a facility scenario into the simulated source from the start: crac-failure (a row's "
            "cooling fails; llmgw/demo/scenarios) or a scenario file",
        )
        parser.add_argument(
            "--speed", type=float, default=10.0,
            help="the scenario's replay speed (default 10: crac-failure's 50 minutes in 5)",
        )

    def handle(self, *args, addrport: str, addr: str | None, no_serve: bool, no_sim: bool, interval: int,
               scenario: str | None = None, speed: float = 10.0, **options):
        if not 1 <= interval <= 10:
            raise CommandError(f"--interval: {interval} is not from 1 to 10 seconds")
        if not 0 < speed <= 10_000:
            raise CommandError(f"--speed: {speed:g} is not above 0 and at most 10000")
        replay = demo_scenario(scenario) if scenario else None
        addrport = addr or addrport
        host, _, port = addrport.rpartition(":")
        url = None if no_serve else f"http://{host or '127.0.0.1'}:{port}"
        try:
            # Before anything is loaded: a second demo on this data would reset the first's admin password,
            # repoint demo.json and beat for the same nodes. Held until this process ends.
            self._lock = demo_lock_take(settings.DATA_DIR, url=url)
        except DemoRunning as exc:
            raise CommandError(str(exc)) from None
        if not no_serve:
            # Before anything is loaded or printed: a login for a server that is not ours helps no one.
            ensure_free(addrport)
        call_command("migrate", verbosity=0, interactive=False)
        load_demo()
        if replay is not None:
            from facility.services import scenario_start
            from facility.sources import parse_scenario

            run = scenario_start(data=replay[1], speed=speed)
            minutes = parse_scenario(replay[1]).duration / 60 / speed
            self.stdout.write(
                f"Replaying {run.name} ({replay[0].name}) at ×{speed:g} from now, {minutes:.1f} min: the Facility "
                "page and llmgw ctl facility events follow it"
            )
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        if not os.environ.get("DATABASE_URL"):
            # llmgw ctl, run from any directory with nothing set, works on this data (llmgw.whereabouts).
            demo_record_write(data_dir=settings.DATA_DIR, url=url)
        login = (
            "\nDemo facility loaded: 32 nodes in 8 racks.\n"
            + ("" if no_serve or no_sim else
               f"  simulated agents: {len(demo_nodes())} nodes, a heartbeat every {interval} s\n")
            + f"  admin:    http://{host or '127.0.0.1'}:{port}/admin/\n"
            f"  console:  http://{host or '127.0.0.1'}:{port}/   (log in as admin / {password})\n"
        )
        if no_serve or no_sim:
            self.stdout.write(login)
        if no_serve:
            return
        if not no_sim:
            # The login last, once the server answers: after its own lines, where a person looks.
            logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per simulated request
            sim_host = host if host and host not in {"0.0.0.0", "::", "[::]"} else "127.0.0.1"
            start_sim(f"http://{sim_host}:{port}", interval=interval, answered=lambda: (
                self.stdout.write(login), self.stdout.flush()))
        call_command("serve", addrport)
        # The server has stopped (Ctrl-C, SIGTERM). The simulator's event loop and its resolver threads
        # would hold the interpreter's exit open while they retry a server that is gone: leave now.
        self.stdout.flush()
        os._exit(0)
