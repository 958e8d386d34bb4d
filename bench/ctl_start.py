"""How long `llmgw ctl` takes to list, on the database (local mode) and through the API (remote mode).

    .venv/bin/python bench/ctl_start.py [--runs 10] [--nodes 20]

Makes an embedded control plane in a temporary LLMGW_DATA_DIR (migrate, a few nodes, a viewer token),
serves it with `llmgw serve` on a free port, then runs the real `llmgw ctl` listings (nodes, models,
replicas, facility, facility feeds, facility events) `--runs` times each way, local (on the database,
Django with the listings' apps: settings.CTL_READ_APPS) and remote (LLMGW_URL, no Django). It prints the
median and the slowest wall time of each and the median CPU time, and how many modules a listing imports
each way. The target: a listing in under 0.5 s. Each command runs once untimed first, with bytecode
written (PYTHONDONTWRITEBYTECODE is dropped): an installed llmgw has its .pyc files. Figures only: nothing
is asserted, the machine's load moves them (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLMGW = Path(sys.executable).parent / "llmgw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LISTINGS = ("nodes", "models", "replicas", "facility", "facility feeds", "facility events")
HEAVY = ("celery", "channels", "daphne", "twisted", "rest_framework.views", "drf_spectacular", "prometheus_client")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """The command's wall time and its CPU time (user + system: what the machine's other load moves less)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def seed(env: dict[str, str], nodes: int) -> str:
    """Join `nodes` simulated nodes and apply a model; return a viewer's API token."""
    code = f"""
import django
django.setup()
from agents.services import heartbeat_record
from agents.simulator.cluster import heartbeat_for
from llmgw.users_cli import token_create
from placement.services import model_apply
for i in range({nodes}):
    name = f"gpu{{i:03d}}"
    spec = {{"name": name, "gpus": 8, "gpu_model": "H100", "gpu_memory_gib": 80, "gpu_power_limit_watts": 700,
            "cpu_cores": 96, "memory_gib": 2048, "labels": {{"llmgw.io/rack": f"r{{i // 10}}"}}}}
    heartbeat_record(node_name=name, heartbeat=heartbeat_for(spec))
model_apply(data={{"kind": "Model", "name": "llama", "replicas": 2, "profile": {{"gpus": 4}}}})
print(token_create(username="bench", role="viewer"))
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="llmgw-ctl-bench-") as data_dir:
        dropped = {"DATABASE_URL", "LLMGW_URL", "LLMGW_TOKEN", "REDIS_URL", "PYTHONDONTWRITEBYTECODE"}
        base = {k: v for k, v in os.environ.items() if k not in dropped}
        env = {**base, "LLMGW_DATA_DIR": data_dir, "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": data_dir,
               "DJANGO_SETTINGS_MODULE": "llmgw.settings"}
        subprocess.run([str(LLMGW), "migrate", "-v", "0"], env=env, check=True)
        token = seed(env, args.nodes)
        port = free_port()
        server = subprocess.Popen(
            [str(LLMGW), "serve", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    request = urllib.request.Request(f"{url}/api/v1/nodes", headers={"Authorization": f"Token {token}"})
                    json.load(urllib.request.urlopen(request, timeout=2))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        sys.exit("bench/ctl_start.py: the server did not answer within 60 s")
                    time.sleep(0.2)
            remote_env = {**env, "LLMGW_URL": url, "LLMGW_TOKEN": token}
            print(f"llmgw ctl, {args.runs} runs each, {args.nodes} nodes (wall time of the whole command), "
                  f"load average {Path('/proc/loadavg').read_text().split()[0]}:")
            for command in LISTINGS:
                for mode, run_env in (("local ", env), ("remote", remote_env)):
                    argv = [str(LLMGW), "ctl", *command.split()]
                    timed(argv, run_env)  # bytecode written, caches warm
                    runs = [timed(argv, run_env) for _ in range(args.runs)]
                    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
                    print(f"  {mode} ctl {command:<16} median {statistics.median(walls):.3f} s, slowest "
                          f"{max(walls):.3f} s; CPU median {statistics.median(cpus):.3f} s")
            probe = "import sys; from llmgw.cli import main; main(['ctl', 'nodes', '-o', 'json']); " \
                    f"print(len(sys.modules), sum(m.split('.')[0] == 'django' for m in sys.modules), " \
                    f"','.join(m for m in {HEAVY!r} if m in sys.modules) or '-', file=sys.stderr)"
            for mode, run_env in (("local ", env), ("remote", remote_env)):
                out = subprocess.run([sys.executable, "-c", probe], env=run_env, capture_output=True, text=True,
                                     check=True, cwd=ROOT)
                modules, django_modules, heavy = out.stderr.split()[-3:]
                print(f"  a {mode.strip()} listing imports {modules} modules, {django_modules} of them Django's; "
                      f"of {', '.join(HEAVY)}: {heavy}")
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
