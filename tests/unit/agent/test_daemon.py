"""`llmgw agent`: the heartbeat it builds, --once --dry-run, and the loop against a local HTTP server."""

from __future__ import annotations

import json
import logging
import socket
import threading

import pytest

from agents.node.config import parse_config
from agents.node.daemon import Agent, build_heartbeat, main
from tests.fakes.control_plane import DEADLINE_SECONDS, REPLICA, ControlPlane, agent_yaml, wait_until

INVENTORY = {
    "gpus": [
        {
            "index": 0,
            "uuid": "GPU-1",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_gib": 79.6,
            "power_limit_watts": 700.0,
        }
    ],
    "cpu_cores": 96,
    "memory_gib": 2015.6,
    "hostname": "gpu01",
}
SENSORS = {
    "gpus": [{"uuid": "GPU-1", "temperature_celsius": 41.0, "power_watts": 72.5, "throttle_reasons": []}],
    "cpu_temperature_celsius": 61.0,
}


class StubReader:
    def __init__(self, fail: bool = False) -> None:
        self.reads = 0
        self.closed = False
        self.fail = fail

    def inventory(self) -> dict:
        if self.fail:
            raise RuntimeError("NVML went away")
        return dict(INVENTORY)

    def read(self) -> dict:
        self.reads += 1
        if self.fail:
            raise RuntimeError("hwmon went away")
        return dict(SENSORS)

    def close(self) -> None:
        self.closed = True


class StubRuntime:
    def __init__(self) -> None:
        self.synced: list[list[dict]] = []
        self.polls = 0
        self.shut_down = False

    def sync(self, assigned: list[dict]) -> None:
        self.synced.append(assigned)

    def poll(self) -> None:
        self.polls += 1

    def states(self) -> list[dict]:
        return [{"id": 17, "state": "ready", "port": 8101, "pid": 4242, "restarts": 0, "message": ""}]

    def throughput(self) -> list[dict]:
        return []

    def shutdown(self) -> None:
        self.shut_down = True


class FixedJitter:
    """Takes the top of the jitter range, so the backoff's own figures show."""

    def uniform(self, low: float, high: float) -> float:
        return high


@pytest.fixture
def plane():
    control_plane = ControlPlane()
    yield control_plane
    control_plane.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the heartbeat ---------------------------------------------------------------------------


def test_build_heartbeat_shape():
    config = parse_config(agent_yaml("http://cp"))
    assert build_heartbeat(config, StubReader(), StubRuntime()) == {
        "node": "gpu01",
        "agent_version": "0.1.0",
        "interval_seconds": 10,
        "inventory": {**INVENTORY, "fabric": "ib-a"},
        "labels": {"llmgw.io/rack": "r12-07"},
        "sensors": SENSORS,
        "replicas": [{"id": 17, "state": "ready", "port": 8101, "restarts": 0, "message": ""}],
    }


def test_a_failing_reader_still_gives_a_heartbeat():
    config = parse_config(agent_yaml("http://cp"))
    heartbeat = build_heartbeat(config, StubReader(fail=True), None)
    assert heartbeat["inventory"] == {"fabric": "ib-a"}
    assert heartbeat["sensors"] == {}
    assert heartbeat["replicas"] == []


# -- --once ------------------------------------------------------------------------------------


def test_dry_run_prints_the_heartbeat_and_sends_nothing(plane, tmp_path, capsys):
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(agent_yaml(plane.url))
    reader = StubReader()
    status = main(
        ["--once", "--dry-run", "--config", str(config_path), "--sample-seconds", "0.01"],
        reader_factory=lambda sys_root: reader,
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == build_heartbeat(parse_config(agent_yaml(plane.url)), StubReader(), None)
    assert printed.startswith('{\n  "node": "gpu01",')  # indent 2
    assert plane.requests == []
    assert reader.reads == 2  # RAPL needs two reads for CPU power
    assert reader.closed


def test_dry_run_without_a_config_names_the_node_after_the_host_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "gpu42")
    roots = []
    status = main(
        ["--once", "--dry-run", "--sys-root", str(tmp_path), "--sample-seconds", "0"],
        reader_factory=lambda sys_root: roots.append(sys_root) or StubReader(),
    )
    assert status == 0
    heartbeat = json.loads(capsys.readouterr().out)
    assert heartbeat["node"] == "gpu01"  # the host of the tree read, not the one running the agent
    assert heartbeat["labels"] == {}
    assert roots == [str(tmp_path)]


