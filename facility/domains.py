"""Where a node is: location labels and the domains they put it in.

Pure: no Django. A domain is ``level:name`` (``rack:r12-07``, ``pdu:r12-07-a``); it is derived
from a node's effective labels, never declared. Names are taken as given.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from facility.configuration import ConfigError
from llmgw.errors import InvalidInput, value_shown

# A leg is one phase of a three-phase PDU's feed (``leg:<pdu>.A``): it trips alone, so it is budgeted alone.
LEVELS: tuple[str, ...] = ("site", "room", "row", "rack", "pdu", "leg")
# keep_within may name any level that contains whole nodes (a PDU is a power tree, not a place).
KEEP_WITHIN_LEVELS: tuple[str, ...] = ("site", "room", "row", "rack")
LABEL_PREFIX = "llmgw.io/"
LOCATION_KEYS: tuple[str, ...] = tuple(LABEL_PREFIX + level for level in LEVELS)
PDU_KEY = LABEL_PREFIX + "pdu"
LEG_KEY = LABEL_PREFIX + "leg"
# Keys whose value lists several domains, comma-separated: a node draws from two PDUs, and legs.
MULTI_KEYS = frozenset({PDU_KEY, LEG_KEY})

# Matched with fullmatch: `$` would also match before a trailing newline ("r1-01\n").
_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_FREE_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9._/-]{0,252}")
MAX_VALUE_LENGTH = 253
# A free label's value is any text but control characters and lone surrogates (a NUL cannot be stored,
# a newline breaks every table that shows it).
_CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # C0, DEL, C1


class DomainError(ValueError):
    """A domain or location label that does not parse; the text says which and why."""


@dataclass(frozen=True, order=True, slots=True)
class Domain:
    """A place or power tree branch a node belongs to: ``rack:r12-07``."""

    level: str
    name: str
    # Domains key most of placement's maps: the hash is worked out once, not at every lookup.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.level, self.name)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # Made anew on unpickling (a string's hash differs from one process to another), as the one
        # object of its place there.
        return (_domain, (self.level, self.name))

    def __str__(self) -> str:
        return f"{self.level}:{self.name}"

    @property
    def label(self) -> str:
        """How a person reads it in a sentence: ``rack r12-07``."""
        return f"{self.level} {self.name}"


def parse_domain(text: str) -> Domain:
    """``"rack:r12-07"`` → ``Domain("rack", "r12-07")``; anything else raises DomainError."""
    if not isinstance(text, str) or ":" not in text:
        raise DomainError(
            f"{value_shown(text)} is not a domain: write level:name, with level one of {', '.join(LEVELS)}"
        )
    level, _, name = text.partition(":")
    if level not in LEVELS:
        raise DomainError(f"{value_shown(text)}: unknown level {value_shown(level)}; levels are {', '.join(LEVELS)}")
    if not _NAME_RE.fullmatch(name) or len(name) > MAX_VALUE_LENGTH:
        raise DomainError(f"{value_shown(text)}: a domain name takes letters, digits, '.', '_' and '-' only")
    return _domain(level, name)


def clean_domain(text: object, *, field: str = "domain") -> str:
    """The canonical text of a domain, or InvalidInput naming the field."""
    try:
        return str(parse_domain(text))  # type: ignore[arg-type]
    except DomainError as exc:
        raise InvalidInput(f"{field}: {exc}", field=field) from exc


def validate_label(key: str, value: str) -> None:
    """Refuse a misspelt ``llmgw.io/`` key or a location value outside ``[A-Za-z0-9._-]``.

    Other keys are free-form (node selectors use them) but must look like a key.
    """
    if key.lower().startswith(LABEL_PREFIX) or key.lower().startswith(LABEL_PREFIX.rstrip("/") + "."):
        if key not in LOCATION_KEYS:
            raise DomainError(
                f"unknown label key {value_shown(key)}: the llmgw.io/ keys are {', '.join(LOCATION_KEYS)}"
            )
        if not isinstance(value, str) or value == "":
            raise DomainError(f"{key}: a value is required (use {key}- to remove it)")
        parts = value.split(",") if key in MULTI_KEYS else [value]
        for part in parts:
            if not _NAME_RE.fullmatch(part) or len(part) > MAX_VALUE_LENGTH:
                allowed = "letters, digits, '.', '_' and '-'"
                if key in MULTI_KEYS:
                    allowed += " (and ',' between PDUs)" if key == PDU_KEY else " (and ',' between legs)"
                raise DomainError(f"{key}={value_shown(value)}: a value takes {allowed} only")
        repeated = sorted({part for part in parts if parts.count(part) > 1})
        if repeated:  # a node on one PDU listed twice would count its draw twice against it
            raise DomainError(f"{key}={value_shown(value)}: {value_shown(repeated[0])} is given twice")
        return
    if not _FREE_KEY_RE.fullmatch(key):
        raise DomainError(
            f"label key {value_shown(key)} must start with a letter and hold only letters, digits, '.', '_', '/' and '-'"
        )
    if not isinstance(value, str) or len(value) > MAX_VALUE_LENGTH:
        raise DomainError(f"{key}: a label value is text of at most {MAX_VALUE_LENGTH} characters")
    if _CONTROL_OR_SURROGATE.search(value):
        raise DomainError(f"{key}: a label value must not hold a control character or a lone surrogate")


def domains_of(labels: Mapping[str, str]) -> tuple[Domain, ...]:
    """The domains effective labels put a node in, in level order (pdus sorted by name)."""
    found: list[Domain] = []
    for level, key in zip(LEVELS, LOCATION_KEYS, strict=True):
        value = labels.get(key)
        if not value:
            continue
        names = value.split(",") if key in MULTI_KEYS else [value]
        for name in sorted({n.strip() for n in names if n.strip()}):
            found.append(_domain(level, name))
    return tuple(found)


# Far more places than a site has (10,000 nodes are in about 1,500), and a bound on what names read from
# requests can hold.
@functools.lru_cache(maxsize=16384)
def _domain(level: str, name: str) -> Domain:
    """The one Domain of a place, shared by every node there and every budget of it: the maps keyed by
    domains (spread counts, budgets, the index's groups) find it by identity, not by comparing it field by
    field in Python."""
    return Domain(level, name)


def effective_labels(
    agent: Mapping[str, str], store: Mapping[str, str], trusted: Collection[str] = LOCATION_KEYS
) -> dict[str, str]:
    """The store's labels win over the agent's; an agent's location label whose key is not in ``trusted``
    (facility.location_from takes that level from the store) is not taken at all."""
    merged = {key: value for key, value in agent.items() if key in trusted or key not in _LOCATION_KEY_SET}
    merged.update(store)
    return merged


# -- facility.location_from: whose word a node's location is, level by level --------------------------------

LOCATION_SOURCES: tuple[str, ...] = ("agents", "store")
_LOCATION_KEY_SET = frozenset(LOCATION_KEYS)


def parse_location_from(raw: Any) -> dict[str, str]:
    """server.yaml's facility.location_from as ``{level: "agents" | "store"}`` over every level.

    ``agents`` (the default; null too) takes each node's location from its agent unless the store has a
    value; ``store`` takes it from the store alone, whatever the agent says (a node's token can then not
    move its node into another rack); a mapping says it per level (``{rack: store, pdu: store}``), the
    levels it does not name from the agents. A wrong value raises ConfigError with its path.
    """
    if raw is None or raw in LOCATION_SOURCES:
        return dict.fromkeys(LEVELS, raw or "agents")
    if not isinstance(raw, Mapping):
        raise ConfigError((), f"agents, store, or a mapping of level to agents or store; not {value_shown(raw)}")
    levels = dict.fromkeys(LEVELS, "agents")
    for level, source in raw.items():
        if level not in LEVELS:
            raise ConfigError((str(level),), f"unknown level; levels are {', '.join(LEVELS)}")
        if source not in LOCATION_SOURCES:
            raise ConfigError((level,), f"agents or store, not {value_shown(source)}")
        levels[level] = source
    return levels


def agent_location_keys(location_from: Mapping[str, str]) -> frozenset[str]:
    """The location keys whose agent's value is taken (``location_from`` as parse_location_from gives it;
    a level it does not name comes from the agents)."""
    return frozenset(LABEL_PREFIX + level for level in LEVELS if location_from.get(level, "agents") == "agents")


def location_conflicts(
    agent: Mapping[str, str], store: Mapping[str, str], trusted: Collection[str] = LOCATION_KEYS
) -> list[str]:
    """What a node's agent says of its location that is not taken because the level comes from the store
    (a key not in ``trusted``) and the store says otherwise, or nothing: one sentence per key."""
    conflicts = []
    for key in LOCATION_KEYS:
        said = agent.get(key)
        if key in trusted or said is None or said == store.get(key):
            continue
        level = key.removeprefix(LABEL_PREFIX)
        has = f"the store says {store[key]}" if key in store else f"the store has no {level}"
        conflicts.append(
            f"{key}: the agent says {said}, {has}; the agent's value is ignored (location_from: {level}: store)"
        )
    return conflicts


def nearest_names(name: str, known: Iterable[str], *, count: int) -> list[str]:
    """The known names nearest ``name``, at most ``count``, closest first: the same characters in
    another order (``r1-10`` for ``r1-01``: a swap is the likeliest slip) before any other, then by
    difflib's ratio (0.6 and over, as ``get_close_matches``), ties by name. The one rule for every "did
    you mean": a hold's or budget's warning, a node filter's suggestions of places and of labels."""
    letters = sorted(name)
    scored = []
    for known_name in set(known):
        matcher = difflib.SequenceMatcher(None, name, known_name)
        if matcher.real_quick_ratio() >= 0.6 and matcher.quick_ratio() >= 0.6:
            ratio = matcher.ratio()
            if ratio >= 0.6:
                scored.append((sorted(known_name) != letters, -ratio, known_name))
    return [known_name for *_, known_name in sorted(scored)[:count]]


def natural_key(text: str) -> tuple:
    """``r2`` before ``r10``: digits compared as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


# A row's, room's and site's condition rolls up its racks': the worst of its own and theirs.
ROLLED_LEVELS = ("row", "room", "site")


def location_text(labels: Mapping[str, str], levels: Iterable[str] = LEVELS) -> str:
    """``site=sto1 room=hall-b rack=r12-07 pdu=r12-07-a,r12-07-b``, or ``-`` when nowhere."""
    parts = [
        f"{level}={labels[LABEL_PREFIX + level]}"
        for level in levels
        if labels.get(LABEL_PREFIX + level)
    ]
    return " ".join(parts) or "-"


def parse_label_args(args: list[str]) -> dict[str, str | None]:
    """`key=value` sets, `key-` removes (back to the agent's value): the ctl label syntax."""
    changes: dict[str, str | None] = {}
    for arg in args:
        if "=" in arg:
            key, _, value = arg.partition("=")
            changes[key] = value
        elif arg.endswith("-") and len(arg) > 1:
            changes[arg[:-1]] = None
        else:
            raise InvalidInput(f"{value_shown(arg)}: write key=value to set a label or key- to remove it", field="labels")
    return changes
