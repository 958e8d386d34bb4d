"""The commit sums domain use in SQL: that SQL must say what facility.power's Python rule says."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agents.models import Node, measured_fresh_seconds, measured_window_seconds
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
                measured_peak_watts=watts,
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
        measured_now = fresh_measured_watts(node.measured_peak_watts, node.sensors_at, now, fresh)
        expected = node_use_watts(bookings[node.name], measured_now, settings) - settings.node_watts
        assert from_sql[node.name] == pytest.approx(expected), node.name
    # The rows were varied enough to take both branches of the rule.
    assert any(v > bookings[n.name] for n in rows for k, v in from_sql.items() if k == n.name)
    assert any(v == bookings[n.name] and (n.measured_peak_watts or 0) > bookings[n.name] for n in rows
               for k, v in from_sql.items() if k == n.name)


def test_a_nodes_measured_draw_is_its_peak_over_the_window_on_both_write_paths(join_node):
    """The full heartbeat path and the readings writer keep the same peak; the SQL and Python read it."""
    from agents import readings
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for
    from tests.conftest import node_spec

    def beat(watts):
        hb = heartbeat_for(node_spec("gpu01", rack="r1", gpus=1))
        hb["sensors"] = {"gpus": [{"index": 0, "power_watts": watts}]}
        return hb

    start = timezone.now()
    heartbeat_record(node_name="gpu01", heartbeat=beat(650.0), now=start)  # the full path: a burst
    assert Node.objects.get(name="gpu01").measured_peak_watts is None  # one sample holds no peak
    # The same report but for the sensors: the readings writer's fast path, a second burst, then a dip.
    heartbeat_record(node_name="gpu01", heartbeat=beat(640.0), now=start + timedelta(seconds=10))
    heartbeat_record(node_name="gpu01", heartbeat=beat(120.0), now=start + timedelta(seconds=30))
    readings.flush()
    node = Node.objects.get(name="gpu01")
    assert node.measured_watts == 120.0  # the last reading
    assert node.measured_peak_watts == 640.0  # what placement counts: the second-highest of the window
    assert node.fresh_measured_watts(start + timedelta(seconds=40)) == 640.0
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {node_draw_sql('n', placed='0')} FROM {Node._meta.db_table} n WHERE n.name = 'gpu01'",  # nothing placed
            [start + timedelta(seconds=40) - timedelta(seconds=measured_fresh_seconds())],
        )
        assert cursor.fetchone()[0] == 640.0
    # Past the window the bursts no longer count.
    later = start + timedelta(seconds=measured_window_seconds() + 120)
    heartbeat_record(node_name="gpu01", heartbeat=beat(200.0), now=later)
    heartbeat_record(node_name="gpu01", heartbeat=beat(210.0), now=later + timedelta(seconds=10))
    readings.flush()
    assert Node.objects.get(name="gpu01").measured_peak_watts == 200.0


def test_the_sql_measured_peak_equals_the_python_rule_on_varied_buckets():
    import json

    from facility.power import measured_peak, measured_peak_sql

    window = 900.0
    base = 1_800_000_000.0
    bucket_sets = [
        [], [[base - 960.0, 900.0]], [[base - 840.0, 800.0], [base - 60.0, 300.0]], [[base, 100.0]],
        [[base - 840.0, 800.0, 20.0], [base, 650.0, 600.0]], [[base - 60.0, 50.0, 40.0]], [[base, 900.0, 30.0]],
    ]
    readings = [None, 50.0, 700.0]
    offsets = [0.0, 1.0, 59.9, 60.0, 3600.0]
    sql_buckets, sql_peak = measured_peak_sql("x.p", "x.t", "x.w", window)
    checked = 0
    with connection.cursor() as cursor:
        for buckets, watts, offset in itertools.product(bucket_sets, readings, offsets):
            at = base + offset
            cursor.execute(
                f"SELECT {sql_buckets}, {sql_peak} FROM (SELECT CAST(%s AS jsonb) AS p, to_timestamp(%s) AS t, "
                f"CAST(%s AS double precision) AS w) x",
                [json.dumps(buckets), at, watts],
            )
            got_buckets, got_peak = cursor.fetchone()
            got_buckets = json.loads(got_buckets) if isinstance(got_buckets, str) else got_buckets
            want_buckets, want_peak = measured_peak(buckets, watts, at, window)
            assert [[float(v) for v in bucket] for bucket in got_buckets] == want_buckets, (buckets, watts, offset)
            assert got_peak == want_peak, (buckets, watts, offset)
            checked += 1
    assert checked == len(bucket_sets) * len(readings) * len(offsets)
