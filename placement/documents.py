"""Model documents (``kind: Model``, models.yaml and the API's JSON): parsing and validation, no writes.

A document is checked whole; a refusal (:class:`DocumentError`) names the field, and
:func:`refusal` words it for the interface (file and line for a file, the field alone for JSON).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from agents.node.protocol import (
    CPU_CORES_MAX,
    MAX_GPUS,
    MAX_HEALTH_PATH_LENGTH,
    NODE_MEMORY_GIB_MAX,
    command_problem,
    control_character_problem,
    health_path_problem,
    value_shown,
)
from facility.domains import KEEP_WITHIN_LEVELS
from llmgw.errors import InvalidInput
from llmgw.yamldoc import Document, dotted, load_documents
from placement.selector import SelectorError, parse_selector
from placement.topology import ANY, TOPOLOGY_CHOICES

MODEL_KEYS = ("kind", "name", "replicas", "class", "min_ready", "profile")
# What llmgw may take away on its own (shedding), lowest first: batch before standard; critical never.
CLASS_CHOICES = ("critical", "standard", "batch")
DEFAULT_CLASS = "standard"
PROFILE_KEYS = (
    "gpus",
    "nodes",
    "cpu_cores",
    "memory_gib",
    "power_watts",
    "keep_within",
    "node_selector",
    "topology",
    "command",
    "health_path",
    "min_ready_seconds",
)
# The order the issue names them in; KEEP_WITHIN_LEVELS is the same set.
KEEP_WITHIN_CHOICES = ("rack", "row", "room", "site")
assert set(KEEP_WITHIN_CHOICES) == set(KEEP_WITHIN_LEVELS)
# \Z, not $: `$` also matches before a trailing newline, and "name\n" is not a name.
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?\Z")
MODEL_NAME_MAX_LENGTH = 200

# The bounds of a model document, stated once: the parser below refuses in their words, the API's
# schema (placement.serializers) states them, the README lists them. A per-node figure larger than any
# node can report (agents.node.protocol) could never be placed, so it is refused rather than left pending.
MAX_REPLICAS = 10_000
# Every model's replicas together: each is a row the reconcile keeps and every listing reads, so a file of
# many models cannot make them without end. Twice the largest model; a fleet of 10,000 eight-GPU nodes
# running four- and eight-GPU replicas holds about 11,000.
MAX_REPLICAS_TOTAL = 20_000
# Models, placed or not: every reconcile walks each, so a file of models without replicas cannot make them
# without end either. A catalogue of a few hundred models is large.
MAX_MODELS = 1_000
MAX_GPUS_PER_NODE = MAX_GPUS  # 64
MAX_NODES_PER_REPLICA = 1024
MAX_CPU_CORES = CPU_CORES_MAX  # 16,384
MAX_MEMORY_GIB = NODE_MEMORY_GIB_MAX  # 1,048,576 GiB
MAX_POWER_WATTS = 1_000_000  # a replica's declared draw: a megawatt is a unit error, not a model
MAX_MIN_READY_SECONDS = 86_400
MAX_COMMAND_LENGTH = 2000
MAX_SELECTOR_LENGTH = 2000


class DocumentError(Exception):
    """A refusal found while reading a document: the path of the field and what is wrong with it."""

    def __init__(self, path: tuple[str | int, ...], message: str, *, whole: str | None = None):
        super().__init__(message)
        self.path = path
        self.message = message
        # A message that already names the field its own way (a selector's parse error).
        self.whole = whole


def _count(value: Any, path: tuple[str, ...], *, minimum: int = 0, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DocumentError(path, f"must be a whole number, not {value_shown(value)}")
    if value < minimum:
        if minimum == 0:
            raise DocumentError(path, f"must not be negative (got {value_shown(value)})")
        raise DocumentError(path, f"must be at least {minimum} (got {value_shown(value)})")
    if value > maximum:
        raise DocumentError(path, f"must be at most {maximum:,} (got {value_shown(value)})")
    return value


def _number(value: Any, path: tuple[str, ...], unit: str, *, maximum: float, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DocumentError(path, f"must be a number of {unit}, not {value_shown(value)}")
    # An int is compared as it is: math.isfinite(10**400) raises OverflowError.
    if isinstance(value, float) and not math.isfinite(value):
        raise DocumentError(path, f"must be a finite number of {unit}, not {value_shown(value)}")
    if value < 0:
        raise DocumentError(path, f"must not be negative (got {value_shown(value)})")
    if value > maximum:
        raise DocumentError(path, f"must be at most {maximum:,} {unit} (got {value_shown(value)})")
    return float(value)


def _text(value: Any, path: tuple[str, ...], *, max_length: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DocumentError(path, f"must be text, not {value_shown(value)}")
    if len(value) > max_length:
        raise DocumentError(path, f"at most {max_length:,} characters (got {len(value):,})")
    # NUL, newlines and lone surrogates belong in no command, path or selector (nor in PostgreSQL's text).
    problem = control_character_problem(value)
    if problem:
        raise DocumentError(path, problem)
    return value


def _health_path(value: Any) -> str:
    """The profile's health_path (``/health`` when not given), a URL path as the agent asks it."""
    path = ("profile", "health_path")
    text = _text(value, path, max_length=MAX_HEALTH_PATH_LENGTH) or "/health"
    problem = health_path_problem(text)
    if problem:
        raise DocumentError(path, problem)
    return text


