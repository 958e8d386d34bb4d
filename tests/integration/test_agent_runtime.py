"""The replica runtime with real child processes (tests/fakes/model_server.py), and its restart
policy with a fake clock and fake processes."""

from __future__ import annotations

import json
import logging
import os
import random
import shlex
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.node import protocol
from agents.node.config import RuntimeSettings
from agents.node.runtime import Runtime, exit_message

FAKE_SERVER = Path(__file__).resolve().parents[1] / "fakes" / "model_server.py"
DEADLINE_SECONDS = 10.0


def server_command(*flags: str) -> str:
    return (
        " ".join(shlex.quote(part) for part in (sys.executable, str(FAKE_SERVER)))
        + " --port {port} "
        + " ".join(flags)
    )


def assignment(replica_id: int = 17, command: str | None = None, gpus: list[int] | None = None) -> dict:
    return {
        "id": replica_id,
        "model": "llama-70b",
        "command": command or server_command(),
        "gpus": [0, 1] if gpus is None else gpus,
        "cpu_cores": 16,
        "memory_gib": 256,
    }


@pytest.fixture
def port_range() -> tuple[int, int]:
    # A random block below Linux's ephemeral ports (32768 up), so parallel runs, leftovers from other
    # tests and outgoing connections do not collide; its first port free now (one test binds it).
    for _ in range(100):
        low = random.randrange(20000, 32700, 50)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", low))
            except OSError:
                continue
        return (low, low + 49)
    raise RuntimeError("no free block of ports for the runtime tests")


@pytest.fixture
def make_runtime(port_range):
    made: list[Runtime] = []

    def make(**settings) -> Runtime:
        values = {
            "port_range": port_range,
            "grace_seconds": 0.5,
            "restart_backoff_seconds": 0.1,
            "restart_backoff_max_seconds": 0.4,
        }
        values.update(settings)
        runtime = Runtime(RuntimeSettings(**values))
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:  # never leave a model server behind, even when a test fails
        runtime.shutdown()


def poll_until(runtime: Runtime, predicate: Callable[[list[dict]], bool]) -> list[dict]:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        runtime.poll()
        states = runtime.states()
        if predicate(states):
            return states
        time.sleep(0.02)
    raise AssertionError(f"not reached within {DEADLINE_SECONDS} s; states: {runtime.states()}")


def is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def wait_dead(pid: int) -> bool:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.02)
    return False


def get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read())


# -- real processes ----------------------------------------------------------------------------


def test_a_replica_starts_then_is_ready_when_health_answers(make_runtime, port_range):
    runtime = make_runtime()
    runtime.sync([assignment(command=server_command("--ready-after", "0.3"))])

    [state] = runtime.states()
    assert state["id"] == 17
    assert state["state"] == "starting"
    assert port_range[0] <= state["port"] <= port_range[1]
    assert is_alive(state["pid"])

    [state] = poll_until(runtime, lambda s: s[0]["state"] == "ready")
    assert state["restarts"] == 0
    assert state["message"] == ""
    assert get_json(state["port"], "/env")["pid"] == state["pid"]


def test_gpus_port_model_and_replica_reach_the_child(make_runtime):
    runtime = make_runtime()
    command = server_command("--tag", "{model}", "--tag", "replica-{replica}", "--tag", "gpus-{gpus}")
    runtime.sync([assignment(replica_id=5, command=command, gpus=[0, 3])])
    [state] = poll_until(runtime, lambda s: s[0]["state"] == "ready")

    seen = get_json(state["port"], "/env")
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0,3"
    assert seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # NVML's numbering, not fastest-first
    assert seen["argv"][1:] == [
        "--port",
        str(state["port"]),
        "--tag",
        "llama-70b",
        "--tag",
        "replica-5",
        "--tag",
        "gpus-0,3",
    ]


def test_a_cpu_replica_sees_no_gpu(make_runtime):
    runtime = make_runtime()
    runtime.sync([assignment(gpus=[])])
    [state] = poll_until(runtime, lambda s: s[0]["state"] == "ready")
    assert get_json(state["port"], "/env")["env"]["CUDA_VISIBLE_DEVICES"] == ""


