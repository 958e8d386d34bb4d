"""What every parser of a server.yaml block shares: the error that names the path of a wrong value, and
durations (``90s``, ``2m``, ``1h30m``).

Pure: no Django. The bottom of the facility's pure modules (domains, conditions, sources and the
response blocks import it; it imports none of them).
"""

from __future__ import annotations

import math
import re
from typing import Any

from llmgw.errors import value_shown

_SECONDS_RE = re.compile(r"\d+(?:\.\d+)?\Z")
_DURATION_RE = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?\Z")


class ConfigError(ValueError):
    """A wrong value in a configuration block: ``path`` (keys from the block) and what to write."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def parse_duration(value: Any) -> float:
    """``90``, ``"90s"``, ``"2m"``, ``"1h30m"`` → seconds; ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or text like 90s, 2m, 1h")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError("a duration is a number of seconds of at least 0")
        return float(value)
    if isinstance(value, str) and value:
        if _SECONDS_RE.match(value.strip()):  # `--for 120` on a command line: seconds, as the number 120 is
            return float(value)
        match = _DURATION_RE.match(value.strip())
        if match and any(match.groups()):
            hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
            return hours * 3600 + minutes * 60 + seconds
    raise ValueError(f"{value_shown(value)} is not a duration: write seconds, or text like 90s, 2m, 1h30m")
