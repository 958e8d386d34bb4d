"""How deep a JSON text nests, found without recursion, so deep input is refused before a parser recurses.

Pure: no Django. Python's json module recurses once per level: `[` × 100,000 ends in RecursionError (a 500,
or a dead consumer) rather than a refusal. No document llmgw takes nests deeper than a handful of levels;
MAX_JSON_DEPTH leaves plenty of room and still stops a parser long before Python's recursion limit.
"""

from __future__ import annotations

import re

from llmgw.errors import value_shown

MAX_JSON_DEPTH = 64

# Only what changes the depth or string state matters: quotes, backslashes and brackets.
_SIGNIFICANT = re.compile(rb'["\\\[\]{}]')


class TooDeep(ValueError):
    """A JSON text nested deeper than the limit; the text says how deep is allowed."""

    def __init__(self, limit: int):
        super().__init__(f"JSON nested deeper than {limit} levels")
        self.limit = limit


def json_depth_exceeds(data: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True if some array or object in `data` opens more than `limit` levels deep (strings are skipped).

    Linear in the size of the text. Malformed text is not judged here (the parser refuses it); an
    unterminated string simply ends the scan.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    # Depth can never pass the number of opening brackets: the common case costs two C-speed counts.
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    in_string = False
    escaped_at = -1  # the position a backslash in a string escapes
    for match in _SIGNIFICANT.finditer(data):
        pos = match.start()
        if pos == escaped_at:
            continue
        char = data[pos]
        if in_string:
            if char == 0x5C:  # backslash
                escaped_at = pos + 1
            elif char == 0x22:  # quote
                in_string = False
        elif char == 0x22:
            in_string = True
        elif char in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif char in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def check_json_depth(data: bytes | str, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise TooDeep if `data` nests deeper than `limit`."""
    if json_depth_exceeds(data, limit):
        raise TooDeep(limit)


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice: json keeps the last, so the first would be dropped unseen
    (YAML documents refuse the same, llmgw.yamldoc)."""

    def __init__(self, key: str):
        super().__init__(f"{value_shown(key)} is given twice in one object")
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``' object_pairs_hook: the object, or DuplicateKey for a key given twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj
