"""`llmgw sim up -f cluster.yaml [--once]`: simulated agents for the nodes a cluster file declares; `llmgw sim
facility -f SCENARIO [--speed N]`: a facility scenario replayed into the simulated source."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from agents.simulator.client import run_nodes, run_round, tally_text
from agents.simulator.cluster import DEFAULT_INTERVAL_SECONDS, load_cluster_file
from agents.simulator.nodes import DEFAULT_READY_DELAY_SECONDS, SimNode
from llmgw.errors import InvalidInput
from llmgw.management import LlmgwCommand


def sim_tokens(specs: list[Mapping[str, Any]], tokens_file: str | None = None) -> dict[str, str]:
    """Each simulated node's token: from a JSON file of name → token, else made the way real ones are.

    Making them replaces any earlier token of those node names, so this is for simulated nodes only.
    """
    if tokens_file:
        try:
            tokens = json.loads(Path(tokens_file).read_text())
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"--tokens {tokens_file}: not a JSON mapping of node → token: {exc}") from exc
        if not isinstance(tokens, dict):
            raise InvalidInput(f"--tokens {tokens_file}: not a JSON mapping of node → token")
        missing = [s["name"] for s in specs if s["name"] not in tokens]
        if missing:
            raise InvalidInput(f"--tokens {tokens_file}: no token for {', '.join(missing[:5])}")
        return {s["name"]: str(tokens[s["name"]]) for s in specs}
    from agents.services import node_token_create

    return {s["name"]: node_token_create(node_name=s["name"]) for s in specs}


DEFAULT_SERVER = "http://127.0.0.1:8000"


def default_server() -> str:
    """Where the demo serves when the data found is the last demo's (llmgw demo ADDR records it), else
    DEFAULT_SERVER."""
    import os

    from llmgw.whereabouts import demo_record_read

    record = demo_record_read()
    data_dir = os.environ.get("LLMGW_DATA_DIR")
    if record and isinstance(record.get("url"), str) and data_dir and Path(record["data_dir"]) == Path(data_dir).resolve():
        return record["url"]
    return DEFAULT_SERVER


def sim_nodes(
    specs: list[Mapping[str, Any]], *, interval: int, ready_delay: float, seed: int = 0,
    capping_permitted: bool = True,
) -> list[SimNode]:
    return [
        SimNode(s, interval=interval, ready_delay=ready_delay, seed=seed, capping_permitted=capping_permitted)
        for s in specs
    ]


class Command(LlmgwCommand):
    help = (
        "Simulated agents for the nodes of a cluster file, through the real heartbeat API (sim up -f FILE); "
        "or a facility scenario replayed into the simulated source (sim facility -f SCENARIO [--speed N])."
    )

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", metavar="{up,facility}", required=True)
        up = actions.add_parser(
            "up",
            help="run the simulated agents of a cluster file's nodes",
            description="Run one simulated agent per node the cluster file declares, through the real heartbeat "
            "API and node tokens: GPUs that draw and warm up, replicas that start and get ready.",
        )
        up.add_argument("-f", "--file", required=True, help="the cluster file (nodes: …)")
        up.add_argument("--once", action="store_true", help="send one round of heartbeats and exit")
        up.add_argument(
            "--server", help="the control plane's address (default: where the demo whose data this is serves, else "
            f"{DEFAULT_SERVER})",
        )
        up.add_argument(
            "--interval", type=int, default=DEFAULT_INTERVAL_SECONDS, help="seconds between heartbeats, 1–10"
        )
        up.add_argument(
            "--ready-delay",
            type=float,
            default=DEFAULT_READY_DELAY_SECONDS,
            help="seconds a simulated replica is starting before it is ready (default 5)",
        )
        up.add_argument("--tokens", help="JSON file of node → token; without it the sim makes the tokens")
        up.add_argument("--seed", type=int, default=0, help="seed of the simulated readings")
        up.add_argument(
            "--no-capping-permission",
            action="store_true",
            help="simulate agents without root: GPUs keep their defaults and report capping: not permitted",
        )
        replay = actions.add_parser(
            "facility",
            help="replay a facility scenario into the simulated source",
            description="Replay a facility scenario into the simulated source from now, by its name (one "
            "shipped with llmgw: crac-failure) or a file (-f); the periodic evaluation reads it and the "
            "conditions follow (llmgw ctl facility events).",
        )
        replay.add_argument("scenario", nargs="?", help="a scenario shipped with llmgw, by name (crac-failure)")
        replay.add_argument("-f", "--file", help="a scenario file")
        replay.add_argument(
            "--speed", type=float, default=1.0, help="replay this many times faster (readings and hold times alike)"
        )

    def handle(self, *args, action: str, file: str | None, **options):
        if action == "facility":
            name = options.get("scenario")
            if bool(name) == bool(file):
                raise CommandError("sim facility: give a scenario's name (crac-failure) or -f FILE, one of them")
            if name:
                from llmgw.management.commands.demo import demo_scenario

                try:
                    file = str(demo_scenario(name)[0])
                except CommandError as exc:
                    raise CommandError(str(exc).replace("--scenario: ", "", 1)) from None
            self.replay_facility(file, options["speed"])
            return
        self.run_agents(file, **options)

    def run_agents(self, file: str, *, once: bool, server: str | None, interval: int, ready_delay: float,
                   tokens: str | None, seed: int, no_capping_permission: bool, **options) -> None:
        """Run the simulated agents of `file`'s nodes (`sim up`): one round with `once`, else until Ctrl-C."""
        if not 1 <= interval <= 10:
            raise CommandError(f"--interval: {interval} is not from 1 to 10 seconds")
        if ready_delay < 0:
            raise CommandError(f"--ready-delay: {ready_delay} is negative")
        try:
            specs = load_cluster_file(file)
            node_tokens = sim_tokens(specs, tokens)
        except InvalidInput as exc:
            raise CommandError(exc.message) from exc
        server = server or default_server()
        nodes = sim_nodes(
            specs, interval=interval, ready_delay=ready_delay, seed=seed, capping_permitted=not no_capping_permission
        )
        if once:
            results = run_round(nodes, node_tokens, server)
            failed = [r for r in results if not r.ok]
            self.stdout.write(f"sent {len(results)} heartbeats to {server}: {len(results) - len(failed)} ok")
            for result in failed[:10]:
                self.stderr.write(f"  {result.node}: {result.error}")
            if failed:
                raise CommandError(f"{len(failed)} of {len(results)} heartbeats failed")
            return
        self.stdout.write(f"simulating {len(nodes)} nodes against {server}, every {interval} s (Ctrl-C stops)")
        tally: Counter = Counter()
        try:
            asyncio.run(run_nodes(nodes, node_tokens, server, interval=interval, tally=tally))
        except KeyboardInterrupt:
            pass
        # What the control plane answered over the run: a refusal is logged once a streak, counted here each time.
        self.stdout.write(tally_text(tally))

    def replay_facility(self, file: str, speed: float) -> None:
        """Start replaying a scenario into the simulated source; the periodic evaluation reads it from now."""
        from facility.services import scenario_start
        from facility.sources import parse_scenario
        from llmgw.yamldoc import load_one, read_text

        try:
            data = load_one(read_text(file), file, what="scenario").data
            run = scenario_start(data=data, speed=speed)
        except InvalidInput as exc:
            raise CommandError(exc.message) from exc
        except ValueError as exc:
            raise CommandError(f"{file}: {exc}") from exc
        minutes = parse_scenario(data).duration / 60 / speed
        self.stdout.write(
            f"replaying {run.name} at ×{speed:g} from now ({minutes:.1f} min); "
            "conditions follow at each evaluation (llmgw ctl facility events)"
        )
