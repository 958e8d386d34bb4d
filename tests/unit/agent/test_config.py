"""agent.yaml: a good file loads with its defaults; a bad one is refused naming the field and line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from agents.node.config import AgentConfigError, RuntimeSettings, default_config, load_config, parse_config

GOOD = """\
server: https://llmgw.example.net/
node: gpu01
token: node_abc
interval_seconds: 5
fabric: ib-a
labels:
  llmgw.io/rack: r12-07
  llmgw.io/pdu: r12-07-a,r12-07-b
  gpu.model: H100
runtime:
  port_range: [9100, 9149]
  grace_seconds: 10
  health_path: /v1/health
  restart_backoff_seconds: 2
  restart_backoff_max_seconds: 60
"""

MINIMAL = "server: http://cp:8000\nnode: gpu01\ntoken: t\n"


def test_a_full_file_loads():
    config = parse_config(GOOD)
    assert config.server == "https://llmgw.example.net"  # the trailing slash is dropped
    assert config.heartbeat_url == "https://llmgw.example.net/api/v1/agents/heartbeat"
    assert config.node == "gpu01"
    assert config.token == "node_abc"
    assert config.interval_seconds == 5
    assert config.fabric == "ib-a"
    assert config.labels == {
        "llmgw.io/rack": "r12-07",
        "llmgw.io/pdu": "r12-07-a,r12-07-b",
        "gpu.model": "H100",
    }
    assert config.runtime == RuntimeSettings(
        port_range=(9100, 9149),
        grace_seconds=10,
        health_path="/v1/health",
        restart_backoff_seconds=2,
        restart_backoff_max_seconds=60,
    )
    assert config.sys_root == "/"


def test_defaults():
    config = parse_config(MINIMAL)
    assert config.interval_seconds == 10
    assert config.fabric is None
    assert config.labels == {}
    assert config.runtime == RuntimeSettings(
        port_range=(8100, 8199),
        grace_seconds=30,
        health_path="/health",
        workdir=None,
    )


def test_the_token_is_not_printed_with_the_config():
    assert "node_abc" not in repr(parse_config(GOOD))


def test_token_file_is_read_relative_to_the_config(tmp_path: Path):
    (tmp_path / "token").write_text("node_from_file\n")
    (tmp_path / "agent.yaml").write_text("server: http://cp\nnode: gpu01\ntoken_file: token\n")
    assert load_config(tmp_path / "agent.yaml").token == "node_from_file"


def test_workdir_and_sys_root_must_exist(tmp_path: Path):
    text = f"{MINIMAL}sys_root: {tmp_path}\nruntime:\n  workdir: {tmp_path}\n"
    config = parse_config(text)
    assert config.sys_root == str(tmp_path)
    assert config.runtime.workdir == str(tmp_path)
    with pytest.raises(AgentConfigError) as excinfo:
        parse_config(f"{MINIMAL}sys_root: {tmp_path}/nope\n")
    assert str(excinfo.value) == f"agent.yaml line 4: sys_root: an existing directory, got '{tmp_path}/nope'"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            MINIMAL + "interval_seconds: 30\n",
            "agent.yaml line 4: interval_seconds: at most 10 seconds "
            "(three missed intervals make a node not-ready), got 30",
        ),
        (
            MINIMAL + "interval_seconds: 0\n",
            "agent.yaml line 4: interval_seconds: must be more than 0, got 0",
        ),
        (
            MINIMAL + "interval_seconds: yes\n",
            "agent.yaml line 4: interval_seconds: a number of seconds, got True",
        ),
        (
            MINIMAL + "intervall_seconds: 5\n",
            "agent.yaml line 4: intervall_seconds: unknown key; agent.yaml takes: server, node, token, "
            "token_file, interval_seconds, fabric, labels, runtime, sys_root, bmc",
        ),
        ("node: gpu01\ntoken: t\n", "agent.yaml line 1: server: required"),
        (
            "server: cp:8000\nnode: gpu01\ntoken: t\n",
            "agent.yaml line 1: server: an http:// or https:// URL of the control plane, got 'cp:8000'",
        ),
        (
            "server: http://cp\nnode: gpu 01\ntoken: t\n",
            "agent.yaml line 2: node: 'gpu 01' is not a node name (letters, digits, '.', '_' and '-', "
            "starting and ending with a letter or digit, at most 253)",
        ),
        (
            "server: http://cp\nnode: gpu01\n",
            "agent.yaml line 1: token: required (or token_file); get one with `llmgw ctl node token <node>`",
        ),
        (
            MINIMAL + "token_file: /etc/llmgw/token\n",
            "agent.yaml line 4: token_file: give token or token_file, not both",
        ),
        (MINIMAL + "node: gpu02\n", "agent.yaml line 4: node: given twice"),
        (
            MINIMAL + "labels:\n  llmgw.io/row: 12\n",
            'agent.yaml line 5: labels.llmgw.io/row: a label value is text; write it in quotes: llmgw.io/row: "12"',
        ),
        (
            MINIMAL + "labels:\n  llmgw.io/rak: r12-07\n",
            "agent.yaml line 5: labels.llmgw.io/rak: unknown label key 'llmgw.io/rak': the llmgw.io/ keys are "
            "llmgw.io/site, llmgw.io/room, llmgw.io/row, llmgw.io/rack, llmgw.io/pdu, llmgw.io/leg",
        ),
        (
            MINIMAL + "labels:\n  llmgw.io/rack: r12 07\n",
            "agent.yaml line 5: labels.llmgw.io/rack: llmgw.io/rack='r12 07': a value takes letters, digits, "
            "'.', '_' and '-' only",
        ),
        (MINIMAL + "labels: [a, b]\n", "agent.yaml line 4: labels: a mapping of label keys to values"),
        (
            MINIMAL + "runtime:\n  port_range: [9000, 8000]\n",
            "agent.yaml line 5: runtime.port_range: ports between 1 and 65535 with low <= high, got [9000, 8000]",
        ),
        (
            MINIMAL + "runtime:\n  port_range: 8100\n",
            "agent.yaml line 5: runtime.port_range: two port numbers [low, high], got 8100",
        ),
        (
            MINIMAL + "runtime:\n  grace: 5\n",
            "agent.yaml line 5: runtime.grace: unknown key; runtime takes: port_range, grace_seconds, "
            "health_path, workdir, restart_backoff_seconds, restart_backoff_max_seconds",
        ),
        (
            MINIMAL + "runtime:\n  grace_seconds: -1\n",
            "agent.yaml line 5: runtime.grace_seconds: a number of seconds, 0 or more, got -1",
        ),
        (
            MINIMAL + "runtime:\n  health_path: health\n",
            "agent.yaml line 5: runtime.health_path: a URL path starting with '/', got 'health'",
        ),
        (
            MINIMAL + "runtime:\n  restart_backoff_seconds: 10\n  restart_backoff_max_seconds: 5\n",
            "agent.yaml line 5: runtime.restart_backoff_seconds: the first delay (10 s) is longer than "
            "restart_backoff_max_seconds (5 s)",
        ),
        (
            "server: [http://cp\nnode: gpu01\n",
            "agent.yaml line 2: not valid YAML: expected ',' or ']', but got ':'",
        ),
        ("- server\n", "agent.yaml line 1: the file must be a mapping of keys to values"),
        ("", "agent.yaml line 1: the file is empty; server, node and token are required"),
    ],
)
def test_bad_values_are_refused_naming_field_and_line(text: str, message: str):
    with pytest.raises(AgentConfigError) as excinfo:
        parse_config(text)
    assert str(excinfo.value) == message


def test_the_message_names_the_file(tmp_path: Path):
    path = tmp_path / "agent.yaml"
    path.write_text(
        textwrap.dedent("""\
        server: http://cp
        node: gpu01
        token_file: missing-token
    """)
    )
    with pytest.raises(AgentConfigError) as excinfo:
        load_config(path)
    assert str(excinfo.value) == (
        f"{path} line 3: token_file: cannot read '{tmp_path / 'missing-token'}': No such file or directory"
    )


def test_a_missing_file_is_refused(tmp_path: Path):
    with pytest.raises(AgentConfigError) as excinfo:
        load_config(tmp_path / "nope.yaml")
    assert str(excinfo.value) == f"{tmp_path / 'nope.yaml'}: cannot read: No such file or directory"


def test_default_config_names_the_host(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("socket.gethostname", lambda: "gpu42")
    config = default_config()
    assert config.node == "gpu42"
    assert config.server is None


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe\x00binary", "not UTF-8 text"),
        (b"x" * 10_001, "10,001 bytes; a file llmgw reads is at most 10,000"),
    ],
)
def test_a_token_or_credentials_file_is_read_within_a_bound_as_text(tmp_path: Path, content, reason):
    (tmp_path / "secret").write_bytes(content)
    for text, field, line in [
        ("server: http://cp\nnode: gpu01\ntoken_file: secret\n", "token_file", 3),
        ("server: http://cp\nnode: gpu01\ntoken: t\nbmc:\n  redfish: https://bmc\n  credentials_file: secret\n",
         "bmc.credentials_file", 6),
    ]:
        (tmp_path / "agent.yaml").write_text(text)
        with pytest.raises(AgentConfigError) as excinfo:
            load_config(tmp_path / "agent.yaml")
        assert str(excinfo.value) == (
            f"{tmp_path / 'agent.yaml'} line {line}: {field}: cannot read '{tmp_path / 'secret'}': {reason}"
        )


def test_a_token_file_that_never_ends_is_refused_once_past_the_bound(tmp_path: Path):
    (tmp_path / "agent.yaml").write_text("server: http://cp\nnode: gpu01\ntoken_file: /dev/zero\n")
    with pytest.raises(AgentConfigError) as excinfo:
        load_config(tmp_path / "agent.yaml")
    assert str(excinfo.value) == (
        f"{tmp_path / 'agent.yaml'} line 3: token_file: cannot read '/dev/zero': more than 10,000 characters; "
        "a file llmgw reads is at most 10,000"
    )
