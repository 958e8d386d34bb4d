"""agent.yaml: what one node's agent needs to know, loaded and checked before anything runs.

Pure: no Django. Read with llmgw.yamldoc, the one reader of the files people write; every refusal names
the file, the line and the field, so an operator fixing a node's file at 3 a.m. goes straight to it::

    agent.yaml line 7: interval_seconds: at most 10 seconds (…), got 30

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
    bmc:                                  # the chassis' power from its BMC, through Redfish (optional)
      redfish: https://10.0.0.17          # the BMC's Redfish service (/redfish/v1 may be given or not)
      credentials_file: /etc/llmgw/bmc    # one line: user:password
      verify_tls: true                    # check the BMC's certificate (false: self-signed BMCs)
      ca_file: /etc/llmgw/bmc-ca.pem      # the CA that signed it (optional; default requests' bundle)
      chassis: 1U                         # the chassis' Id or id path (RackMount/Baseboard); optional: the one holding the system
      deadline_seconds: 5                 # all of one read, less than interval_seconds (default half of it, at most 5)
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.node.protocol import is_node_name, node_name_problem
from facility.domains import DomainError, validate_label
from llmgw.errors import InvalidInput
from llmgw.yamldoc import Document, is_number, is_whole_number, load_documents, read_text

# The control plane marks a node not-ready after three missed intervals; a longer interval would
# make a healthy node flap, so the seed caps it.
MAX_INTERVAL_SECONDS = 10.0
DEFAULT_INTERVAL_SECONDS = 10.0


class AgentConfigError(ValueError):
    """agent.yaml refused; the text names the file, the line and the field (`FILE line N: path: …`)."""


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
class BmcSettings:
    """Where the node's BMC answers Redfish and how to talk to it: the chassis' power is read there."""

    redfish: str  # the service's base URL: scheme://host[:port], without /redfish/v1
    username: str
    password: str = field(repr=False)
    verify_tls: bool = True
    ca_file: str | None = None  # the CA bundle its certificate is checked against (None: requests' own)
    chassis: str | None = None
    deadline_seconds: float = 5.0


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
    bmc: BmcSettings | None = None
    path: str | None = None

    @property
    def heartbeat_url(self) -> str:
        """Where heartbeats go."""
        return f"{self.server}/api/v1/agents/heartbeat"


def default_config(*, sys_root: str = "/") -> AgentConfig:
    """What `--dry-run` uses without a file: this host's name, no server, no labels."""
    return AgentConfig(server=None, node=socket.gethostname(), sys_root=sys_root)


TOP_KEYS = (
    "server",
    "node",
    "token",
    "token_file",
    "interval_seconds",
    "fabric",
    "labels",
    "runtime",
    "sys_root",
    "bmc",
)
BMC_KEYS = ("redfish", "credentials_file", "verify_tls", "ca_file", "chassis", "deadline_seconds")
CHASSIS_PATH_PREFIX = "/redfish/v1/Chassis/"
_CHASSIS_ID_SEGMENT = re.compile(r"[A-Za-z0-9._~:@!$&'()*+,;=-]{1,200}")


def is_chassis_id(chassis: object) -> bool:
    """Whether agent.yaml's ``bmc: chassis:`` names a chassis: its Id (``1U``), or its id path where a BMC
    nests them (``RackMount/Baseboard``, or whole: ``/redfish/v1/Chassis/RackMount/Baseboard``); no
    segment may be ``.`` or ``..``."""
    if not isinstance(chassis, str) or len(chassis) > 200:
        return False
    segments = chassis.removeprefix(CHASSIS_PATH_PREFIX).split("/")
    return all(_CHASSIS_ID_SEGMENT.fullmatch(part) and part not in (".", "..") for part in segments)
