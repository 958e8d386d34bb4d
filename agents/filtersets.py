"""Filters of the nodes list: one FilterSet for the console's Nodes page and the API's ``GET /api/v1/nodes``.

``domain`` takes what a facility engineer types: a domain (``rack:r12-07``, ``pdu:r12-07-a``), a bare name
(``r12-07``: the rack, or the one domain of another level so named), a label (``gpu.model=H200``), or
several of them separated by spaces: those of one level or label key are any of them, different ones all
hold (``r12-07 r12-08 gpu.model=H200``: the H200 nodes of either rack). A name or label value no node has
gets suggestions (:meth:`NodeFilterSet.suggestions`, facility.domains.nearest_names), which the console shows.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from agents.models import Node, NodeDomain
from agents.selectors import node_queryset
from facility.domains import LEVELS, MAX_VALUE_LENGTH, DomainError, nearest_names, parse_domain
from facility.nodes import held_domains, node_state
from llmgw.errors import InvalidInput

STATES = ("ready", "not-ready", "cordoned", "held")

# What one filter text may hold: more is not a person typing.
MAX_TERMS = 8
LABEL_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9._/-]{0,252}")
# Terms are separated by spaces or tabs; `gpu.model = H200` (the node_selector's spacing) is one term.
_BLANKS = re.compile(r"[ \t]+")
SUGGESTIONS = 3
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\ud800-\udfff]")


def filter_pattern() -> str:
    """The text `domain` takes, as a regular expression (the API's schema states it, so a client can
    check a filter before sending it): what :func:`parse_terms` accepts, no more and no less."""
    levels = "|".join(LEVELS)
    name = rf"[A-Za-z0-9._-]{{1,{MAX_VALUE_LENGTH}}}"
    # A key that is a level (`rack=r1-01`) is that domain: its value a domain's name.
    label = (
        rf"(?!(?:{levels})[ \t]*=)[A-Za-z][A-Za-z0-9._/-]{{0,252}}[ \t]*=[ \t]*[^\x00-\x20\x7f]{{1,{MAX_VALUE_LENGTH}}}"
        rf"|(?:{levels})[ \t]*=[ \t]*{name}"
    )
    # A level alone (`rack`) is a domain half written, not a name.
    bare = rf"(?!(?:{levels})(?![A-Za-z0-9._-])){name}"
    term = rf"(?:{label}|(?:{levels}):{name}|{bare})"
    return rf"^[ \t]*(?:{term}(?:[ \t]+{term}){{0,{MAX_TERMS - 1}}})?[ \t]*$"


@dataclass(frozen=True, slots=True)
class Term:
    """One term of a `domain` filter: a domain (``rack:r12-07``), a bare name (``r12-07``) or a label
    (``gpu.model`` = ``H200``). ``text`` is how it was written (normalised), to swap a suggestion in."""

    kind: str  # "domain", "name" or "label"
    text: str
    key: str = ""
    value: str = ""


def _joined_labels(words: list[str]) -> list[str]:
    """`gpu.model = H200`, `gpu.model= H200`, `gpu.model =H200` → `gpu.model=H200`: a key (a word without
    `=`) and its value written apart, the node_selector's way."""
    out: list[str] = []
    for word in words:
        if out and "=" not in out[-1] and word.startswith("="):
            out[-1] += word  # `key` then `=value` or `=` (its value comes next)
        elif out and out[-1].endswith("=") and out[-1].count("=") == 1 and not out[-1].startswith("="):
            out[-1] += word  # `key=` then the value
        else:
            out.append(word)
    return out