def parse_model_document(data: Any) -> dict[str, Any]:
    """Check one ``kind: Model`` document whole; the values to store, or DocumentError naming the field."""
    if not isinstance(data, Mapping):
        raise DocumentError((), "a model document is a mapping with kind: Model, name, replicas and profile")
    for key in data:
        if key not in MODEL_KEYS:
            raise DocumentError((str(key),), f"unknown key; a Model takes: {', '.join(MODEL_KEYS)}")
    if "kind" not in data:
        raise DocumentError(("kind",), "required; write kind: Model")
    if data["kind"] != "Model":
        raise DocumentError(("kind",), f"unknown kind {value_shown(data['kind'])}; llmgw ctl apply takes kind: Model")
    name = data.get("name")
    if name is None:
        raise DocumentError(("name",), "required")
    if not isinstance(name, str) or not MODEL_NAME_RE.match(name):
        raise DocumentError(
            ("name",),
            f"{value_shown(name)} is not a model name (letters, digits, '.', '_' and '-', at most {MODEL_NAME_MAX_LENGTH})",
        )
    replicas = _count(data.get("replicas", 1), ("replicas",), maximum=MAX_REPLICAS)
    service_class = data.get("class", DEFAULT_CLASS)
    if service_class not in CLASS_CHOICES:
        raise DocumentError(("class",), f"must be one of {', '.join(CLASS_CHOICES)}, not {value_shown(service_class)}")
    # The ready replicas nothing llmgw does on its own (drain, shedding, capping) takes the model below.
    # Defaults to 1, or 0 for a model of no replicas.
    min_ready = _count(data.get("min_ready", min(1, replicas)), ("min_ready",), maximum=MAX_REPLICAS)
    if min_ready > replicas:
        raise DocumentError(("min_ready",), f"must be at most replicas ({replicas}) (got {min_ready})")
    profile = data.get("profile")
    if profile is None:
        raise DocumentError(("profile",), "required: gpus per node at least (gpus: 0 for a CPU-only profile)")
    if not isinstance(profile, Mapping):
        raise DocumentError(("profile",), "must be a mapping")
    for key in profile:
        if key not in PROFILE_KEYS:
            raise DocumentError(("profile", str(key)), f"unknown key; a profile takes: {', '.join(PROFILE_KEYS)}")
    if "gpus" not in profile:
        raise DocumentError(("profile", "gpus"), "required (0 for a CPU-only profile)")
    values: dict[str, Any] = {
        "name": name,
        "replicas": replicas,
        "service_class": service_class,
        "min_ready": min_ready,
        "gpus": _count(profile["gpus"], ("profile", "gpus"), maximum=MAX_GPUS_PER_NODE),
        "nodes": _count(profile.get("nodes", 1), ("profile", "nodes"), minimum=1, maximum=MAX_NODES_PER_REPLICA),
        "cpu_cores": _count(profile.get("cpu_cores", 0), ("profile", "cpu_cores"), maximum=MAX_CPU_CORES),
        "memory_gib": _number(
            profile.get("memory_gib", 0), ("profile", "memory_gib"), "GiB", maximum=MAX_MEMORY_GIB
        ),
        "power_watts": _number(
            profile.get("power_watts"), ("profile", "power_watts"), "W", maximum=MAX_POWER_WATTS, allow_none=True
        ),
        "command": _text(profile.get("command"), ("profile", "command"), max_length=MAX_COMMAND_LENGTH),
        "health_path": _health_path(profile.get("health_path")),
        "min_ready_seconds": _count(
            profile.get("min_ready_seconds", 10), ("profile", "min_ready_seconds"), maximum=MAX_MIN_READY_SECONDS
        ),
    }
    keep_within = profile.get("keep_within")
    if keep_within is not None and keep_within not in KEEP_WITHIN_CHOICES:
        raise DocumentError(
            ("profile", "keep_within"),
            f"must be one of {', '.join(KEEP_WITHIN_CHOICES)}, not {value_shown(keep_within)}",
        )
    values["keep_within"] = keep_within or ""
    selector = _text(profile.get("node_selector"), ("profile", "node_selector"), max_length=MAX_SELECTOR_LENGTH)
    try:
        parse_selector(selector)
    except SelectorError as exc:
        raise DocumentError(("profile", "node_selector"), str(exc), whole=f"profile.{exc}") from exc
    values["node_selector"] = selector
    # How a shard's GPUs must be joined on its node; any (the default) never turns a node down.
    topology = profile.get("topology", ANY)
    if topology not in TOPOLOGY_CHOICES:
        raise DocumentError(
            ("profile", "topology"), f"must be one of {', '.join(TOPOLOGY_CHOICES)}, not {value_shown(topology)}"
        )
    values["topology"] = topology
    problem = command_problem(values["command"])
    if problem is not None:
        # Every node's agent would fail the replica at each start: refused here, with the agent's words.
        raise DocumentError(("profile", "command"), problem)
    return values