def test_the_same_assignment_twice_does_not_restart(make_runtime):
    runtime = make_runtime()
    runtime.sync([assignment()])
    [first] = poll_until(runtime, lambda s: s[0]["state"] == "ready")
    runtime.sync([assignment()])
    runtime.poll()
    assert runtime.states() == [first]


def test_two_replicas_get_two_ports_and_a_taken_port_is_skipped(make_runtime, port_range):
    runtime = make_runtime()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port_range[0]))
        taken.listen()
        runtime.sync([assignment(1), assignment(2)])
        ports = [state["port"] for state in runtime.states()]
    assert port_range[0] not in ports
    assert len(set(ports)) == 2


def test_an_unassigned_replica_gets_sigterm_and_is_gone_with_its_children(make_runtime):
    runtime = make_runtime()
    runtime.sync([assignment(command=server_command("--spawn-child"))])
    [state] = poll_until(runtime, lambda s: s[0]["state"] == "ready")
    child_pid = get_json(state["port"], "/env")["child_pid"]
    assert is_alive(child_pid)

    runtime.sync([])
    [stopping] = runtime.states()
    assert stopping["state"] == "stopping"
    assert stopping["message"] == "no longer assigned"

    poll_until(runtime, lambda s: s == [])
    assert wait_dead(state["pid"])
    assert wait_dead(child_pid)  # the whole process group went, not only the leader


def test_a_server_ignoring_sigterm_is_killed_after_the_grace(make_runtime, caplog):
    caplog.set_level(logging.INFO, logger="llmgw.agent.runtime")
    runtime = make_runtime(grace_seconds=0.5)
    runtime.sync([assignment(command=server_command("--ignore-sigterm"))])
    [state] = poll_until(runtime, lambda s: s[0]["state"] == "ready")

    runtime.sync([])
    assert runtime.states()[0]["state"] == "stopping"
    poll_until(runtime, lambda s: s == [])
    assert wait_dead(state["pid"])
    assert "replica 17: still running 0.5 s after SIGTERM; sending SIGKILL" in caplog.messages
    assert "replica 17 (llama-70b): stopped, killed by signal 9 (SIGKILL)" in caplog.messages


def test_a_crash_is_reported_failed_then_restarted(make_runtime):
    runtime = make_runtime(restart_backoff_seconds=0.2)
    runtime.sync([assignment(command=server_command("--crash-after", "0.3", "--exit-code", "3"))])
    [first] = poll_until(runtime, lambda s: s[0]["state"] == "ready")

    [failed] = poll_until(runtime, lambda s: s[0]["state"] == "failed")
    assert failed["message"] == "exited with status 3"
    assert failed["pid"] is None
    assert failed["restarts"] == 0

    [again] = poll_until(runtime, lambda s: s[0]["restarts"] == 1 and s[0]["pid"] is not None)
    assert again["state"] in ("starting", "ready")
    assert again["pid"] != first["pid"]
    assert again["port"] == first["port"]  # the replica keeps its port across restarts


def test_shutdown_stops_everything(make_runtime):
    runtime = make_runtime(grace_seconds=0.3)
    runtime.sync([assignment(1), assignment(2, command=server_command("--ignore-sigterm"))])
    states = poll_until(runtime, lambda s: all(r["state"] == "ready" for r in s))

    runtime.shutdown()
    assert runtime.states() == []
    assert all(wait_dead(state["pid"]) for state in states)


def test_a_missing_program_fails_and_is_retried(make_runtime):
    runtime = make_runtime()
    runtime.sync([assignment(command="/nonexistent/vllm serve {model} --port {port}")])
    [state] = runtime.states()
    assert state["state"] == "failed"
    assert state["message"] == "cannot start '/nonexistent/vllm': No such file or directory"
    poll_until(runtime, lambda s: s[0]["restarts"] >= 1)


