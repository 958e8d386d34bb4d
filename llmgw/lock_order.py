"""The one order in which llmgw's writers take row locks, and the only module that takes them.

Two transactions that take their locks in one order never wait on each other in a circle; in any other
order PostgreSQL finds the deadlock only after ``deadlock_timeout`` (a second) and aborts one of them.
So, inside one transaction, row locks are taken kind by kind in :data:`ORDER`, and the rows of one kind
by that kind's key:

1. a DCIM sync's claim (``facility.DcimSync``), alone in its transaction;
2. models (``placement.Model``), by id: scaling, a drain step, a shedding's replacement, an apply or a
   delete hold their model first;
3. budgets (``facility.Budget``), by domain: a placement's commit, a change of caps, feeds or settings
   (every budget), a node joining a budgeted domain (those, for share, before its row);
4. nodes (``agents.Node``), by name: a placement's commit, a hold (the domain's members), a relabel, a
   cordon, a heartbeat, the readings batch, a freeing (the nodes its replicas' shards are on);
5. replicas (``placement.Replica``), by id: a freeing, after their shards' nodes; a commit's guarded
   write updates its replica last;
6. API tokens (``access.ApiToken``): a rotation, alone in its transaction.

A writer may skip kinds, never go back to an earlier one. Rows are locked through :func:`rows_locked`
(a queryset) or :func:`lock_clause` (the end of a raw statement); a test finds ``select_for_update`` or
``FOR UPDATE``/``FOR SHARE`` anywhere else in the project's code. (The migrations' triggers lock
budgets for share before a node joins their domain, in this order too.) On SQLite there are no row
locks: its IMMEDIATE transactions serialise the writers instead.

Imports no app: every layer locks through it.
"""

from __future__ import annotations

from typing import TypeVar

from django.db import connection, models
from django.db.models import QuerySet

# (the model's label, the key its rows are locked in the order of), in the order the kinds are locked.
ORDER: tuple[tuple[str, str], ...] = (
    ("facility.DcimSync", "pk"),
    ("placement.Model", "pk"),
    ("facility.Budget", "domain"),
    ("agents.Node", "name"),
    ("placement.Replica", "pk"),
    ("access.ApiToken", "pk"),
)
_KEYS = dict(ORDER)

Q = TypeVar("Q", bound=QuerySet)


def lock_key(model: type[models.Model]) -> str:
    """The field whose order ``model``'s rows are locked in; ValueError for a model with no place in ORDER."""
    label = model._meta.label
    if label not in _KEYS:
        raise ValueError(f"{label} has no place in the lock order (llmgw.lock_order.ORDER)")
    return _KEYS[label]


def rows_locked(queryset: Q, *, nowait: bool = False) -> Q:
    """``queryset`` with its rows locked for update when it is read (inside the caller's transaction), in
    their kind's key order. ``nowait``: a row another transaction holds raises at once rather than waiting."""
    return queryset.select_for_update(nowait=nowait).order_by(lock_key(queryset.model))


def lock_clause(model: type[models.Model], *, share: bool = False, alias: str = "") -> str:
    """The end of a raw SELECT of ``model``'s rows that locks them in their key's order: `` ORDER BY name
    FOR UPDATE`` (``FOR SHARE`` with ``share``; the column qualified by ``alias``). Where the database has
    no row locks (SQLite), only the ORDER BY."""
    key = lock_key(model)
    field = model._meta.pk if key == "pk" else model._meta.get_field(key)
    column = f"{alias}.{field.column}" if alias else field.column
    if not connection.features.has_select_for_update:
        return f" ORDER BY {column}"
    return f" ORDER BY {column} FOR {'SHARE' if share else 'UPDATE'}"
