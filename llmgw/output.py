"""How `llmgw ctl` prints: aligned tables for people, JSON (`-o json`) for tools."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

# What a terminal would act on rather than show (ESC starts a sequence that clears the screen, hides
# text, or makes a link): every C0 control but tab and newline, DEL, and the C1 controls.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with each terminal control character shown as its escape (``\\x1b``), not acted on."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class _Printable:
    """A text stream that writes what it is given through :func:`printable`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text))

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def printable_output() -> Iterator[None]:
    """While it lasts, what is printed to standard output and error shows control characters as escapes:
    a hold's reason or a node's label, written by someone else, cannot drive the terminal of the
    operator who lists it. JSON escapes them itself."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(out), _Printable(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def print_json(data: Any, out: TextIO | None = None) -> None:
    """``data`` as JSON; a float as its shortest text to 10 significant digits (11.3, not 11.299999999999997)."""
    out = out or sys.stdout
    json.dump(_rounded(data), out, indent=2, default=str)
    out.write("\n")


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.10g}") if value == value and abs(value) != float("inf") else value
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO | None = None) -> None:
    """Columns padded to the widest cell, two spaces apart; the last column is not padded."""
    out = out or sys.stdout
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True))
        out.write((line + "  " + row[-1] if len(row) > 1 else row[-1]).rstrip() + "\n")


def kw(watts: float | None) -> str:
    """facility.power.kw for a figure that may be missing (``-``)."""
    from facility.power import kw as in_kw

    return "-" if watts is None else in_kw(watts)
