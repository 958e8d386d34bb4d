"""Placement's rows keyed by a domain follow it when the facility renames it (facility.signals.domains_renamed)."""

from __future__ import annotations

from typing import Any

from placement.models import ShedDomain


def domains_renamed(*, renames: dict[str, str], **_: Any) -> None:
    """A domain under shedding stays under it by its new name (inside the renaming transaction)."""
    for old, new in sorted(renames.items()):
        if not ShedDomain.objects.filter(domain=new).exists():
            ShedDomain.objects.filter(domain=old).update(domain=new)
