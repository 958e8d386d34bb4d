"""API tokens' lifetimes as people write them (`30d`, `12h`, `never`): parsed and checked here, no Django."""

from __future__ import annotations

import re
from datetime import timedelta

# The longest lifetime a token may be given other than `never`: ten years.
MAX_DAYS = 3650
UNITS = {"d": timedelta(days=1), "h": timedelta(hours=1), "m": timedelta(minutes=1)}
_LIFETIME = re.compile(r"(\d{1,6})([dhm])")


def parse_lifetime(text: str) -> timedelta | None:
    """`30d`, `12h`, `90m` → that long; `never` → None. ValueError with the words for anything else."""
    if not isinstance(text, str):
        raise ValueError("expires: give a lifetime such as 90d, 12h or 30m, or never")
    value = text.strip().lower()
    if value == "never":
        return None
    found = _LIFETIME.fullmatch(value)
    if not found:
        raise ValueError(f"expires: {text[:40]!r} is not a lifetime; write e.g. 90d, 12h, 30m, or never")
    lifetime = int(found.group(1)) * UNITS[found.group(2)]
    if lifetime <= timedelta(0):
        raise ValueError("expires: a lifetime must be longer than 0; write never for a token that does not expire")
    if lifetime > timedelta(days=MAX_DAYS):
        raise ValueError(f"expires: at most {MAX_DAYS}d; write never for a token that does not expire")
    return lifetime


def lifetime_text(lifetime: timedelta | None) -> str:
    """The lifetime as parse_lifetime reads it back (a whole number of days, hours or minutes)."""
    if lifetime is None:
        return "never"
    for unit in ("d", "h", "m"):
        count, rest = divmod(lifetime, UNITS[unit])
        if not rest:
            return f"{count}{unit}"
    return f"{int(lifetime.total_seconds() // 60)}m"
