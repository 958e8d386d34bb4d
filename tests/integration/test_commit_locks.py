"""The guarded commit's locked read on PostgreSQL: every member of a budgeted domain is locked, and a draw a
heartbeat raised, or a member relabelled into the domain, meanwhile is in the sums.

The members are locked by a statement of their own, and the read that sums their draws takes its
snapshot once they are: a heartbeat raising a member's measured draw, or a relabel moving it, either
waits for the placement's commit, or committed before the lock was granted and is counted.
"""

from __future__ import annotations

import threading
from unittest import mock

import psycopg
import pytest
from django.db import OperationalError, connection, connections, transaction
from django.utils import timezone

from agents import services
from agents.models import Node, NodeDomain
from agents.services import heartbeat_record, labels_set
from agents.simulator.cluster import heartbeat_for
from facility.services import budget_set, settings_set
from placement import commit, snapshot
from tests.conftest import node_spec

pytestmark = pytest.mark.django_db(transaction=True)


def join_measuring(name: str, rack: str, watts: float) -> None:
    beat = heartbeat_for(node_spec(name, rack=rack, gpus=8))
    beat["sensors"] = {"gpus": [{"index": i, "power_watts": watts / 8} for i in range(8)]}
    for _ in range(2):  # two readings: the measured peak
        heartbeat_record(node_name=name, heartbeat=beat)


def other_connection() -> psycopg.Connection:
    """A second session on the test database, as a heartbeat's would be."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params)


def domain_use(names: list[str], out: dict, domain: str = "rack:r1", touched: tuple = ("rack:r1",)) -> None:
    """A domain's use as the commit's locked read sums it, read in a thread of its own (its own connection)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            _, _, _, use, _ = commit._locked_state(
                cursor, names, list(touched), snapshot.facility_view(), timezone.now()
            )
        out["use"] = use[domain]
    finally:
        connections.close_all()


@pytest.fixture
def rack():
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's (SQLite serialises its writers)")
    settings_set(margin=0.0, gpu_watts=700, cpu_core_watts=None, node_watts=0)
    join_measuring("a", "r1", 1000)
    join_measuring("b", "r1", 1000)
    budget_set(domain="rack:r1", cap_watts=20000)


def test_a_members_draw_raised_before_the_lock_is_granted_is_in_the_sums(rack):
    with other_connection() as beat:
        # The heartbeat holds b's row (not the chosen node: a member of its rack) with a raised draw.
        beat.execute("UPDATE agents_node SET measured_peak_watts = 9000, sensors_at = now() WHERE name = 'b'")
        out: dict = {}
        reader = threading.Thread(target=domain_use, args=(["a"], out))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive(), "the locked read must wait for the member's row"
        beat.commit()
        reader.join(10)
    assert out["use"] == 1000 + 9000  # the draw committed while the read waited, not the snapshot's 1000