def refusal(bad: DocumentError, doc: Document | None) -> InvalidInput:
    """The refusal in the words of the interface: with file and line for a file, the field alone for JSON."""
    field_name = dotted(bad.path)
    if doc is None:
        text = bad.whole or (f"{field_name}: {bad.message}" if field_name else bad.message)
        return InvalidInput(text, field=field_name or "body")  # the body as a whole (null, a list)
    if bad.whole:
        line = doc.line(bad.path)
        where = f"{doc.filename} line {line}: " if line else f"{doc.filename}: "
        return InvalidInput(where + bad.whole, field=field_name)
    return doc.error(bad.path, bad.message)


def models_parse(*, text: str, filename: str = "models.yaml") -> list[dict[str, Any]]:
    """Every ``kind: Model`` document of a multi-document YAML file checked: the values to store, or
    InvalidInput with file and line. A name given twice in one file is refused."""
    docs = load_documents(text, filename)
    if not docs:
        raise InvalidInput(f"{filename}: no documents; write kind: Model documents separated by ---")
    parsed: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, doc in enumerate(docs, start=1):
        try:
            values = parse_model_document(doc.data)
        except DocumentError as bad:
            raise refusal(bad, doc) from None
        if values["name"] in seen:
            raise doc.error(
                ("name",), f"{values['name']!r} is already in document {seen[values['name']]} of this file"
            )
        seen[values["name"]] = number
        parsed.append(values)
    return parsed


def model_parse(*, data: Any) -> dict[str, Any]:
    """One model document given as data (the API's JSON body) checked: the values, or InvalidInput."""
    try:
        return parse_model_document(data)
    except DocumentError as bad:
        raise refusal(bad, None) from None
