"""A shed replica's replacement takes its ordinal under the model's lock, as reconcile's scaling does: a
reconcile scaling the model up meanwhile never gets the same ordinal (PostgreSQL, two connections)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from facility.services import facility_apply
from placement.models import Model, Replica, ReplicaState
from placement.shedding import shed_run
from tests.integration.test_shedding import SHEDDING, hot_rack_with_three_classes

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_shed_replacement_waits_for_a_scaling_reconcile_and_takes_the_next_ordinal():
    hot_rack_with_three_classes()
    facility_apply(text=SHEDDING)
    t0 = timezone.now()
    assert shed_run(now=t0) == []
    bat = Model.objects.get(name="bat")
    holding, release = threading.Event(), threading.Event()

    def scaling():  # what replicas_scale does: the model's lock, then the next ordinal
        try:
            with transaction.atomic():
                Model.objects.select_for_update().filter(pk=bat.pk).exists()
                Replica.objects.create(model=bat, ordinal=2, state=ReplicaState.PENDING)
                holding.set()
                release.wait(60)
        finally:
            connections.close_all()

    done: list = []

    def shedding():
        try:
            done.append(shed_run(now=t0 + timedelta(minutes=10)))
        except Exception as exc:
            done.append(exc)
        finally:
            connections.close_all()

    scaler = threading.Thread(target=scaling)
    scaler.start()
    assert holding.wait(60)
    shedder = threading.Thread(target=shedding)
    shedder.start()
    for _ in range(600):  # until the shed waits on the scaling's lock (a bound, not a measure)
        if waiting_on_a_lock():
            break
        time.sleep(0.05)
    release.set()
    scaler.join(60)
    shedder.join(60)
    [moves] = done
    assert not isinstance(moves, Exception), moves
    assert [(m["action"], m["replica"]) for m in moves] == [("move", "bat#1")]
    assert sorted(Replica.objects.filter(model=bat).values_list("ordinal", "replaces__ordinal")) == [
        (1, None), (2, None), (3, 1),
    ]
