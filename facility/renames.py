"""A domain renamed where it is recorded (a rack renamed in NetBox): what a person set on it follows it.

A rename is not a removal and an addition: the rack's written budget, its hold, its conditions set by
hand, its judged condition, its events and its history keep their rows under the new name. Placement's
own rows follow through the ``domains_renamed`` signal.
"""

from __future__ import annotations

from collections.abc import Mapping

from facility.models import (
    Budget,
    ConditionEvent,
    ConditionOverride,
    DomainCondition,
    DomainSample,
    Hold,
    Source,
)
from facility.signals import domains_renamed


def domains_rename(renames: Mapping[str, str]) -> None:
    """Rename each domain ``old`` → ``new`` (``rack:R-B01`` → ``rack:R-B01-NEW``), inside the caller's
    transaction, after it locked the budgets. A feed-derived cap at the new name gives way to the rack's
    own row; the feeds' caps are derived again by the caller."""
    renames = {old: new for old, new in renames.items() if old != new}
    if not renames:
        return
    for old, new in sorted(renames.items()):
        # One at a time, new names first cleared of what nobody wrote there (unique domains).
        if Budget.objects.filter(domain=old).exists():
            Budget.objects.filter(domain=new, source=Source.FEED).delete()
            if not Budget.objects.filter(domain=new).exists():
                Budget.objects.filter(domain=old).update(domain=new)
        for model in (Hold, ConditionOverride, DomainCondition):
            if not model.objects.filter(domain=new).exists():
                model.objects.filter(domain=old).update(domain=new)
        ConditionEvent.objects.filter(domain=old).update(domain=new)
        taken = set(DomainSample.objects.filter(domain=new).values_list("resolution", "at"))
        samples = DomainSample.objects.filter(domain=old)
        if taken:
            samples = samples.exclude(pk__in=[
                pk for pk, r, at in samples.values_list("pk", "resolution", "at") if (r, at) in taken])
        samples.update(domain=new)
    domains_renamed.send(sender=Budget, renames=dict(renames))
