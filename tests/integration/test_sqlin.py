"""llmgw.sqlin: `IN` over long lists selects what the plain `IN` selects, on whichever database the
tests run (one array on PostgreSQL, placeholders on SQLite)."""

from __future__ import annotations

import pytest
from django.db import connection

from agents.models import Node
from llmgw.sqlin import any_of, sql_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes() -> list[Node]:
    return Node.objects.bulk_create([Node(name=f"gpu{i:04d}") for i in range(3000)])


def test_the_orm_form_selects_by_ids_and_by_names(nodes) -> None:
    ids = [n.pk for n in nodes[::3]]
    names = [n.name for n in nodes[1::7]]
    assert sorted(Node.objects.filter(pk__in=any_of(ids)).values_list("pk", flat=True)) == sorted(ids)
    assert sorted(Node.objects.filter(name__in=any_of(set(names))).values_list("name", flat=True)) == sorted(names)
    assert not Node.objects.filter(pk__in=any_of([])).exists()
    # Values that match nothing, and a name that would be SQL if it were pasted in: taken as data.
    assert not Node.objects.filter(name__in=any_of(["nobody", "x') OR ('1'='1"])).exists()


def test_the_raw_form_selects_what_the_orm_form_does(nodes) -> None:
    ids = [n.pk for n in nodes[5:2500]]
    where, params = sql_in("id", ids)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {Node._meta.db_table} WHERE {where}", params)
        assert cursor.fetchone()[0] == len(ids)
        where, params = sql_in("name", ["gpu0001", "gpu2999", "gpu9999"])
        cursor.execute(f"SELECT name FROM {Node._meta.db_table} WHERE {where} ORDER BY name", params)
        assert [row[0] for row in cursor.fetchall()] == ["gpu0001", "gpu2999"]
        # Thousands of values, one parameter on PostgreSQL: the statement's text does not grow with them.
        if connection.vendor == "postgresql":
            assert len(params) == 1 and "%b" in where