def parse_terms(text: str) -> list[Term]:
    """The terms of a `domain` filter; a bad one raises DomainError with the parser's words."""
    if _CONTROL.search(text):
        raise DomainError("a filter must not hold a control character")
    text = text.strip(" \t")
    words = _joined_labels(_BLANKS.split(text) if text else [])
    if len(words) > MAX_TERMS:
        raise DomainError(f"at most {MAX_TERMS} terms (a rack, a domain or a key=value label each)")
    terms = []
    for word in words:
        if "=" in word:
            key, _, value = word.partition("=")
            if not LABEL_KEY_RE.fullmatch(key):
                raise DomainError(
                    f"{word!r}: a label is key=value, the key a letter then letters, digits, '.', '_', '/' or '-'"
                )
            if not value:
                raise DomainError(f"{word!r}: a label is key=value, with a value")
            if len(value) > MAX_VALUE_LENGTH:
                raise DomainError(f"{word!r}: a label's value is at most {MAX_VALUE_LENGTH} characters")
            if key in LEVELS:
                # `rack=r1-01` is how a person writes the rack r1-01 (no label is keyed by a bare level:
                # the location labels are llmgw.io/rack and its kin), the same as `rack:r1-01`.
                terms.append(Term("domain", str(parse_domain(f"{key}:{value}"))))
                continue
            terms.append(Term("label", word, key, value))
        elif ":" in word or word in LEVELS:
            # A level alone (`rack`) is a domain half written: the parser says how to write it.
            terms.append(Term("domain", str(parse_domain(word))))
        else:
            parse_domain(f"rack:{word}")  # the same rule for a name as for a domain's
            terms.append(Term("name", word))
    return terms


class DomainField(forms.CharField):
    """Domains, bare names and labels (:func:`parse_terms`); a bad one is refused with the parser's words."""

    def clean(self, value):
        value = super().clean(value)
        if not value:
            return []
        try:
            return parse_terms(value)
        except DomainError as exc:
            raise forms.ValidationError(str(exc)) from exc


def name_domains(name: str) -> list[str]:
    """The domains a bare name stands for: its rack if there is one, else every domain of that name."""
    found = sorted(
        NodeDomain.objects.filter(domain__in=[f"{level}:{name}" for level in LEVELS])
        .values_list("domain", flat=True)
        .distinct()
    )
    rack = f"rack:{name}"
    return [rack] if rack in found or not found else found


def label_value(queryset: QuerySet[Node], key: str) -> QuerySet[Node]:
    """The queryset with the text of label ``key`` as ``label_value`` (None where the node has none).

    Cast to text: compared as a JSON key's value, SQLite reads each value given as a JSON document
    (``r1-01`` is malformed JSON there, ``"r1-01"`` would match), where PostgreSQL compares the text.
    """
    return queryset.annotate(label_value=Cast(KeyTextTransform(key, "labels"), output_field=TextField()))


class DomainFilter(django_filters.CharFilter):
    field_class = DomainField

    def filter(self, qs, value):
        # Terms of one level (two racks) or one label key are any of them; different ones all hold:
        # `r12-07 r12-08 gpu.model=H200` is the H200 nodes of either rack.
        domains: dict[str, set[str]] = defaultdict(set)
        labels: dict[str, set[str]] = defaultdict(set)
        for term in value or ():
            if term.kind == "label":
                labels[term.key].add(term.value)
                continue
            found = [term.text] if term.kind == "domain" else name_domains(term.text)
            levels = {d.split(":", 1)[0] for d in found}
            domains[levels.pop() if len(levels) == 1 else f"name:{term.text}"].update(found)
        for group in domains.values():
            qs = qs.filter(pk__in=NodeDomain.objects.filter(domain__in=group).values("node_id"))
        for key, values in labels.items():
            qs = qs.filter(pk__in=label_value(Node.objects.all(), key).filter(label_value__in=values).values("pk"))
        return qs


@dataclass(frozen=True, slots=True)
class NodeStateLine:
    """What the list needs to count, filter and sort by state without loading whole nodes."""

    pk: int
    name: str
    state: str


def node_state_lines(queryset: QuerySet[Node], now: datetime | None = None) -> list[NodeStateLine]:
    """Each node of the queryset with its state (the selectors' rule), in two queries whatever the count."""
    now = now or timezone.now()
    holds = held_domains()
    held_by_node: dict[int, list[str]] = defaultdict(list)
    if holds:
        for node_id, domain in NodeDomain.objects.filter(domain__in=holds, node__in=queryset.values("pk")).values_list(
            "node_id", "domain"
        ):
            held_by_node[node_id].append(domain)
    nodes = queryset.prefetch_related(None).only(
        "pk", "name", "last_heartbeat_at", "heartbeat_interval_seconds", "cordoned"
    )
    return [
        NodeStateLine(node.pk, node.name, node_state(node, sorted(held_by_node[node.pk]), holds, now)[0])
        for node in nodes
    ]