def test_a_bad_template_fails_and_waits_for_a_new_assignment(make_runtime):
    runtime = make_runtime()
    runtime.sync([assignment(command="vllm serve {modle} --port {port}")])
    [state] = runtime.states()
    assert state["state"] == "failed"
    assert state["message"] == (
        "command template 'vllm serve {modle} --port {port}': unknown field {modle}; "
        "the fields are {model}, {port}, {replica}, {gpus}"
    )
    runtime.sync([assignment()])  # the control plane fixed the profile
    poll_until(runtime, lambda s: s[0]["state"] == "ready")


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("serve {model.x}", "unknown field {model.x}"),
        ("serve {gpus[x]}", "unknown field {gpus[x]}"),
        ("serve {model:>99999999999}", "{model} takes no conversion or format spec"),
        ("serve {model!r}", "{model} takes no conversion or format spec"),
        ("serve {} --port {port}", "a positional field {} is not allowed"),
        ("serve 'unclosed {model}", "No closing quotation"),
    ],
)
def test_one_replicas_bad_template_fails_it_and_the_others_on_the_node_go_on(make_runtime, template, problem):
    """A template the control plane would refuse, in an assignment all the same: that replica fails with
    the words, the other one on the node starts and is checked for health as ever."""
    runtime = make_runtime()
    runtime.sync([assignment(replica_id=1, command=template, gpus=[0]), assignment(replica_id=2, gpus=[1])])
    states = poll_until(runtime, lambda s: s[1]["state"] == "ready")
    assert states[0]["state"] == "failed"
    assert states[0]["message"].startswith(f"command template {template!r}: {problem}")


def test_a_replica_that_cannot_start_for_any_reason_fails_alone(make_runtime, monkeypatch):
    runtime = make_runtime()
    spawn = runtime._spawn

    def spawn_or_break(args, env, workdir, log_path):
        if env["LLMGW_REPLICA_ID"] == "1":
            raise RuntimeError("the spawner broke")
        return spawn(args, env, workdir, log_path)

    monkeypatch.setattr(runtime, "_spawn", spawn_or_break)
    runtime.sync([assignment(replica_id=1, gpus=[0]), assignment(replica_id=2, gpus=[1])])
    states = poll_until(runtime, lambda s: s[1]["state"] == "ready")
    assert states[0]["state"] == "failed"
    assert states[0]["message"] == "cannot start: RuntimeError: the spawner broke"


def test_a_replica_is_ready_when_its_profiles_health_path_answers(make_runtime):
    """The profile's health_path, not the agent's own (/health): the fake server answers 404 on /nope."""
    runtime = make_runtime()
    runtime.sync([{**assignment(replica_id=1, gpus=[0]), "health_path": "/nope"},
                  {**assignment(replica_id=2, gpus=[1]), "health_path": "/env"}])
    states = poll_until(runtime, lambda s: s[1]["state"] == "ready")
    time.sleep(0.3)
    runtime.poll()
    assert runtime.states()[0]["state"] == "starting"
    runtime.sync([{**assignment(replica_id=1, gpus=[0]), "health_path": "/health"}, assignment(replica_id=2, gpus=[1])])
    poll_until(runtime, lambda s: s[0]["state"] == "ready")
    assert states[1]["pid"] == runtime.states()[1]["pid"]  # a changed health path restarts nothing


def test_a_failures_words_are_cut_to_what_a_heartbeat_takes(make_runtime):
    runtime = make_runtime()
    runtime.sync([assignment(command="vllm serve {modle} " + "x" * 1990)])
    [state] = runtime.states()
    assert state["state"] == "failed"
    assert len(state["message"]) == protocol.MAX_MESSAGE_LENGTH
    assert state["message"].endswith("…")


# -- restart policy, with a fake clock and fake processes ------------------------------------


class FakeProcess:
    def __init__(self, pid: int, ignore_sigterm: bool = False) -> None:
        self.pid = pid
        self.code: int | None = None
        self.signals: list[int] = []
        self.ignore_sigterm = ignore_sigterm

    def poll(self) -> int | None:
        return self.code

    def signal(self, signum: int) -> None:
        self.signals.append(signum)
        if self.code is None and not (signum == signal.SIGTERM and self.ignore_sigterm):
            self.code = -signum


