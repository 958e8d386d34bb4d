"""A profile's node_selector: parsing, matching, and formatting back for a rejection reason.

Pure: no Django. The shorthand is comma-separated expressions, all of which must hold::

    gpu.model in (H100,H200), gpu.memory_gib >= 80, !spot

Operators: ``in``, ``notin`` (sets, compared as strings), ``=``, ``!=`` (one string), a bare key
(exists), ``!key`` (does not exist), and ``>``, ``>=``, ``<``, ``<=`` (numeric: a value that is not a
number never matches). ``notin`` and ``!=`` hold on a node without the key, as in Kubernetes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

IN = "in"
NOTIN = "notin"
EQ = "="
NE = "!="
EXISTS = "exists"
NOT_EXISTS = "!exists"
GT = ">"
GE = ">="
LT = "<"
LE = "<="
COMPARISONS = (GT, GE, LT, LE)

_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9._/-]*")
# A value: anything but blanks, separators and operator characters.
_VALUE_RE = re.compile(r"[^\s,()!=<>]+")
_WORD_OP_RE = re.compile(r"(notin|in)(?![A-Za-z0-9._/-])")
_SYMBOL_OPS = (">=", "<=", "!=", "=", ">", "<")


class SelectorError(ValueError):
    """A node_selector that does not parse; the message names the problem and its column."""


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class Expression:
    """One requirement on a node's labels: ``gpu.memory_gib >= 80``."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.op == EXISTS:
            return self.key
        if self.op == NOT_EXISTS:
            return f"!{self.key}"
        if self.op in (IN, NOTIN):
            return f"{self.key} {self.op} ({','.join(self.values)})"
        return f"{self.key} {self.op} {self.values[0]}"

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when the node's effective labels meet this requirement."""
        value = labels.get(self.key)
        op = self.op
        if op == EXISTS:
            return value is not None
        if op == NOT_EXISTS:
            return value is None
        if op in (IN, EQ):
            return value is not None and value in self.values
        if op in (NOTIN, NE):
            return value is None or value not in self.values
        have = _number(value) if value is not None else None
        if have is None:
            return False
        want = float(self.values[0])
        if op == GT:
            return have > want
        if op == GE:
            return have >= want
        if op == LT:
            return have < want
        return have <= want


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed node_selector: every expression must hold."""

    expressions: tuple[Expression, ...]

    def __str__(self) -> str:
        return ", ".join(str(e) for e in self.expressions)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when the labels meet every expression."""
        return all(e.matches(labels) for e in self.expressions)

    def first_unmet(self, labels: Mapping[str, str]) -> Expression | None:
        """The first expression the labels do not meet, for ``needs <expression>``; None if all hold."""
        for expression in self.expressions:
            if not expression.matches(labels):
                return expression
        return None


class _Parser:
    """A small scanner over the text; positions are reported 1-based, as columns."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, problem: str, pos: int | None = None) -> SelectorError:
        column = (self.pos if pos is None else pos) + 1
        return SelectorError(f"node_selector {self.text!r}: {problem} at column {column}")

    def skip_blanks(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def at_end(self) -> bool:
        self.skip_blanks()
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def what_is_here(self) -> str:
        return f"{self.peek()!r}" if self.pos < len(self.text) else "the end"

    def key(self) -> str:
        self.skip_blanks()
        found = _KEY_RE.match(self.text, self.pos)
        if not found:
            raise self.fail(f"expected a label key, found {self.what_is_here()}")
        self.pos = found.end()
        return found.group()

    def value(self, after: str) -> str:
        self.skip_blanks()
        found = _VALUE_RE.match(self.text, self.pos)
        if not found:
            raise self.fail(f"expected a value after {after!r}, found {self.what_is_here()}")
        self.pos = found.end()
        return found.group()

    def value_set(self, op: str) -> tuple[str, ...]:
        self.skip_blanks()
        if self.peek() != "(":
            raise self.fail(f"expected '(' after {op!r}, found {self.what_is_here()}")
        opened = self.pos
        self.pos += 1
        values: list[str] = []
        while True:
            self.skip_blanks()
            if self.pos >= len(self.text):
                raise self.fail("the set is not closed with ')'", opened)
            values.append(self.value("(" if not values else ","))
            self.skip_blanks()
            if self.peek() == ",":
                self.pos += 1
                continue
            if self.peek() == ")":
                self.pos += 1
                return tuple(values)
            if self.pos >= len(self.text):
                raise self.fail("the set is not closed with ')'", opened)
            raise self.fail(f"expected ',' or ')' in the set, found {self.what_is_here()}")

    def expression(self) -> Expression:
        self.skip_blanks()
        if self.peek() == "!":
            self.pos += 1
            return Expression(self.key(), NOT_EXISTS)
        key = self.key()
        self.skip_blanks()
        if self.pos >= len(self.text) or self.peek() == ",":
            return Expression(key, EXISTS)
        word = _WORD_OP_RE.match(self.text, self.pos)
        if word:
            self.pos = word.end()
            return Expression(key, word.group(1), self.value_set(word.group(1)))
        for op in _SYMBOL_OPS:
            if self.text.startswith(op, self.pos):
                op_pos = self.pos
                self.pos += len(op)
                value = self.value(op)
                if op in COMPARISONS and _number(value) is None:
                    raise self.fail(f"{op!r} compares numbers, and {value!r} is not one", op_pos)
                return Expression(key, op, (value,))
        raise self.fail(f"expected an operator (in, notin, =, !=, >, >=, <, <=) after {key!r}")

    def selector(self) -> Selector:
        expressions: list[Expression] = []
        if self.at_end():
            return Selector(())
        while True:
            expressions.append(self.expression())
            if self.at_end():
                return Selector(tuple(expressions))
            if self.peek() != ",":
                raise self.fail(f"expected ',' between expressions, found {self.what_is_here()}")
            self.pos += 1
            if self.at_end():
                raise self.fail("expected an expression after ','")


def parse_selector(text: str) -> Selector:
    """Parse the shorthand; raises SelectorError naming the problem and its column.

    Blank text is the empty selector, which every node meets.
    """
    if not isinstance(text, str):
        raise SelectorError(f"node_selector must be text, not {type(text).__name__}")
    return _Parser(text).selector()