class NodeFilterSet(django_filters.FilterSet):
    """`domain=rack:r12-07` (any level; or `r12-07`, `gpu.model=H200`, several: see the module), `state=held`,
    `q=gpu01` (part of the name)."""

    domain = DomainFilter(label="Domain")
    state = django_filters.ChoiceFilter(
        label="State", choices=[(s, s) for s in STATES], method="filter_state", empty_label="any state"
    )
    q = django_filters.CharFilter(label="Name", field_name="name", lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["domain", "state", "q"]

    def filter_state(self, queryset: QuerySet[Node], name: str, value: str) -> QuerySet[Node]:
        # State depends on the clock and on holds, so it is worked out in Python, then kept as a pk filter.
        if not value:
            return queryset
        keep = [line.pk for line in node_state_lines(queryset) if line.state == value]
        return queryset.filter(pk__in=keep)

    def suggestions(self) -> list[dict]:
        """For each term of `domain` that no node has, in words and what it could have meant: ``{"term":
        "r12-7", "text": "No node is in rack r12-7.", "matches": ["r12-07", "r12-17"]}`` (``matches`` may be
        empty). Read only when asked: a query for each term, and the known names only for a term no node has."""
        if not self.is_bound or not self.is_valid():
            return []
        out = []
        for term in self.form.cleaned_data.get("domain") or ():
            if term.kind == "label":
                out += _label_suggestions(term)
            else:
                out += _domain_suggestions(term)
        return out


def nodes_filtered(params: Mapping[str, Any]) -> NodeFilterSet:
    """The filter over every node (with what a row shows) read from ``params``, valid — the API's list and
    ``ctl nodes`` read a query alike — or InvalidInput naming the first field it refuses."""
    filterset = NodeFilterSet(params, queryset=node_queryset())
    if not filterset.is_valid():
        field, messages = next(iter(filterset.errors.items()))
        raise InvalidInput(f"{field}: {messages[0]}", field=field)
    return filterset


def _domain_suggestions(term: Term) -> list[dict]:
    names = name_domains(term.text) if term.kind == "name" else [term.text]
    if NodeDomain.objects.filter(domain__in=names).exists():
        return []
    known = list(NodeDomain.objects.values_list("domain", flat=True).distinct())
    if term.kind == "domain":
        # Names against names of the same level first (`rack:` would make every rack look close).
        level, name = term.text.split(":", 1)
        same = [d.split(":", 1)[1] for d in known if d.startswith(f"{level}:")]
        matches = [f"{level}:{m}" for m in nearest_names(name, same, count=SUGGESTIONS)]
        if not matches:
            by_name = {d.split(":", 1)[1]: d for d in known}
            matches = [by_name[m] for m in nearest_names(name, by_name, count=SUGGESTIONS)]
        return [{"term": term.text, "text": f"No node is in {level} {name}.", "matches": matches}]
    # A bare name: the racks' names first, then any domain's name.
    racks = [d.split(":", 1)[1] for d in known if d.startswith("rack:")]
    matches = nearest_names(term.text, racks, count=SUGGESTIONS)
    if not matches:
        matches = nearest_names(term.text, [d.split(":", 1)[1] for d in known], count=SUGGESTIONS)
    return [{"term": term.text, "text": f"No node is in rack {term.text}.", "matches": matches}]


def _label_suggestions(term: Term) -> list[dict]:
    values = label_value(Node.objects.all(), term.key).exclude(label_value=None)
    if values.filter(label_value=term.value).exists():
        return []
    known = list(values.values_list("label_value", flat=True).distinct()[:5000])
    if known:
        matches = nearest_names(term.value, known, count=SUGGESTIONS)
        # `h200` for `H200`: a case apart is the likeliest slip, and close matches may rank it low.
        matches = [v for v in known if v.casefold() == term.value.casefold()] + matches
        labels = [f"{term.key}={v}" for v in dict.fromkeys(matches)][:SUGGESTIONS]
        return [{"term": term.text, "text": f"No node has {term.text}.", "matches": labels}]
    keys = sorted({k for labels in Node.objects.values_list("labels", flat=True) for k in (labels or {})})
    matches = nearest_names(term.key, keys, count=SUGGESTIONS)
    return [{"term": term.text, "text": f"No node has a {term.key} label.", "matches": [f"{k}={term.value}" for k in matches]}]
