"""A domain as shedding and capping judge it: its power use against its limit, and its condition."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from facility.domains import LEVELS

# Each level's place, the widest first (site … rack, pdu, a PDU's leg): facility.domains.LEVELS, the one
# order shedding (widest first) and capping (narrowest first) both sort by. A level not known comes last.
LEVEL_RANK = {level: rank for rank, level in enumerate(LEVELS)}
_UNKNOWN = len(LEVELS)


def widest_first(domain: str) -> tuple[int, str]:
    """A sort key of a domain's text (``rack:r1``): the widest level first, then by name."""
    return LEVEL_RANK.get(domain.split(":", 1)[0], _UNKNOWN), domain


def narrowest_first(domain: str) -> tuple[int, str]:
    """A sort key of a domain's text: the narrowest level first (a leg, then its PDU …), then by name."""
    rank = LEVEL_RANK.get(domain.split(":", 1)[0])
    return (_UNKNOWN if rank is None else _UNKNOWN - 1 - rank), domain


@dataclass(frozen=True, slots=True)
class DomainState:
    """One domain's figures (facility_overview) and effective condition (effective_conditions).

    ``condition`` is None where nothing judged the domain; ``enforce`` is its conditions mode.
    """

    domain: str
    use_watts: float = 0.0
    limit_watts: float | None = None
    over_limit: bool = False
    condition: str | None = None
    enforce: bool = False
    detail: str | None = None
    condition_since: datetime | None = None

    @property
    def words(self) -> str:
        """The domain as a sentence says it: `rack r12-07`."""
        return self.domain.replace(":", " ", 1)
