"""How `llmgw ctl` prints: aligned tables for people, JSON (`-o json`) for tools."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO


def print_json(data: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    json.dump(data, out, indent=2, default=str)
    out.write("\n")


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