class FakeNode:
    """A clock, a spawn that records what it started, and health that is always up."""

    def __init__(self) -> None:
        self.now = 0.0
        self.spawned: list[tuple[list[str], dict[str, str], FakeProcess]] = []

    def spawn(self, args, env, cwd, log_path) -> FakeProcess:
        process = FakeProcess(1000 + len(self.spawned))
        self.spawned.append((args, env, process))
        return process

    def runtime(self, **settings) -> Runtime:
        values = {
            "port_range": (8100, 8199),
            "grace_seconds": 30,
            "restart_backoff_seconds": 1,
            "restart_backoff_max_seconds": 5,
        }
        values.update(settings)
        return Runtime(
            RuntimeSettings(**values),
            clock=lambda: self.now,
            spawn=self.spawn,
            health_check=lambda port, path: True,
            port_free=lambda port: True,
        )


def test_restarts_back_off_doubling_up_to_the_cap():
    node = FakeNode()
    runtime = node.runtime()
    runtime.sync([assignment(command="serve --port {port}")])
    waits = []
    for _ in range(5):
        node.spawned[-1][2].code = 1  # it crashes
        runtime.poll()
        assert runtime.states()[0]["state"] == "failed"
        crashed_at = node.now
        spawned = len(node.spawned)
        while len(node.spawned) == spawned:
            node.now += 0.25
            runtime.poll()
        waits.append(node.now - crashed_at)
    assert waits == [1, 2, 4, 5, 5]
    assert runtime.states()[0]["restarts"] == 5


def test_the_backoff_starts_over_once_a_replica_ran_a_while():
    node = FakeNode()
    runtime = node.runtime()
    runtime.sync([assignment(command="serve --port {port}")])
    for _ in range(3):  # three quick crashes: the next wait would be 8 s, capped at 5
        node.spawned[-1][2].code = 1
        runtime.poll()
        node.now += 5
        runtime.poll()
    node.now += 60  # then it runs for a minute before crashing
    node.spawned[-1][2].code = -9
    runtime.poll()
    assert runtime.states()[0]["message"] == "killed by signal 9 (SIGKILL)"
    node.now += 1
    runtime.poll()
    assert runtime.states()[0]["state"] == "starting"  # restarted after 1 s, not 5
    assert len(node.spawned) == 5


def test_a_changed_command_stops_the_old_process_then_starts_the_new():
    node = FakeNode()
    runtime = node.runtime()
    runtime.sync([assignment(command="serve-a --port {port}")])
    old = node.spawned[0][2]
    old.ignore_sigterm = True
    runtime.sync([assignment(command="serve-b --port {port}")])
    assert old.signals == [signal.SIGTERM]
    assert runtime.states()[0]["state"] == "stopping"

    node.now += 30  # the grace runs out
    runtime.poll()
    assert old.signals[-1] == signal.SIGKILL
    runtime.poll()
    assert [args[0] for args, _, _ in node.spawned] == ["serve-a", "serve-b"]
    runtime.poll()
    assert runtime.states()[0]["state"] == "ready"
    assert runtime.states()[0]["restarts"] == 0


def test_a_malformed_entry_is_skipped_and_the_rest_run(caplog):
    node = FakeNode()
    runtime = node.runtime()
    runtime.sync(
        [{"id": "x", "command": "serve"}, {"model": "m"}, assignment(3, command="serve --port {port}")]
    )
    assert [state["id"] for state in runtime.states()] == [3]
    assert (
        "heartbeat answer: replica id must be an integer, got 'x'; that replica is skipped" in caplog.messages
    )


def test_exit_messages():
    assert exit_message(3) == "exited with status 3"
    assert exit_message(0) == "exited with status 0"
    assert exit_message(-signal.SIGSEGV) == "killed by signal 11 (SIGSEGV)"


def test_children_are_started_in_their_own_process_group(make_runtime):
    runtime = make_runtime()
    runtime.sync([assignment()])
    [state] = runtime.states()
    assert os.getpgid(state["pid"]) == state["pid"]
    assert os.getpgid(state["pid"]) != os.getpgrp()
