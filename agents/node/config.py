"""agent.yaml: what one node's agent needs to know, loaded and checked before anything runs.

Pure: no Django. Every refusal names the field and the line of the file it is on, so an operator
fixing a node's file at 3 a.m. goes straight to it::

    agent.yaml, line 7: interval_seconds: at most 10 seconds, got 30

The file::

    server: https://llmgw.example.net
    node: gpu01
    token_file: /etc/llmgw/token          # or token: <the node's token>
    interval_seconds: 10                  # at most 10
    fabric: ib-a
    labels:
      llmgw.io/rack: r12-07
      llmgw.io/pdu: r12-07-a,r12-07-b
    runtime:
      port_range: [8100, 8199]
      grace_seconds: 30
      health_path: /health
      workdir: /var/lib/llmgw/replicas
      restart_backoff_seconds: 1
      restart_backoff_max_seconds: 300
    sys_root: /
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from facility.domains import DomainError, validate_label

# The control plane marks a node not-ready after three missed intervals; a longer interval would
# make a healthy node flap, so the seed caps it.
MAX_INTERVAL_SECONDS = 10.0
DEFAULT_INTERVAL_SECONDS = 10.0
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class AgentConfigError(ValueError):
    """agent.yaml refused; the text names the file, the line and the field."""


@dataclass(frozen=True)
class RuntimeSettings:
    """How the replica runtime runs model servers on this node."""

    port_range: tuple[int, int] = (8100, 8199)
    grace_seconds: float = 30.0
    health_path: str = "/health"
    workdir: str | None = None
    restart_backoff_seconds: float = 1.0
    restart_backoff_max_seconds: float = 300.0


@dataclass(frozen=True)
class AgentConfig:
    """One node's agent: where the control plane is, who this node is, where it stands."""

    server: str | None
    node: str
    token: str | None = field(default=None, repr=False)
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    fabric: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    sys_root: str = "/"
    path: str | None = None

    @property
    def heartbeat_url(self) -> str:
        """Where heartbeats go."""
        return f"{self.server}/api/v1/agents/heartbeat"


def default_config(*, sys_root: str = "/") -> AgentConfig:
    """What `--dry-run` uses without a file: this host's name, no server, no labels."""
    return AgentConfig(server=None, node=socket.gethostname(), sys_root=sys_root)


_TOP_KEYS = (
    "server",
    "node",
    "token",
    "token_file",
    "interval_seconds",
    "fabric",
    "labels",
    "runtime",
    "sys_root",
)
_RUNTIME_KEYS = (
    "port_range",
    "grace_seconds",
    "health_path",
    "workdir",
    "restart_backoff_seconds",
    "restart_backoff_max_seconds",
)


class _Reader:
    """Walks the composed YAML document, so every value keeps the line it came from."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self._loader = yaml.SafeLoader(text)

    def close(self) -> None:
        self._loader.dispose()

    def error(self, node: yaml.Node | None, field_name: str, problem: str) -> AgentConfigError:
        line = node.start_mark.line + 1 if node is not None else 1
        return AgentConfigError(f"{self.path}, line {line}: {field_name}: {problem}")

    def root(self) -> yaml.MappingNode | None:
        try:
            node = self._loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else 1
            raise AgentConfigError(f"{self.path}, line {line}: not valid YAML: {exc.problem}") from None
        except yaml.YAMLError as exc:
            raise AgentConfigError(f"{self.path}: not valid YAML: {exc}") from None
        if node is None:
            return None
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, "(document)", "the file must be a mapping of keys to values")
        return node

    def pairs(
        self, node: yaml.MappingNode, where: str, allowed: tuple[str, ...] | None
    ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """The mapping's keys, with their key and value nodes; unknown and repeated keys refused."""
        found: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            name = f"{where}.{key}" if where else str(key)
            if not isinstance(key, str):
                raise self.error(key_node, name, "a key must be text")
            if allowed is not None and key not in allowed:
                raise self.error(key_node, name, f"unknown key; known keys are {', '.join(allowed)}")
            if key in found:
                first = found[key][0].start_mark.line + 1
                raise self.error(key_node, name, f"given twice (first on line {first})")
            found[key] = (key_node, value_node)
        return found

    def value(self, node: yaml.Node) -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise self.error(node, "(value)", f"not valid YAML: {exc.problem}") from None


