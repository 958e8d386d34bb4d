"""YAML documents with line numbers, so an error in a file names the line as well as the field.

The one reader of every YAML llmgw takes: server.yaml, models.yaml, the facility scenarios, the
simulator's cluster file, agent.yaml, and the same files sent to the API. It is bounded before any
work is done on the input: the text's size is checked before it is parsed (a file's size before it is
read), the parsed tree's values and depth before anything is built from it (an alias repeats a whole
subtree), and an integer's digits before Python turns it into a number. Every refusal reads the same:
`FILE line N: path: what is wrong`. Pure: no Django (the node agent reads agent.yaml with it).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from llmgw.errors import InvalidInput, cut_short
from llmgw.parselimit import parse_slot

if TYPE_CHECKING:  # PyYAML is imported where a file is read, not by every module that names Document
    import yaml

Path = tuple[str | int, ...]


# What one file may hold: an alias repeats a whole subtree, so a few lines may stand for billions of values
# (minutes of a web worker, for a file sent to the API); nesting past Python's stack is no file a person writes.
MAX_VALUES = 500_000
MAX_DEPTH = 64
# A file people write is far below this (a 10,000-node cluster file is ~1 MB): larger is refused unread.
MAX_CHARS = 2_000_000
# An integer of more digits is no figure a file holds (Python refuses past 4,300 with a ValueError).
MAX_INT_DIGITS = 30
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# Numbers as YAML 1.2 reads them (its core schema), not as 1.1 (PyYAML's): `1:30` is text, not 90
# (sexagesimal), `010` is ten, not eight (octal is 0o10), and `1e12` is a number, not text. An
# underscore between digits is still taken (`10_000`), as people write large counts.
# (The resolver matches from the start only: each pattern ends at the text's end, \Z.)
_INT_12 = re.compile(r"(?:[-+]?[0-9][0-9_]*|0o[0-7][0-7_]*|0x[0-9a-fA-F][0-9a-fA-F_]*)\Z")
_FLOAT_12 = re.compile(
    r"(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)


class DuplicateKey(Exception):
    def __init__(self, path: Path, line: int):
        super().__init__(dotted(path))
        self.path = path
        self.line = line


class TooLarge(Exception):
    def __init__(self, message: str, line: int | None = None, path: Path = ()):
        super().__init__(message)
        self.message = message
        self.line = line
        self.path = path


def _walk(node: yaml.Node, path: Path, lines: dict[Path, int], count: list[int]) -> None:
    import yaml

    count[0] += 1
    if count[0] > MAX_VALUES:
        raise TooLarge(f"more than {MAX_VALUES:,} values (an alias repeating a large part?)")
    if len(path) > MAX_DEPTH:
        raise TooLarge(f"nested deeper than {MAX_DEPTH} levels", node.start_mark.line + 1)
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        # Its digits in any base (0x and FFF… are no decimal digits, and as large).
        if node.tag == _INT_TAG and sum(c.isalnum() for c in node.value) > MAX_INT_DIGITS:
            raise TooLarge(
                f"{dotted(path) or 'value'}: an integer of more than {MAX_INT_DIGITS} digits", node.start_mark.line + 1,
                path,
            )
    elif isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            if key in seen:  # YAML says the last one wins: a typo'd file would half-apply silently
                raise DuplicateKey((*path, key), key_node.start_mark.line + 1)
            seen.add(key)
            lines[(*path, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*path, key), lines, count)
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines, count)


class Document:
    """One parsed YAML document: its data, and the line each path starts on."""

    def __init__(self, data: Any, lines: dict[Path, int], filename: str):
        self.data = data
        self.lines = lines
        self.filename = filename

    def error(self, path: Path, message: str) -> InvalidInput:
        """An InvalidInput naming the file, the line and the field: `server.yaml line 7: facility.margin: …`."""
        field = dotted(path)
        line = self.line(path)
        where = f"{self.filename} line {line}: " if line else f"{self.filename}: "
        return InvalidInput(f"{where}{field}: {message}" if field else f"{where}{message}", field=field)

    def check_keys(self, path: Path, mapping: Mapping[Any, Any], allowed: Iterable[str], what: str) -> None:
        """Refuse a key of `mapping` (found at `path`) that is not in `allowed`: a typo must not be ignored."""
        allowed = tuple(allowed)
        for key in mapping:
            if key not in allowed:
                raise self.error((*path, str(key)), f"unknown key; {what} takes: {', '.join(allowed)}")

    def line(self, path: Path) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())


# A key a refusal names is cut past this (a label key's longest): a file's 900 KB key is not echoed back.
MAX_KEY_SHOWN = 253


def dotted(path: Path) -> str:
    """``facility.conditions.mode``, ``feeds[2].pdus``: the field a refusal names, each key cut short."""
    out = ""
    for part in path:
        key = cut_short(str(part), MAX_KEY_SHOWN)
        out += f"[{key}]" if isinstance(part, int) else (f".{key}" if out else key)
    return out


def is_number(value: Any) -> bool:
    """A finite int or float; YAML's `yes` is a bool, and a bool is an int in Python: it is no number."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_whole_number(value: Any) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_text(path, *, max_chars: int = MAX_CHARS) -> str:
    """A file given on the command line (or LLMGW_CONFIG), or InvalidInput saying why it cannot be read.

    Its size is looked at before it is read: a file larger than ``max_chars`` bytes is refused unread.
    """
    from pathlib import Path

    try:
        size = Path(path).stat().st_size
        if size > max_chars:
            raise InvalidInput(f"{path}: {size:,} bytes; a file llmgw reads is at most {max_chars:,}")
        with open(path, encoding="utf-8") as handle:
            return _within(handle.read(max_chars + 1), path, max_chars)
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not UTF-8 text") from None