# A BMC answers in hundreds of milliseconds to seconds; a read that takes longer is a BMC that is down.
MAX_BMC_DEADLINE_SECONDS = 5.0
# token_file and bmc.credentials_file: a token or user:password is a line; a file of more holds neither
# (ctl's --token-file has the same bound).
MAX_SECRET_FILE_CHARS = 10_000
RUNTIME_KEYS = (
    "port_range",
    "grace_seconds",
    "health_path",
    "workdir",
    "restart_backoff_seconds",
    "restart_backoff_max_seconds",
)


def load_config(path: str | os.PathLike[str], *, need_token: bool = True) -> AgentConfig:
    """Read and check agent.yaml; raises AgentConfigError naming the field and line.

    ``need_token`` False (a dry run, which sends nothing): a token or token_file that is missing, unreadable
    or empty leaves the token empty instead of refusing the file."""
    try:
        text = read_text(path)
    except InvalidInput as exc:
        raise AgentConfigError(exc.message) from None
    return parse_config(text, path=str(path), need_token=need_token)


def parse_config(text: str, *, path: str = "agent.yaml", need_token: bool = True) -> AgentConfig:
    """Check agent.yaml's text; `path` is used in messages and to find a relative token_file."""
    try:
        return _parse(text, path, need_token)
    except InvalidInput as exc:
        raise AgentConfigError(exc.message) from None


def _parse(text: str, path: str, need_token: bool = True) -> AgentConfig:
    docs = load_documents(text, path)
    if not docs:
        raise InvalidInput(f"{path} line 1: the file is empty; server, node and token are required")
    doc = docs[0]
    if len(docs) > 1:
        raise docs[1].error((), "agent.yaml is one YAML document; remove the second")
    top = doc.data
    if not isinstance(top, dict):
        raise doc.error((), "the file must be a mapping of keys to values")
    doc.check_keys((), top, TOP_KEYS, "agent.yaml")

    def required(name: str) -> Any:
        if name not in top:
            raise doc.error((name,), "required")
        return top[name]

    server = required("server")
    if not isinstance(server, str) or not re.match(r"https?://[^\s/]+", server):
        raise doc.error(("server",), f"an http:// or https:// URL of the control plane, got {server!r}")
    server = server.rstrip("/")

    name = required("node")
    if not is_node_name(name):
        raise doc.error(("node",), node_name_problem(name))

    try:
        token = _token(doc, top, Path(path).resolve().parent)
    except InvalidInput:
        if need_token:
            raise
        token = ""

    interval = DEFAULT_INTERVAL_SECONDS
    if "interval_seconds" in top:
        interval = top["interval_seconds"]
        if not is_number(interval):
            raise doc.error(("interval_seconds",), f"a number of seconds, got {interval!r}")
        if interval <= 0:
            raise doc.error(("interval_seconds",), f"must be more than 0, got {interval}")
        if interval > MAX_INTERVAL_SECONDS:
            raise doc.error(
                ("interval_seconds",),
                f"at most {MAX_INTERVAL_SECONDS:g} seconds (three missed intervals make a node not-ready), "
                f"got {interval}",
            )
        interval = float(interval)

    fabric = top.get("fabric")
    if fabric is not None and (not isinstance(fabric, str) or not fabric.strip()):
        raise doc.error(("fabric",), f"the name of the node's fabric (text), got {fabric!r}")

    labels = _labels(doc, top.get("labels"))
    runtime = _runtime(doc, top.get("runtime"))

    sys_root = top.get("sys_root", "/")
    if not isinstance(sys_root, str) or not os.path.isdir(sys_root):
        raise doc.error(("sys_root",), f"an existing directory, got {sys_root!r}")

    bmc = _bmc(doc, top.get("bmc"), Path(path).resolve().parent, interval)

    return AgentConfig(
        server=server,
        node=name,
        token=token,
        interval_seconds=interval,
        fabric=fabric,
        labels=labels,
        runtime=runtime,
        sys_root=sys_root,
        bmc=bmc,
        path=path,
    )


