"""API tokens' lifetimes as people write them (`30d`, `12h`, `never`): parsed and checked here, no Django."""

from __future__ import annotations

import re
from datetime import timedelta

UNITS = {"d": timedelta(days=1), "h": timedelta(hours=1), "m": timedelta(minutes=1)}
# A lifetime as the API's schema states it: `never`, or 1 to 9999 days, hours or minutes.
LIFETIME_PATTERN = r"^(never|[1-9][0-9]{0,3}[dhm])$"
_LIFETIME = re.compile(LIFETIME_PATTERN)


def parse_lifetime(text: str) -> timedelta | None:
    """`30d`, `12h`, `90m` → that long (1 to 9999 of a unit); `never` → None. ValueError with the words for
    anything else."""
    if not isinstance(text, str):
        raise ValueError("expires: give a lifetime such as 90d, 12h or 30m, or never")
    if text == "never":
        return None
    if not _LIFETIME.fullmatch(text):  # not match: `$` would let a trailing newline through
        raise ValueError(
            f"expires: {text[:40]!r} is not a lifetime; write 1 to 9999 and d, h or m (e.g. 90d, 12h, 30m), or never"
        )
    return int(text[:-1]) * UNITS[text[-1]]

