"""How long each `llmgw ctl` command of the README's tour takes on a running demo, as an operator types it.

    .venv/bin/python bench/ctl.py [--runs 5]

Starts `llmgw demo` (its simulated agents beating every 5 s) in a temporary LLMGW_DATA_DIR on a free port,
waits for it to answer, then runs each command `--runs` times in local mode (on the demo's database, as
ctl finds it) and prints the median and slowest wall time and the median CPU time (user + system: what
the machine's other load moves less) of each. A hold and its release take turns, so every hold finds the
rack free. The target: every command under 0.5 s on a quiet machine. Each command runs once untimed
first, with bytecode written (PYTHONDONTWRITEBYTECODE dropped: an installed llmgw has its .pyc files).
Figures only: nothing is asserted; the load average before and after is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ctl_start import LLMGW, ROOT, free_port, timed

COMMANDS = (
    "nodes",
    "facility",
    "facility feeds",
    "facility feed-loss",
    "models",
    "replicas",
    "explain-placement llama-70b",
    "headroom llama-70b",
    "facility what-if hold rack:r1-01 --drain",
    "facility hold rack:r1-01 --reason bench",
    "facility release rack:r1-01",
    "facility events",
)


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="llmgw-ctl-bench-") as data_dir:
        dropped = {"DATABASE_URL", "LLMGW_URL", "LLMGW_TOKEN", "REDIS_URL", "PYTHONDONTWRITEBYTECODE"}
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        env.update(LLMGW_DATA_DIR=data_dir, XDG_STATE_HOME=data_dir, XDG_CONFIG_HOME=data_dir)
        url = f"http://127.0.0.1:{free_port()}"
        demo = subprocess.Popen([str(LLMGW), "demo", "--addr", url.removeprefix("http://")], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    urllib.request.urlopen(f"{url}/api/v1/nodes", timeout=2)
                    break
                except urllib.error.HTTPError:  # it answers (401: no token given)
                    break
                except OSError:
                    if demo.poll() is not None or time.monotonic() > deadline:
                        sys.exit("bench/ctl.py: the demo did not answer within 300 s")
                    time.sleep(0.5)
            print(f"llmgw ctl on a running demo, {args.runs} runs each (wall time of the whole command), "
                  f"load average {load_average()}:")
            for command in COMMANDS:
                argv = [str(LLMGW), "ctl", *command.split()]
                undo = [str(LLMGW), "ctl", "facility", "release", "rack:r1-01"]
                redo = [str(LLMGW), "ctl", "facility", "hold", "rack:r1-01", "--reason", "bench"]
                before = {"facility hold": undo, "facility release": redo}.get(" ".join(command.split()[:2]))
                runs = []
                for i in range(args.runs + 1):
                    if before:
                        subprocess.run(before, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    wall_cpu = timed(argv, env)
                    if i:  # the first: bytecode written, caches warm
                        runs.append(wall_cpu)
                if before:  # the rack left free, as the next command expects
                    subprocess.run(undo, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                walls, cpus = [w for w, _ in runs], [c for _, c in runs]
                print(f"  ctl {command:<42} median {statistics.median(walls):.3f} s, slowest {max(walls):.3f} s; "
                      f"CPU median {statistics.median(cpus):.3f} s")
            print(f"load average after: {load_average()}")
        finally:
            demo.terminate()
            demo.wait(30)


if __name__ == "__main__":
    main()