def _secret_read(doc: Document, where: tuple[str, ...], path: Path) -> str:
    """A token or credentials file, read within MAX_SECRET_FILE_CHARS (as ctl reads its token file): a
    device or a pipe that never ends (/dev/zero), or a file that is not UTF-8 text, is refused naming the
    field, never read until memory runs out or let through as a traceback."""
    try:
        return read_text(path, max_chars=MAX_SECRET_FILE_CHARS)
    except InvalidInput as exc:
        reason = exc.message.removeprefix(f"{path}: ").removeprefix("cannot read: ")
        raise doc.error(where, f"cannot read {str(path)!r}: {reason}") from None


def _token(doc: Document, top: dict[str, Any], base_dir: Path) -> str:
    if "token" in top and "token_file" in top:
        raise doc.error(("token_file",), "give token or token_file, not both")
    if "token" in top:
        token = top["token"]
        if not isinstance(token, str) or not token.strip():
            raise doc.error(("token",), "the node's token (text) is required")
        return token.strip()
    if "token_file" in top:
        token_path = top["token_file"]
        if not isinstance(token_path, str) or not token_path:
            raise doc.error(("token_file",), f"a file path, got {token_path!r}")
        resolved = base_dir / token_path  # a relative path is taken from the config file's folder
        token = _secret_read(doc, ("token_file",), resolved).strip()
        if not token:
            raise doc.error(("token_file",), f"{str(resolved)!r} is empty")
        return token
    raise doc.error(("token",), "required (or token_file); get one with `llmgw ctl node token <node>`")


def _bmc(doc: Document, given: Any, base_dir: Path, interval: float) -> BmcSettings | None:
    if given is None:
        return None
    if not isinstance(given, dict):
        raise doc.error(
            ("bmc",),
            "a mapping: redfish and credentials_file, and optionally verify_tls, ca_file, chassis, deadline_seconds",
        )
    doc.check_keys(("bmc",), given, BMC_KEYS, "bmc")
    if "redfish" not in given:
        raise doc.error(("bmc", "redfish"), "required: the BMC's Redfish URL, e.g. https://10.0.0.17")
    url = given["redfish"]
    match = re.fullmatch(r"(https?://[^\s/?#]+)(?:/redfish/v1)?/*", url) if isinstance(url, str) else None
    if match is None:
        raise doc.error(
            ("bmc", "redfish"), f"an http:// or https:// URL of the BMC (e.g. https://10.0.0.17), got {url!r}"
        )
    if "credentials_file" not in given:
        raise doc.error(("bmc", "credentials_file"), "required: a file holding the BMC's user:password")
    username, password = _bmc_credentials(doc, given["credentials_file"], base_dir)
    verify = given.get("verify_tls", True)
    if not isinstance(verify, bool):
        raise doc.error(("bmc", "verify_tls"), f"true or false, got {verify!r}")
    ca_file = given.get("ca_file")
    if ca_file is not None:
        if not isinstance(ca_file, str) or not ca_file:
            raise doc.error(("bmc", "ca_file"), f"a file of CA certificates (PEM), got {ca_file!r}")
        ca_file = str(base_dir / ca_file)
        if not os.path.isfile(ca_file):
            raise doc.error(("bmc", "ca_file"), f"{ca_file!r} is not a file")
        if not verify:
            raise doc.error(("bmc", "ca_file"), "a CA file checks the BMC's certificate: remove verify_tls: false")
    chassis = given.get("chassis")
    if chassis is not None and not is_chassis_id(chassis):
        raise doc.error(
            ("bmc", "chassis"),
            f"the chassis' Id as its BMC names it (e.g. 1U), or its path (e.g. {CHASSIS_PATH_PREFIX}RackMount/Baseboard), "
            f"got {chassis!r}",
        )
    deadline = min(MAX_BMC_DEADLINE_SECONDS, interval / 2)
    if "deadline_seconds" in given:
        deadline = given["deadline_seconds"]
        if not is_number(deadline) or deadline <= 0:
            raise doc.error(("bmc", "deadline_seconds"), f"a number of seconds, more than 0, got {deadline!r}")
        if deadline >= interval:
            raise doc.error(
                ("bmc", "deadline_seconds"),
                f"less than interval_seconds ({interval:g} s): a BMC read ends before the next heartbeat, "
                f"got {deadline}",
            )
        deadline = float(deadline)
    return BmcSettings(
        redfish=match.group(1),
        username=username,
        password=password,
        verify_tls=verify,
        ca_file=ca_file,
        chassis=chassis,
        deadline_seconds=deadline,
    )