def _is_number(value: Any) -> bool:
    # YAML's `yes` is a bool, and bool is an int in Python: refuse it as a number.
    return isinstance(value, int | float) and not isinstance(value, bool)


def load_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read and check agent.yaml; raises AgentConfigError naming the field and line."""
    path_text = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise AgentConfigError(f"{path_text}: cannot read: {exc.strerror or exc}") from None
    return parse_config(text, path=path_text)


def parse_config(text: str, *, path: str = "agent.yaml") -> AgentConfig:
    """Check agent.yaml's text; `path` is used in messages and to find a relative token_file."""
    reader = _Reader(path, text)
    try:
        return _parse(reader, path)
    finally:
        reader.close()


def _parse(reader: _Reader, path: str) -> AgentConfig:
    root = reader.root()
    if root is None:
        raise AgentConfigError(f"{path}, line 1: the file is empty; server, node and token are required")
    top = reader.pairs(root, "", _TOP_KEYS)
    base_dir = Path(path).resolve().parent

    def required(name: str) -> tuple[yaml.Node, Any]:
        if name not in top:
            raise reader.error(root, name, "required")
        node = top[name][1]
        return node, reader.value(node)

    node, server = required("server")
    if not isinstance(server, str) or not re.match(r"^https?://[^\s/]+", server):
        raise reader.error(node, "server", f"an http:// or https:// URL of the control plane, got {server!r}")
    server = server.rstrip("/")

    node, name = required("node")
    if not isinstance(name, str) or not _NODE_RE.match(name):
        raise reader.error(
            node, "node", f"a node name takes letters, digits, '.', '_' and '-' only, got {name!r}"
        )

    token = _token(reader, root, top, base_dir)

    interval = DEFAULT_INTERVAL_SECONDS
    if "interval_seconds" in top:
        node = top["interval_seconds"][1]
        interval = reader.value(node)
        if not _is_number(interval) or interval != interval:
            raise reader.error(node, "interval_seconds", f"a number of seconds, got {interval!r}")
        if interval <= 0:
            raise reader.error(node, "interval_seconds", f"must be more than 0, got {interval}")
        if interval > MAX_INTERVAL_SECONDS:
            raise reader.error(
                node,
                "interval_seconds",
                f"at most {MAX_INTERVAL_SECONDS:g} seconds (three missed intervals make a node not-ready), "
                f"got {interval}",
            )
        interval = float(interval)

    fabric = None
    if "fabric" in top:
        node = top["fabric"][1]
        fabric = reader.value(node)
        if fabric is not None and (not isinstance(fabric, str) or not fabric.strip()):
            raise reader.error(node, "fabric", f"the name of the node's fabric (text), got {fabric!r}")

    labels = _labels(reader, top["labels"][1]) if "labels" in top else {}
    runtime = _runtime(reader, top["runtime"][1]) if "runtime" in top else RuntimeSettings()

    sys_root = "/"
    if "sys_root" in top:
        node = top["sys_root"][1]
        sys_root = reader.value(node)
        if not isinstance(sys_root, str) or not os.path.isdir(sys_root):
            raise reader.error(node, "sys_root", f"an existing directory, got {sys_root!r}")

    return AgentConfig(
        server=server,
        node=name,
        token=token,
        interval_seconds=interval,
        fabric=fabric,
        labels=labels,
        runtime=runtime,
        sys_root=sys_root,
        path=path,
    )