def test_a_heartbeat_raising_a_members_draw_waits_for_the_commit(rack):
    locked = threading.Event()
    release = threading.Event()

    def place() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                commit._locked_state(cursor, ["a"], ["rack:r1"], snapshot.facility_view(), timezone.now())
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    placer = threading.Thread(target=place)
    placer.start()
    try:
        assert locked.wait(10)
        with other_connection() as beat:
            beat.execute("SET lock_timeout = '300ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                beat.execute("UPDATE agents_node SET measured_peak_watts = 9000 WHERE name = 'b'")
    finally:
        release.set()
        placer.join(10)


def test_a_member_relabelled_into_the_domain_while_the_lock_waits_is_in_the_sums(rack):
    """A node moved to its rack's other PDU while the commit waited for its row (a member of the rack) is
    counted in that PDU: the read's snapshot is taken once the nodes are locked. (Read in the statement
    that locked them, its domains were the snapshot's from before the wait, and the PDU went past its
    limit at the commit: found by the rehearsal's auditor.)"""
    budget_set(domain="pdu:r1-b", cap_watts=20000)
    Node.objects.filter(name="a").update(labels={**Node.objects.get(name="a").labels, "llmgw.io/pdu": "r1-b"})
    a, b = Node.objects.get(name="a"), Node.objects.get(name="b")
    NodeDomain.objects.create(node=a, domain="pdu:r1-b", level="pdu")
    with other_connection() as relabel:
        # b moves to PDU r1-b (as labels_set writes it: the node row locked, its domain rows written).
        relabel.execute("UPDATE agents_node SET labels = labels || '{\"llmgw.io/pdu\": \"r1-b\"}' WHERE name = 'b'")
        relabel.execute(
            "INSERT INTO agents_nodedomain (node_id, domain, level) VALUES (%s, 'pdu:r1-b', 'pdu')", [b.pk]
        )
        out: dict = {}
        reader = threading.Thread(target=domain_use, args=(["a"], out, "pdu:r1-b", ("pdu:r1-b", "rack:r1")))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive(), "the commit must wait for the rack member's row"
        relabel.commit()
        reader.join(10)
    assert out["use"] == 1000 + 1000  # a, and b as it moved in while the lock waited


def holding_the_commits_locks(names: list[str], touched: list[str], locked: threading.Event, release: threading.Event):
    """A thread that takes a commit's locks (budgets, then nodes) and its read, and holds them until released."""

    def place() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                commit._locked_state(cursor, names, touched, snapshot.facility_view(), timezone.now())
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    return threading.Thread(target=place)


def test_a_node_joining_a_budgeted_domain_from_outside_the_commits_locks_waits_for_it(rack):
    """c, in another rack, is neither a member nor chosen: the commit does not lock its row. Its joining
    the PDU the commit sums waits for the commit (the budget's share lock), so it is never left out of
    a sum the commit relied on."""
    budget_set(domain="pdu:r1-b", cap_watts=20000)
    join_measuring("c", "r2", 1000)
    c = Node.objects.get(name="c")
    locked, release = threading.Event(), threading.Event()
    placer = holding_the_commits_locks(["a"], ["pdu:r1-b", "rack:r1"], locked, release)
    placer.start()
    try:
        assert locked.wait(10)
        with other_connection() as relabel:
            relabel.execute("SET lock_timeout = '300ms'")
            relabel.execute("SELECT 1 FROM agents_node WHERE name = 'c' FOR UPDATE")  # not the commit's
            with pytest.raises(psycopg.errors.LockNotAvailable):
                relabel.execute(
                    "INSERT INTO agents_nodedomain (node_id, domain, level) VALUES (%s, 'pdu:r1-b', 'pdu')", [c.pk]
                )
    finally:
        release.set()
        placer.join(10)


@pytest.mark.parametrize("how", ["labels_set", "heartbeat"])
def test_a_relabel_locks_the_budgets_it_joins_before_the_node(rack, how):
    """In a commit's order: while a commit holds the PDU's budget, a relabel of c into it waits without
    holding c's row (a commit placing onto c, or summing its rack, would otherwise wait on the relabel
    as the relabel waits on it: a deadlock), then moves c."""
    budget_set(domain="pdu:r1-b", cap_watts=20000)
    join_measuring("c", "r2", 1000)

    def relabel() -> None:
        try:
            if how == "labels_set":
                labels_set(node_name="c", changes={"llmgw.io/pdu": "r1-b"})
            else:
                heartbeat_record(node_name="c", heartbeat=heartbeat_for(node_spec("c", rack="r2", pdu="r1-b")))
        finally:
            connections.close_all()

    with other_connection() as placing:
        placing.execute("SELECT 1 FROM facility_budget WHERE domain = 'pdu:r1-b' FOR UPDATE")
        mover = threading.Thread(target=relabel)
        mover.start()
        mover.join(0.5)
        assert mover.is_alive(), "the relabel must wait for the budget the commit holds"
        with other_connection() as probe:
            probe.execute("SET lock_timeout = '300ms'")
            probe.execute("SELECT 1 FROM agents_node WHERE name = 'c' FOR UPDATE NOWAIT")  # c is not held
            # Nor is its store label written yet: an import holding the budget would wait on that row.
            probe.execute(
                "INSERT INTO agents_storelabel (node_name, key, value, set_by, updated_at) "
                "VALUES ('c', 'llmgw.io/pdu', 'r1-a', '', now())"
            )
            probe.rollback()
        placing.commit()
        mover.join(10)
    assert not mover.is_alive()
    assert "pdu:r1-b" in set(NodeDomain.objects.filter(node__name="c").values_list("domain", flat=True))


def test_a_budget_made_for_a_domain_a_node_is_joining_waits_for_the_join(rack):
    """No budget row yet, none to lock: the join holds the domain's advisory lock, shared, and making the
    budget takes it exclusive. Made first, a commit locking it could sum the domain without the node
    still joining, and both commit."""
    join_measuring("c", "r2", 1000)
    c = Node.objects.get(name="c")
    with other_connection() as relabel:
        relabel.execute("INSERT INTO agents_nodedomain (node_id, domain, level) VALUES (%s, 'pdu:r9-z', 'pdu')", [c.pk])
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '300ms'")
            with pytest.raises(OperationalError, match="lock timeout"):
                budget_set(domain="pdu:r9-z", cap_watts=20000)
        relabel.commit()
    budget_set(domain="pdu:r9-z", cap_watts=20000)  # once the node is in: counted by the next commit
    with transaction.atomic(), connection.cursor() as cursor:
        _, _, _, use, _ = commit._locked_state(cursor, ["a"], ["pdu:r9-z"], snapshot.facility_view(), timezone.now())
    assert use["pdu:r9-z"] == 1000


def test_a_heartbeat_whose_labels_join_more_once_its_node_is_locked_locks_that_budget_first(rack):
    """The heartbeat reads, unlocked, which domains it joins: c's PDU is the store's (r2-a), so none.
    Before it locks c, the store's PDU is removed: the agent's, r1-b, now counts. Once c is locked the
    heartbeat finds the join, lets go of c (its savepoint rolled back) and waits for the PDU's budget a
    commit holds; the commit then locks c (a member it sums) and goes on. Holding c while it waited, the
    heartbeat and the commit would each wait on the other."""
    budget_set(domain="pdu:r1-b", cap_watts=20000)
    join_measuring("c", "r2", 1000)
    labels_set(node_name="c", changes={"llmgw.io/pdu": "r2-a"})
    joining = services._domains_joining
    held: dict = {}

    def meanwhile(*args, **kwargs):
        found = joining(*args, **kwargs)
        if threading.current_thread().name == "heartbeat" and "placing" not in held:
            remover = threading.Thread(target=store_pdu_removed)
            remover.start()
            remover.join(10)
            held["placing"] = placing = other_connection()
            placing.execute("SELECT 1 FROM facility_budget WHERE domain = 'pdu:r1-b' FOR UPDATE")
            held["ready"].set()
        return found

    def store_pdu_removed() -> None:
        try:
            labels_set(node_name="c", changes={"llmgw.io/pdu": None})
        finally:
            connections.close_all()

    def beat() -> None:
        try:
            heartbeat_record(node_name="c", heartbeat=heartbeat_for(node_spec("c", rack="r2", pdu="r1-b")))
        finally:
            connections.close_all()

    held["ready"] = threading.Event()
    with mock.patch.object(services, "_domains_joining", meanwhile):
        beating = threading.Thread(target=beat, name="heartbeat")
        beating.start()
        try:
            assert held["ready"].wait(10)
            beating.join(0.5)
            assert beating.is_alive(), "the heartbeat must wait for the budget the commit holds"
            placing = held["placing"]
            placing.execute("SET lock_timeout = '300ms'")
            placing.execute("SELECT 1 FROM agents_node WHERE name = 'c' FOR UPDATE")  # not held by the heartbeat
            placing.commit()
        finally:
            if "placing" in held:
                held["placing"].close()
            beating.join(10)
    assert not beating.is_alive()
    assert "pdu:r1-b" in set(NodeDomain.objects.filter(node__name="c").values_list("domain", flat=True))