def _bmc_credentials(doc: Document, given: Any, base_dir: Path) -> tuple[str, str]:
    where = ("bmc", "credentials_file")
    if not isinstance(given, str) or not given:
        raise doc.error(where, f"a file path, got {given!r}")
    resolved = base_dir / given  # a relative path is taken from the config file's folder
    text = _secret_read(doc, where, resolved)
    lines = [line for line in text.splitlines() if line.strip()]
    username, colon, password = (lines[0].strip() if len(lines) == 1 else "").partition(":")
    if not colon or not username or not password:
        raise doc.error(where, f"{str(resolved)!r} must hold one line, user:password")
    return username, password


def _labels(doc: Document, given: Any) -> dict[str, str]:
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise doc.error(("labels",), "a mapping of label keys to values")
    labels: dict[str, str] = {}
    for key, value in given.items():
        path = ("labels", str(key))
        if not isinstance(key, str):
            raise doc.error(path, "a label key is text")
        if not isinstance(value, str):
            raise doc.error(path, f'a label value is text; write it in quotes: {key}: "{value}"')
        try:
            validate_label(key, value)
        except DomainError as exc:
            raise doc.error(path, str(exc)) from None
        labels[key] = value
    return labels


def _runtime(doc: Document, given: Any) -> RuntimeSettings:
    if given is None:
        return RuntimeSettings()
    if not isinstance(given, dict):
        raise doc.error(("runtime",), "a mapping of runtime settings")
    doc.check_keys(("runtime",), given, RUNTIME_KEYS, "runtime")
    values: dict[str, Any] = {}

    if "port_range" in given:
        ports = given["port_range"]
        if not isinstance(ports, list) or len(ports) != 2 or not all(is_whole_number(p) for p in ports):
            raise doc.error(("runtime", "port_range"), f"two port numbers [low, high], got {ports!r}")
        low, high = ports
        if not (1 <= low <= high <= 65535):
            raise doc.error(
                ("runtime", "port_range"), f"ports between 1 and 65535 with low <= high, got {ports!r}"
            )
        values["port_range"] = (low, high)

    for name, allow_zero in (
        ("grace_seconds", True),
        ("restart_backoff_seconds", False),
        ("restart_backoff_max_seconds", False),
    ):
        if name not in given:
            continue
        value = given[name]
        if not is_number(value) or value < 0 or (value == 0 and not allow_zero):
            bound = "0 or more" if allow_zero else "more than 0"
            raise doc.error(("runtime", name), f"a number of seconds, {bound}, got {value!r}")
        values[name] = float(value)

    if "health_path" in given:
        value = given["health_path"]
        if not isinstance(value, str) or not value.startswith("/"):
            raise doc.error(("runtime", "health_path"), f"a URL path starting with '/', got {value!r}")
        values["health_path"] = value

    if "workdir" in given:
        value = given["workdir"]
        if value is not None and (not isinstance(value, str) or not os.path.isdir(value)):
            raise doc.error(("runtime", "workdir"), f"an existing directory, got {value!r}")
        values["workdir"] = value

    settings = RuntimeSettings(**values)
    if settings.restart_backoff_seconds > settings.restart_backoff_max_seconds:
        named = "restart_backoff_seconds" if "restart_backoff_seconds" in given else "restart_backoff_max_seconds"
        raise doc.error(
            ("runtime", named),
            f"the first delay ({settings.restart_backoff_seconds:g} s) is longer than "
            f"restart_backoff_max_seconds ({settings.restart_backoff_max_seconds:g} s)",
        )
    return settings
