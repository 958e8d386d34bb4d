"""How `llmgw ctl` prints: aligned tables for people, JSON (`-o json`) for tools."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Collection, Iterable, Iterator, Sequence
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


# How wide a table or a line ctl prints may be: what a terminal beside another shows whole. `-o wide`
# prints every column, each cell whole, however wide that is.
WIDTH = 120
CUT = "…"
# A cut column keeps at least this much of each cell (with the …): narrower, it would say nothing.
MIN_CUT_WIDTH = 12


def print_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO | None = None, *,
    cut: Collection[str] = (), wide: bool = False,
) -> None:
    """Columns padded to the widest cell, two spaces apart; the last column is not padded.

    ``cut``: the headers of the columns of free text (reasons, lists, profiles) whose long cells are cut
    short, ending in …, so that the table fits WIDTH columns; the widest of them is cut first, never below
    MIN_CUT_WIDTH. ``wide`` (`-o wide`): nothing is cut."""
    out = out or sys.stdout
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if not wide and cut:
        floors = [max(MIN_CUT_WIDTH, len(h)) for h in cells[0]]
        widths = _fitted(widths, [i for i, h in enumerate(headers) if h in cut], floors)
        cells = [cells[0]] + [[_cut(c, w) for c, w in zip(row, widths, strict=True)] for row in cells[1:]]
    for row in cells:
        line = "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True))
        out.write((line + "  " + row[-1] if len(row) > 1 else row[-1]).rstrip() + "\n")


def _fitted(widths: list[int], cuttable: list[int], floors: list[int]) -> list[int]:
    """``widths`` with the cuttable columns narrowed, the widest first (to the next widest, then both one
    column at a time), until the line fits WIDTH or none can be narrower than its floor."""
    widths = list(widths)
    over = sum(widths) + 2 * (len(widths) - 1) - WIDTH
    while over > 0:
        widest = max((i for i in cuttable if widths[i] > floors[i]), key=lambda i: widths[i], default=None)
        if widest is None:
            break
        next_widest = max((widths[i] for i in cuttable if i != widest), default=0)
        target = max(floors[widest], next_widest, widths[widest] - over)
        if target == widths[widest]:
            target -= 1
        over -= widths[widest] - target
        widths[widest] = target
    return widths


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - len(CUT)] + CUT


def wrapped(text: str) -> list[str]:
    """``text`` as lines of at most WIDTH columns: broken after its ``; `` (a list of reasons) where it can,
    else between words; every line after the first indented two more than the first."""
    if len(text) <= WIDTH:
        return [text]
    indent = " " * (len(text) - len(text.lstrip(" ")) + 2)
    lines: list[str] = []
    line = ""
    for part in text.split("; "):
        piece = part if not line else f"{line}; {part}"
        if len(piece) < WIDTH or not line:  # < : room for the ; that ends it, should a line follow
            line = piece
            continue
        lines.append(line + ";")
        line = indent + part
    lines.append(line)
    out: list[str] = []
    for line in lines:
        if len(line) <= WIDTH:
            out.append(line)
        else:  # one reason longer than a line: between its words
            out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False)
    return out


def print_wrapped(text: str, out: TextIO | None = None) -> None:
    """:func:`wrapped`, printed."""
    out = out or sys.stdout
    for line in wrapped(text):
        out.write(line + "\n")


def kw(watts: float | None) -> str:
    """facility.power.kw for a figure that may be missing (``-``)."""
    from facility.power import kw as in_kw

    return "-" if watts is None else in_kw(watts)
