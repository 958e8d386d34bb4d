"""The commit sums domain use in SQL: that SQL must say what facility.power's Python rule says."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agents.models import Node, measured_fresh_seconds
from facility.power import FacilitySettings, fresh_measured_watts, node_draw_sql, node_use_watts
from placement.models import NodeBooking

pytestmark = pytest.mark.django_db


def test_the_sql_node_draw_equals_the_python_rule_on_varied_rows():
    now = timezone.now()
    fresh = measured_fresh_seconds()
    ages = [None, 0.0, fresh / 2, fresh, fresh + 1, 10 * fresh]  # never read, fresh, the edge, stale
    measured = [None, 0.0, 150.0, 700.0, 2500.0]
    placed = [0.0, 300.0, 700.0, 1200.5]
    rows = []
    bookings = {}
    for number, (age, watts, booked) in enumerate(itertools.product(ages, measured, placed)):
        bookings[f"n{number}"] = booked
        rows.append(
            Node(
                name=f"n{number}",
                measured_watts=watts,
                sensors_at=None if age is None else now - timedelta(seconds=age),
            )
        )
    Node.objects.bulk_create(rows)
    nodes = dict(Node.objects.values_list("name", "pk"))
    NodeBooking.objects.bulk_create(NodeBooking(node_id=nodes[name], placed_watts=w) for name, w in bookings.items())
    settings = FacilitySettings(node_watts=80.0)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT n.name, {node_draw_sql('n', placed='b.placed_watts')} FROM {Node._meta.db_table} n "
            f"JOIN {NodeBooking._meta.db_table} b ON b.node_id = n.id",
            [now - timedelta(seconds=fresh)],
        )
        from_sql = dict(cursor.fetchall())
    assert len(from_sql) == len(rows)
    for node in Node.objects.all():
        measured_now = fresh_measured_watts(node.measured_watts, node.sensors_at, now, fresh)
        expected = node_use_watts(bookings[node.name], measured_now, settings) - settings.node_watts
        assert from_sql[node.name] == pytest.approx(expected), node.name
    # The rows were varied enough to take both branches of the rule.
    assert any(v > bookings[n.name] for n in rows for k, v in from_sql.items() if k == n.name)
    assert any(v == bookings[n.name] and (n.measured_watts or 0) > bookings[n.name] for n in rows
               for k, v in from_sql.items() if k == n.name)
