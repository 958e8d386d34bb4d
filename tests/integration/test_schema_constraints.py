"""The migrated database holds every constraint and index the models declare.

Django's migration state can say a constraint exists while the database lacks it: 0002 of placement
took replaces' plain index away and, on PostgreSQL, the partial unique index "one replacement at a time"
went with it, while the state kept it. These read the database itself.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from agents.models import GPU, Node
from placement.models import GpuBooking, Model, Replica, Shard

pytestmark = pytest.mark.django_db


def database_names() -> set[str]:
    """Every constraint and index name the database has, by introspection (either backend)."""
    with connection.cursor() as cursor:
        tables = connection.introspection.table_names(cursor)
        return {name for table in tables for name in connection.introspection.get_constraints(cursor, table)}


def test_every_declared_constraint_and_index_is_in_the_database() -> None:
    have = database_names()
    missing = [
        f"{model._meta.label}: {item.name}"
        for model in apps.get_models()
        for item in (*model._meta.constraints, *model._meta.indexes)
        if item.name not in have
    ]
    assert missing == []


def test_a_replica_gets_one_replacement_at_a_time_from_the_database_itself() -> None:
    model = Model.objects.create(name="m", replicas=1, gpus=1)
    original = Replica.objects.create(model=model, ordinal=1)
    Replica.objects.create(model=model, ordinal=2, replaces=original)
    with pytest.raises(IntegrityError), transaction.atomic():
        Replica.objects.create(model=model, ordinal=3, replaces=original)
    # Replacements of other replicas, and replicas that replace none, are not held back.
    other = Replica.objects.create(model=model, ordinal=4)
    Replica.objects.create(model=model, ordinal=5, replaces=other)
    Replica.objects.create(model=model, ordinal=6)
    assert Replica.objects.filter(replaces__isnull=True).count() == 3


def database_triggers(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal", [table])
        return {name for (name,) in cursor.fetchall()}


def _needs_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL: run it with DATABASE_URL=postgres://… (make test does)")


@pytest.mark.postgres
def test_a_gpu_booking_names_its_shards_own_node() -> None:
    """PostgreSQL holds a booking's (shard, node) to the shard's (id, node), checked once a statement
    (migration 0007): a booking naming another node, or no shard, is refused with the key's error."""
    _needs_postgresql()
    assert {"booking_shard_node_insert", "booking_shard_node_update"} <= database_triggers("placement_gpubooking")
    assert {"booking_shard_node_delete", "booking_shard_node_key"} <= database_triggers("placement_shard")
    model = Model.objects.create(name="m", replicas=1, gpus=1)
    replica = Replica.objects.create(model=model, ordinal=1)
    here, there = (Node.objects.create(name=name) for name in ("here", "there"))
    shard = Shard.objects.create(replica=replica, node=here, gpu_indices=[0])
    GpuBooking.objects.create(shard=shard, node=here, index=0)
    for wrong in ({"shard_id": shard.pk, "node": there}, {"shard_id": shard.pk + 1000, "node": here}):
        with pytest.raises(IntegrityError, match='violates foreign key constraint "booking_shard_node"'):
            with transaction.atomic():
                GpuBooking.objects.create(index=1, **wrong)
    # Many rows in one statement, one of them wrong: the statement is refused whole.
    with pytest.raises(IntegrityError, match=rf"Key \(shard_id, node_id\)=\({shard.pk}, {there.pk}\)"):
        with transaction.atomic():
            GpuBooking.objects.bulk_create(
                [GpuBooking(shard=shard, node=here, index=2), GpuBooking(shard=shard, node=there, index=3)]
            )
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuBooking.objects.filter(index=0).update(node=there)
    assert list(GpuBooking.objects.values_list("node__name", "index")) == [("here", 0)]