def _token(
    reader: _Reader, root: yaml.Node, top: dict[str, tuple[yaml.Node, yaml.Node]], base_dir: Path
) -> str:
    if "token" in top and "token_file" in top:
        raise reader.error(top["token_file"][0], "token_file", "give token or token_file, not both")
    if "token" in top:
        node = top["token"][1]
        token = reader.value(node)
        if not isinstance(token, str) or not token.strip():
            raise reader.error(node, "token", "the node's token (text) is required")
        return token.strip()
    if "token_file" in top:
        node = top["token_file"][1]
        token_path = reader.value(node)
        if not isinstance(token_path, str) or not token_path:
            raise reader.error(node, "token_file", f"a file path, got {token_path!r}")
        resolved = base_dir / token_path  # a relative path is taken from the config file's folder
        try:
            token = resolved.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise reader.error(
                node, "token_file", f"cannot read {str(resolved)!r}: {exc.strerror or exc}"
            ) from None
        if not token:
            raise reader.error(node, "token_file", f"{str(resolved)!r} is empty")
        return token
    raise reader.error(root, "token", "required (or token_file); get one with `llmgw ctl node token <node>`")


def _labels(reader: _Reader, node: yaml.Node) -> dict[str, str]:
    if reader.value(node) is None:
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise reader.error(node, "labels", "a mapping of label keys to values")
    labels: dict[str, str] = {}
    for key, (_key_node, value_node) in reader.pairs(node, "labels", None).items():
        value = reader.value(value_node)
        if not isinstance(value, str):
            raise reader.error(
                value_node, f"labels.{key}", f'a label value is text; write it in quotes: {key}: "{value}"'
            )
        try:
            validate_label(key, value)
        except DomainError as exc:
            raise reader.error(value_node, f"labels.{key}", str(exc)) from None
        labels[key] = value
    return labels


def _runtime(reader: _Reader, node: yaml.Node) -> RuntimeSettings:
    if reader.value(node) is None:
        return RuntimeSettings()
    if not isinstance(node, yaml.MappingNode):
        raise reader.error(node, "runtime", "a mapping of runtime settings")
    given = reader.pairs(node, "runtime", _RUNTIME_KEYS)
    values: dict[str, Any] = {}

    if "port_range" in given:
        value_node = given["port_range"][1]
        ports = reader.value(value_node)
        if (
            not isinstance(ports, list)
            or len(ports) != 2
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in ports)
        ):
            raise reader.error(
                value_node, "runtime.port_range", f"two port numbers [low, high], got {ports!r}"
            )
        low, high = ports
        if not (1 <= low <= high <= 65535):
            raise reader.error(
                value_node, "runtime.port_range", f"ports between 1 and 65535 with low <= high, got {ports!r}"
            )
        values["port_range"] = (low, high)

    for name, allow_zero in (
        ("grace_seconds", True),
        ("restart_backoff_seconds", False),
        ("restart_backoff_max_seconds", False),
    ):
        if name not in given:
            continue
        value_node = given[name][1]
        value = reader.value(value_node)
        if not _is_number(value) or value != value or value < 0 or (value == 0 and not allow_zero):
            bound = "0 or more" if allow_zero else "more than 0"
            raise reader.error(value_node, f"runtime.{name}", f"a number of seconds, {bound}, got {value!r}")
        values[name] = float(value)

    if "health_path" in given:
        value_node = given["health_path"][1]
        value = reader.value(value_node)
        if not isinstance(value, str) or not value.startswith("/"):
            raise reader.error(
                value_node, "runtime.health_path", f"a URL path starting with '/', got {value!r}"
            )
        values["health_path"] = value

    if "workdir" in given:
        value_node = given["workdir"][1]
        value = reader.value(value_node)
        if value is not None and (not isinstance(value, str) or not os.path.isdir(value)):
            raise reader.error(value_node, "runtime.workdir", f"an existing directory, got {value!r}")
        values["workdir"] = value

    settings = RuntimeSettings(**values)
    if settings.restart_backoff_seconds > settings.restart_backoff_max_seconds:
        value_node = given.get("restart_backoff_seconds", given.get("restart_backoff_max_seconds"))[1]
        raise reader.error(
            value_node,
            "runtime.restart_backoff_seconds",
            f"the first delay ({settings.restart_backoff_seconds:g} s) is longer than "
            f"restart_backoff_max_seconds ({settings.restart_backoff_max_seconds:g} s)",
        )
    return settings