def test_dry_run_without_a_config_or_a_hostname_names_this_host(capsys, monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "gpu42")
    assert (
        main(
            ["--once", "--dry-run", "--sample-seconds", "0"],
            reader_factory=lambda root: StubReader(fail=True),
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["node"] == "gpu42"


def test_dry_run_needs_no_token_and_says_what_a_real_run_would_miss(plane, tmp_path, capsys):
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(agent_yaml(plane.url).replace("token: node_secret", "token_file: token"))
    status = main(["--once", "--dry-run", "--config", str(config_path), "--sample-seconds", "0"],
                  reader_factory=lambda sys_root: StubReader())
    out, err = capsys.readouterr()
    assert status == 0 and plane.requests == []
    assert json.loads(out)["node"] == "gpu01"
    assert err == (f"llmgw agent: {config_path} line 3: token_file: cannot read '{tmp_path / 'token'}': "
                   "No such file or directory (a dry run sends nothing and needs no token)\n")

    config_path.write_text(agent_yaml(plane.url).replace("token: node_secret\n", ""))
    assert main(["--once", "--dry-run", "--config", str(config_path), "--sample-seconds", "0"],
                reader_factory=lambda sys_root: StubReader()) == 0
    assert capsys.readouterr().err == (
        f"llmgw agent: {config_path} line 1: token: required (or token_file); get one with "
        "`llmgw ctl node token <node>` (a dry run sends nothing and needs no token)\n")
    # A real run still refuses it, and a dry run anything else wrong.
    assert main(["--once", "--config", str(config_path)], reader_factory=lambda sys_root: StubReader()) == 2
    config_path.write_text(agent_yaml("llmgw.example.net").replace("token: node_secret\n", ""))
    assert main(["--once", "--dry-run", "--config", str(config_path)], reader_factory=lambda sys_root: StubReader()) == 2
    assert capsys.readouterr().err.endswith("server: an http:// or https:// URL of the control plane, "
                                            "got 'llmgw.example.net'\n")


def test_once_sends_one_heartbeat_and_prints_the_answer(plane, tmp_path, capsys):
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(agent_yaml(plane.url))
    status = main(
        ["--once", "--config", str(config_path), "--sample-seconds", "0"],
        reader_factory=lambda sys_root: StubReader(),
    )
    assert status == 0
    assert json.loads(capsys.readouterr().out) == plane.answer
    assert len(plane.requests) == 1
    assert plane.requests[0]["body"]["replicas"] == []


def test_without_config_the_daemon_refuses(capsys):
    assert main([], reader_factory=lambda sys_root: StubReader()) == 2
    assert capsys.readouterr().err == (
        "llmgw agent: --config FILE is required (only --once --dry-run runs without one)\n"
    )


def test_a_bad_config_is_refused_with_its_line(tmp_path, capsys):
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(agent_yaml("http://cp", interval_seconds=60))
    assert main(["--config", str(config_path)], reader_factory=lambda sys_root: StubReader()) == 2
    assert capsys.readouterr().err == (
        f"llmgw agent: {config_path} line 7: interval_seconds: at most 10 seconds "
        "(three missed intervals make a node not-ready), got 60\n"
    )


def test_help_teaches(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "llmgw agent --once --dry-run" in text
    assert "--sample-seconds" in text


# -- the loop ----------------------------------------------------------------------------------


def make_agent(url: str, runtime=None, interval: float = 1) -> Agent:
    config = parse_config(agent_yaml(url, interval_seconds=interval))
    return Agent(config, StubReader(), runtime or StubRuntime(), rng=FixedJitter())


def test_a_beat_posts_with_the_token_and_applies_the_answer(plane):
    runtime = StubRuntime()
    plane.answer = {"node": "gpu01", "interval_seconds": 5, "replicas": [REPLICA]}
    agent = make_agent(plane.url, runtime)
    assert agent.beat() == 5  # the control plane set the interval
    [request] = plane.requests
    assert request["path"] == "/api/v1/agents/heartbeat"
    assert request["authorization"] == "Token node_secret"
    assert request["body"] == build_heartbeat(agent.config, StubReader(), runtime)
    assert runtime.synced == [[REPLICA]]


def agent_records(caplog) -> list[logging.LogRecord]:
    """The agent's own log records (a client library's request lines are not what these tests check)."""
    return [r for r in caplog.records if r.name.startswith("llmgw.agent")]


def agent_messages(caplog) -> list[str]:
    return [r.getMessage() for r in agent_records(caplog)]


def test_a_server_answering_503_is_retried_with_backoff_and_logged_once(plane, caplog):
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    plane.script = [(503, {"detail": "overloaded"})] * 5
    plane.answer = {"node": "gpu01", "interval_seconds": 1, "replicas": [REPLICA]}
    runtime = StubRuntime()
    agent = make_agent(plane.url, runtime, interval=1)
    waits = [agent.beat() for _ in range(6)]
    assert waits == [1, 2, 4, 6, 6, 1]  # doubling up to six intervals, then back to the interval
    assert len(plane.requests) == 6
    assert runtime.synced == [[REPLICA]]
    assert agent_messages(caplog) == [
        f"heartbeat: {plane.url}/api/v1/agents/heartbeat answered 503 Service Unavailable; "
        "retrying with backoff (up to 6 s)",
        f"heartbeat: {plane.url} answered again after 5 failed tries",
    ]


def test_an_unreachable_server_is_retried_with_backoff_and_logged_once(caplog):
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    agent = make_agent(f"http://127.0.0.1:{closed_port()}", interval=2)
    assert [agent.beat() for _ in range(4)] == [2, 4, 8, 12]
    [message] = agent_messages(caplog)
    assert message.startswith(f"heartbeat: cannot reach {agent.config.heartbeat_url} (ConnectError:")
    assert message.endswith("; retrying with backoff (up to 12 s)")


def test_jitter_stays_under_the_cap(plane):
    plane.script = [(502, "bad gateway")] * 20
    config = parse_config(agent_yaml(plane.url, interval_seconds=1))
    agent = Agent(config, StubReader(), StubRuntime())
    waits = [agent.beat() for _ in range(20)]
    assert all(0 < wait <= 6 for wait in waits)
    assert len(set(waits)) > 1  # spread out, not in step with every other node


def test_a_refused_heartbeat_is_logged_with_the_servers_message(plane, caplog):
    errors = {"sensors.gpus[0].power_watts": ["must be 0 or more, got -5"]}
    plane.script = [(400, errors), (400, errors)]
    runtime = StubRuntime()
    agent = make_agent(plane.url, runtime, interval=1)
    assert [agent.beat(), agent.beat()] == [1, 1]  # no backoff: the server is there
    assert runtime.synced == []
    assert agent_messages(caplog) == [  # once, not on every beat
        f"heartbeat refused by {agent.config.heartbeat_url} (400): "
        '{"sensors.gpus[0].power_watts": ["must be 0 or more, got -5"]}',
    ]
    assert agent_records(caplog)[0].levelno == logging.ERROR


def test_a_detail_message_is_shown_as_text(plane, caplog):
    plane.script = [(403, {"detail": "this token writes node gpu02 only"})]
    make_agent(plane.url).beat()
    assert agent_messages(caplog)[-1].endswith("(403): this token writes node gpu02 only")


def test_the_loop_beats_polls_and_stops(plane):
    runtime = StubRuntime()
    plane.answer = {"node": "gpu01", "interval_seconds": 0.05, "replicas": [REPLICA]}
    agent = make_agent(plane.url, runtime, interval=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), kwargs={"poll_seconds": 0.01})
    thread.start()
    try:
        wait_until(lambda: len(plane.requests) >= 3)
    finally:
        stop.set()
        thread.join(DEADLINE_SECONDS)
    assert not thread.is_alive()
    assert runtime.polls >= 3
    assert runtime.synced[:3] == [[REPLICA]] * 3


def test_the_heartbeat_reports_the_interval_the_control_plane_set(plane):
    plane.answer = {"node": "gpu01", "interval_seconds": 5, "replicas": []}
    agent = make_agent(plane.url, interval=10)
    agent.beat()
    agent.beat()
    assert [r["body"]["interval_seconds"] for r in plane.requests] == [10, 5]


def test_a_week_long_outage_still_waits_six_intervals():
    agent = make_agent("http://127.0.0.1:1", interval=10)
    agent.failures = 10_000
    assert agent.backoff_seconds() == 60
