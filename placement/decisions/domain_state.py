"""A domain as shedding and capping judge it: its power use against its limit, and its condition."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


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