def read_input(path: str, *, max_chars: int = MAX_CHARS) -> str:
    """:func:`read_text`, or standard input for ``-`` (named ``<stdin>``): read within ``max_chars`` either
    way, so ``< /dev/zero`` or a pipe that never ends is refused rather than read until memory runs out."""
    import sys

    if path != "-":
        return read_text(path, max_chars=max_chars)
    try:
        return _within(sys.stdin.read(max_chars + 1), "<stdin>", max_chars)
    except UnicodeDecodeError:
        raise InvalidInput("<stdin>: not UTF-8 text") from None


def _within(text: str, path, max_chars: int) -> str:
    """``text`` read with one character to spare: more than ``max_chars`` (a device, a pipe: no size to look
    at first) is refused."""
    if len(text) > max_chars:
        raise InvalidInput(f"{path}: more than {max_chars:,} characters; a file llmgw reads is at most {max_chars:,}")
    return text


@functools.cache
def _loader() -> type:
    """PyYAML's safe loader with YAML 1.2's numbers (_INT_12, _FLOAT_12)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(_INT_TAG, _INT_12, list("-+0123456789"))
    Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_12, list("-+0123456789."))
    Loader.add_constructor(_INT_TAG, lambda loader, node: _int_12(loader.construct_scalar(node)))
    Loader.add_constructor(_FLOAT_TAG, lambda loader, node: _float_12(loader.construct_scalar(node)))
    return Loader


def _int_12(text: str) -> int:
    digits = text.replace("_", "")
    if digits.startswith(("0o", "0x")):
        return int(digits, 8 if digits[1] == "o" else 16)
    return int(digits, 10)


def _float_12(text: str) -> float:
    lowered = text.replace("_", "").lower()
    if lowered.endswith((".inf", ".nan")):
        return float(lowered.replace(".", ""))  # -.inf → -inf, .nan → nan
    return float(lowered)


def load_documents(text: str, filename: str, *, max_chars: int = MAX_CHARS) -> list[Document]:
    """Every document of a YAML stream, or InvalidInput naming the line where it does not parse or what
    bound it passes. Parsed once: each document's tree is walked (bounded) before its data is built."""
    if len(text) > max_chars:
        raise InvalidInput(f"{filename}: {len(text):,} characters; a file llmgw reads is at most {max_chars:,}")
    with parse_slot(filename):  # seconds of CPU for the largest: a few at once per process (llmgw.parselimit)
        return _documents(text, filename)


def _documents(text: str, filename: str) -> list[Document]:
    import yaml

    try:
        nodes = list(yaml.compose_all(text, Loader=_loader()))
    except yaml.YAMLError as exc:
        raise _not_yaml(filename, exc) from exc
    except RecursionError:
        raise InvalidInput(f"{filename}: not valid YAML: nested deeper than {MAX_DEPTH} levels") from None
    docs = []
    count = [0]  # values of every document together
    for node in nodes:
        if node is None:  # an empty document, such as after a trailing ---
            continue
        lines: dict[Path, int] = {}
        try:
            _walk(node, (), lines, count)
        except DuplicateKey as dup:
            raise InvalidInput(
                f"{filename} line {dup.line}: {dotted(dup.path)}: given twice", field=dotted(dup.path)
            ) from None
        except TooLarge as big:
            where = f" line {big.line}" if big.line else ""
            raise InvalidInput(f"{filename}{where}: {big.message}", field=dotted(big.path) or None) from None
        try:
            data = _loader()("").construct_document(node)
        except yaml.YAMLError as exc:
            raise _not_yaml(filename, exc) from exc
        except (ValueError, OverflowError) as exc:  # a value the constructor cannot make (a date out of range)
            line = node.start_mark.line + 1
            raise InvalidInput(f"{filename} line {line}: not a value YAML can hold: {exc}") from None
        if data is None:
            continue
        docs.append(Document(data, lines, filename))
    return docs


def _not_yaml(filename: str, exc: Exception) -> InvalidInput:
    mark = getattr(exc, "problem_mark", None)
    where = f" line {mark.line + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return InvalidInput(f"{filename}{where}: not valid YAML: {problem}")


def load_one(text: str, filename: str, *, what: str = "file") -> Document:
    """The one document a file holds (an empty file is an empty mapping's document), bounded as above."""
    docs = load_documents(text, filename)
    if len(docs) > 1:
        raise docs[1].error((), f"a {what} is one YAML document; remove the second")
    return docs[0] if docs else Document({}, {(): 1}, filename)
