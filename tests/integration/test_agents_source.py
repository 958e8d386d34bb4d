"""The agents' conditions source reads each node's sensors summed up by PostgreSQL, not the documents:
whatever a document holds, the summary is what facility.sources.node_thermal makes of it (on SQLite,
the embedded default, node_thermal itself sums up the documents)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import JSONField, Value
from django.utils import timezone
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.models import Node
from facility.evaluation import _node_sensors, conditions_evaluate
from facility.models import DomainCondition, SourceStatus
from facility.services import facility_apply
from facility.sources import node_thermal

pytestmark = pytest.mark.django_db

# Figures as agents send them, and what a document written by something else may hold instead: text,
# booleans, nulls, figures past ±1e9 (absent), nested things.
figures = st.one_of(
    st.floats(min_value=-200, max_value=200, allow_nan=False),
    st.integers(min_value=-10**12, max_value=10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(), st.booleans(), st.just("61.3"), st.just([61.3]),
)
reasons = st.one_of(
    st.lists(st.sampled_from(["hw_thermal", "sw_thermal", "sw_power_cap", "hw_slowdown", "", "HW_THERMAL"]), max_size=4),
    st.lists(st.one_of(st.just(["hw_thermal"]), st.just({"hw_thermal": 1}), st.integers(0, 3)), max_size=2),
    st.just("hw_thermal"), st.just({"hw_thermal": True}), st.none(),
)
gpu = st.fixed_dictionaries(
    {},
    optional={"index": st.integers(0, 7), "temperature_celsius": figures, "slowdown_temperature_celsius": figures,
              "throttle_reasons": reasons, "power_watts": figures},
)
sensors = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "gpus": st.one_of(st.lists(st.one_of(gpu, st.integers(), st.none(), st.just("gpu")), max_size=8),
                              gpu, st.just("eight")),
            "inlet_temperature_celsius": figures,
            "cpu_temperature_celsius": figures,
        },
    ),
    st.lists(gpu, max_size=2), st.integers(), st.just("sensors"), st.none(),
)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="on SQLite the documents are summed up in Python")
@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(sensors, min_size=1, max_size=4))
@example(docs=[{"gpus": [1, None, "x", {"temperature_celsius": 80, "slowdown_temperature_celsius": 87}]},
               {"gpus": {"temperature_celsius": 80}, "inlet_temperature_celsius": "24"}, ["gpus"], None])
@example(docs=[{"inlet_temperature_celsius": v} for v in (10**9, 10**9 + 1, 1e9, -1e9)])
@example(docs=[{"inlet_temperature_celsius": v} for v in (1000000000.0000001, -0.0, 1e-300, 5e-324)])
@example(docs=[{"gpus": [{"temperature_celsius": 0, "slowdown_temperature_celsius": -0.0}], "inlet_temperature_celsius": 0}])
@example(docs=[{"inlet_temperature_celsius": 2e9, "gpus": [{"throttle_reasons": "hw_thermal"},
                                                          {"throttle_reasons": [["hw_thermal"], "sw_thermal"]},
                                                          {"temperature_celsius": True, "slowdown_temperature_celsius": 90}]}])
def test_the_database_sums_up_each_document_as_node_thermal_does(join_node, docs):
    now = timezone.now()
    names = [f"gpu{i:02d}" for i in range(4)]
    for name in names:  # the same four nodes in every example; the ones it gives no document have none
        if not Node.objects.filter(name=name).exists():
            join_node(name, rack="r1")
    Node.objects.update(sensors={}, sensors_at=None)
    for name, doc in zip(names, docs, strict=False):
        stored = Value(None, JSONField()) if doc is None else doc  # JSON's null, not SQL's
        Node.objects.filter(name=name).update(sensors=stored, sensors_at=now)
    found = _node_sensors()
    domains = found[0].domains  # every node is in rack r1: the same domains
    expected = [node_thermal(domains, doc, now.timestamp()) for doc in docs]
    assert sorted(map(repr, found)) == sorted(map(repr, expected))

def test_a_node_with_no_sensors_yet_is_left_out_and_a_thermal_gpu_is_counted(join_node):
    # On either database: PostgreSQL's summary, SQLite's documents summed up in Python.
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1")
    Node.objects.filter(name="gpu01").update(sensors_at=None)
    doc = {"inlet_temperature_celsius": 31.5, "gpus": [
        {"temperature_celsius": 80, "slowdown_temperature_celsius": 89, "throttle_reasons": ["sw_thermal"]},
        {"temperature_celsius": 84.5, "slowdown_temperature_celsius": 87, "throttle_reasons": ["sw_power_cap"]},
        {"temperature_celsius": 70, "throttle_reasons": []},
    ]}
    Node.objects.filter(name="gpu02").update(sensors=doc)
    (found,) = _node_sensors()
    assert (found.inlet, found.cards, found.throttling, found.margin) == (31.5, 3, 1, 2.5)
    assert {str(d) for d in found.domains} >= {"rack:r1"}


def test_a_figure_no_double_can_hold_is_no_reading_and_stops_nothing(join_node):
    # Written by hand, not by an agent (whose figures are bounded): PostgreSQL cannot cast 1e-400 to a
    # double, and the summary leaves it out rather than fail the round.
    join_node("gpu01", rack="r1")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agents_node SET sensors = %s WHERE name = 'gpu01'",
            ['{"inlet_temperature_celsius": 31, "gpus": [{"temperature_celsius": 1e-400, '
             '"slowdown_temperature_celsius": 87}]}'],
        )
    (found,) = _node_sensors()
    assert found.inlet == 31 and found.cards == 1
    if connection.vendor == "postgresql":
        assert found.margin is None
    conditions_evaluate()
    assert SourceStatus.objects.get(name="agents").up


def test_an_agents_source_the_database_refuses_is_down_and_the_round_goes_on(join_node, monkeypatch):
    from django.db import DatabaseError

    from facility import evaluation

    join_node("gpu01", rack="r1-01")
    facility_apply(text="facility:\n  sources: {agents: true, static: {rack:r1-01: {inlet_temp_c: 35}}}\n")

    def refused():
        raise DatabaseError("canceling statement due to statement timeout")

    monkeypatch.setattr(evaluation, "_node_sensors", refused)
    conditions_evaluate()
    status = SourceStatus.objects.get(name="agents")
    assert not status.up and status.last_error == "DatabaseError: canceling statement due to statement timeout"
    # The static source's reading was judged all the same.
    row = DomainCondition.objects.get(domain="rack:r1-01")
    assert row.readings["inlet_temp_c"]["value"] == 35