@pytest.mark.postgres
def test_a_booked_shard_keeps_its_key_until_its_bookings_go() -> None:
    """A shard with bookings cannot be deleted, nor moved to another node, under them; once they are gone
    it can, and a shard's other columns change freely."""
    _needs_postgresql()
    model = Model.objects.create(name="m", replicas=1, gpus=1)
    replica = Replica.objects.create(model=model, ordinal=1)
    here, there = (Node.objects.create(name=name) for name in ("here", "there"))
    shard = Shard.objects.create(replica=replica, node=here, gpu_indices=[0])
    GpuBooking.objects.create(shard=shard, node=here, index=0)
    with pytest.raises(IntegrityError, match=rf"Key \(id\)=\({shard.pk}\) is still referenced"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM placement_shard WHERE id = %s", [shard.pk])
    with pytest.raises(IntegrityError, match="still referenced"), transaction.atomic():
        Shard.objects.filter(pk=shard.pk).update(node=there)
    assert Shard.objects.filter(pk=shard.pk).update(restarts=2, node=here) == 1  # its key as it was
    shard.delete()  # Django deletes the bookings first (their cascade), then the shard
    assert not GpuBooking.objects.exists() and not Shard.objects.exists()


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _waits_for_a_lock(watcher, pid: int) -> None:
    """Until the backend ``pid`` waits for a row lock (at most 10 s)."""
    for _ in range(1000):
        row = watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.01)
    pytest.fail(f"backend {pid} never waited for a lock")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_booking_and_its_shards_deletion_racing_leave_no_booking_without_its_shard() -> None:
    """The check locks the shards its bookings name, as a foreign key's does: a booking written while
    another transaction deletes its shard waits for it and is then refused; a shard deleted while another
    transaction books it waits, then sees the booking and is refused. Either way no booking outlives its
    shard (unlocked, each would pass on what it could see, and both commit)."""
    _needs_postgresql()
    model = Model.objects.create(name="m", replicas=2, gpus=1)
    here, there = (Node.objects.create(name=name) for name in ("here", "there"))
    first, second = (
        Shard.objects.create(replica=Replica.objects.create(model=model, ordinal=i), node=here, gpu_indices=[0])
        for i in (1, 2)
    )
    book = "INSERT INTO placement_gpubooking (shard_id, node_id, index) VALUES (%s, %s, %s)"
    with (
        psycopg.connect(_database_url()) as deleter,
        psycopg.connect(_database_url()) as booker,
        psycopg.connect(_database_url(), autocommit=True) as watcher,
        ThreadPoolExecutor(1) as pool,
    ):
        def waits_then_refused(first, then, sql: str, params: list, match: str) -> None:
            """``first`` has run its statement, uncommitted; ``then``'s waits for it, and once ``first``
            commits, is refused."""
            later = pool.submit(then.execute, sql, params)
            _waits_for_a_lock(watcher, then.info.backend_pid)
            first.commit()
            with pytest.raises(psycopg.errors.ForeignKeyViolation, match=match):
                later.result(timeout=10)
            then.rollback()

        # The deletion first: the booking waits for it, then finds no shard.
        deleter.execute("DELETE FROM placement_shard WHERE id = %s", [first.pk])
        waits_then_refused(deleter, booker, book, [first.pk, here.pk, 0], "booking_shard_node")
        # The booking first: the deletion waits for it, then finds the booking.
        booker.execute(book, [second.pk, here.pk, 0])
        waits_then_refused(booker, deleter, "DELETE FROM placement_shard WHERE id = %s", [second.pk], "still referenced")
        # A move of the booked shard to another node, while its booking is being written: the same.
        booker.execute(book, [second.pk, here.pk, 1])
        waits_then_refused(
            booker, deleter, "UPDATE placement_shard SET node_id = %s WHERE id = %s", [there.pk, second.pk],
            "still referenced",
        )
    assert list(Shard.objects.values_list("pk", "node__name")) == [(second.pk, "here")]
    assert sorted(GpuBooking.objects.values_list("shard_id", "index")) == [(second.pk, 0), (second.pk, 1)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_shards_are_deleted_under_read_committed_and_truncated_with_their_bookings() -> None:
    """Under a snapshot kept for the transaction the check would miss a booking committed since: a shard
    is deleted or moved under READ COMMITTED only. A truncation leaves no booking without its shard."""
    _needs_postgresql()
    model = Model.objects.create(name="m", replicas=1, gpus=1)
    here = Node.objects.create(name="here")
    shard = Shard.objects.create(replica=Replica.objects.create(model=model, ordinal=1), node=here, gpu_indices=[0])
    with psycopg.connect(_database_url()) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="under READ COMMITTED only"):
            conn.execute("DELETE FROM placement_shard WHERE id = %s", [shard.pk])
        conn.rollback()
        GpuBooking.objects.create(shard=shard, node=here, index=0)
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="cannot truncate"):
            conn.execute("TRUNCATE placement_shard CASCADE")
        conn.rollback()
        conn.execute("TRUNCATE placement_shard, placement_gpubooking")  # both: as Django's flush does
        conn.rollback()
    assert Shard.objects.count() == 1 and GpuBooking.objects.count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_freeing_and_placing_run_read_committed_whatever_the_servers_default() -> None:
    """A server whose default is REPEATABLE READ (a DBA's choice) changes nothing: Django's transactions
    and the commit's own BEGINs say READ COMMITTED, so freeing a replica deletes its shard (the database
    refuses that under a kept snapshot) and a placement commits."""
    from placement import snapshot
    from placement.commit import replica_place
    from placement.index import PlacementIndex
    from placement.services import replicas_free

    _needs_postgresql()
    model = Model.objects.create(name="m", replicas=2, gpus=1)
    here = Node.objects.create(name="here", last_heartbeat_at=timezone.now(), heartbeat_interval_seconds=3600)
    GPU.objects.create(node=here, index=0, model="H100")
    GPU.objects.create(node=here, index=1, model="H100")
    placed = Replica.objects.create(model=model, ordinal=1)
    shard = Shard.objects.create(replica=placed, node=here, gpu_indices=[0])
    GpuBooking.objects.create(shard=shard, node=here, index=0)
    pending = Replica.objects.create(model=model, ordinal=2)
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_isolation = 'repeatable read'")
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            assert cursor.fetchone()[0] == "read committed"
        assert replicas_free(replica_ids=[placed.pk]) == 1
        index = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
        [candidate] = snapshot.pending_replicas(model)
        outcome = replica_place(replica=candidate, request=snapshot.replica_request(model), index=index)
        assert outcome.plan is not None, outcome.reason
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET default_transaction_isolation")
    assert list(Shard.objects.values_list("replica_id", "node__name")) == [(pending.pk, "here")]
    assert GpuBooking.objects.count() == 1
