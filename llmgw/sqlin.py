"""`IN` for long lists of values: one array parameter on PostgreSQL, a placeholder a value elsewhere.

Django and psycopg turn ``pk__in=ids`` into ``IN (%s, %s, …)``: one placeholder a value, which psycopg
then finds again by scanning the statement's text in Python: with thousands of ids that scan is
Python's work for every value of every statement, and freeing a model's replicas takes several of them.
With one array, bound in binary, the statement's text is the same whatever the number of values
(parsed once, prepared by ``prepare_threshold``), and the database joins the values as a set, by hash
or by index. (``column = ANY(%s)`` is the same test, but a scan compares each row with every element
in turn: every domain row of a cluster against every one of its budgets, twice a placement batch,
where the set finds each row's match at once.)

>>> Replica.objects.filter(pk__in=any_of(ids))              # the ORM
>>> where, params = sql_in("replica_id", ids)               # raw SQL
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection
from django.db.models.expressions import RawSQL


def _array(values: list) -> str:
    """The unnested array of ``values`` (all ints or all strings), as SQL with one binary parameter."""
    kind = "bigint" if values and isinstance(values[0], int) else "text"
    return f"SELECT unnest(CAST(%b AS {kind}[]))"


def any_of(values: Iterable) -> list | RawSQL:
    """What ``field__in=`` takes for many values: on PostgreSQL one array, elsewhere the list itself."""
    values = list(values)
    if not values or connection.vendor != "postgresql":
        return values
    return RawSQL(_array(values), [values])


def sql_in(column: str, values: Iterable) -> tuple[str, list]:
    """``column IN (…)`` as SQL and its parameters."""
    values = list(values)
    if connection.vendor == "postgresql":
        return f"{column} IN ({_array(values)})", [values]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", values
