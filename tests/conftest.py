"""Fixtures shared by the Django tests: API clients per role, node tokens, heartbeats."""

from __future__ import annotations

import os
import tempfile

import pytest

# `llmgw demo` records where its data is in the user's state directory (llmgw.whereabouts), which ctl
# then reads: the demos the tests start record theirs in a directory of the run's own, never over the
# developer's, and no ctl of a test finds the developer's demo.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="llmgw-tests-state-")


def _data_directory_of_this_run() -> None:
    """Each run its own data directory, whatever the environment says (tests/settings.py sets it before
    the settings are read). Where the settings were named otherwise (DJANGO_SETTINGS_MODULE exported as
    llmgw.settings), they are pointed at one here, before any test writes node tokens."""
    from pathlib import Path

    from django.conf import settings

    if Path(os.environ.get("LLMGW_DATA_DIR", "var")).name.startswith("llmgw-tests-data-"):
        return
    data_dir = tempfile.mkdtemp(prefix="llmgw-tests-data-")
    os.environ["LLMGW_DATA_DIR"] = data_dir
    if settings.configured:
        settings.DATA_DIR = Path(data_dir)
        settings.STATIC_ROOT = Path(data_dir) / "static"


_data_directory_of_this_run()


def _redis_database_of_this_worker() -> None:
    """Under pytest-xdist each worker process flushes and fills a Redis database of its own (15, 14, …
    counting down from the one LLMGW_TEST_REDIS_URL names), as pytest-django gives each its own test
    database (test_llmgw_gw0, …): one worker's flush never empties another's queue."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    from urllib.parse import urlparse, urlunparse

    url = urlparse(os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
    base = int(url.path.strip("/") or 0)
    db = base - int(worker[2:])
    if db < 0:
        raise RuntimeError(f"too many test workers for Redis databases 0–{base} ({worker}): run fewer (-n)")
    os.environ["LLMGW_TEST_REDIS_URL"] = urlunparse(url._replace(path=f"/{db}"))


_redis_database_of_this_worker()


def pytest_configure(config) -> None:
    """This process waits longest before it looks for a deadlock (10 s, PostgreSQL's default is 1 s).

    A test that shares its database with a server subprocess (the browser tests, live servers) empties
    the tables at teardown while the server's in-process work may still be writing; should the two lock
    in opposite orders, the server's side, which looks first, is the one aborted (its next round writes
    again), never this process's teardown."""
    from django.conf import settings

    if settings.configured and settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        settings.DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c deadlock_timeout=10s -c synchronous_commit=off"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, and before it is dropped, the connections to it that threads of the
    run's own left open ended: PostgreSQL's DROP DATABASE would wait 5 s for them, then fail."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            # Each waited for (up to 5 s), so that the drop after it finds none.
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def _flush_by_delete() -> None:
    """A transactional test's flush (after each) as DELETEs, not TRUNCATE: PostgreSQL's TRUNCATE makes each
    table's files anew, costly for the few rows a test leaves; its foreign keys are checked at
    commit (Django makes them deferred); placement_gpubooking goes before placement_shard, whose trigger
    refuses a shard deleted while a booking names it."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"DELETE FROM {self.quote_name(table)};" for table in sorted(tables)]

    DatabaseOperations.sql_flush = sql_flush


_flush_by_delete()


# The modules whose tests take longest (whole servers, workers, browsers, fuzzing): marked `slow`, so
# `make test-quick` leaves them out and `make test` runs them after the quick ones.
SLOW_MODULES = frozenset({
    "test_schema_fuzz", "test_rehearsal", "test_drain_workers", "test_embedded_default", "test_worker",
    "test_concurrency", "test_agent_process", "test_agent_end_to_end", "test_ctl_remote", "test_dependencies_down",
    "test_bounded_inputs", "test_deploy_units", "test_docs_examples", "test_readme_examples", "test_lock_order",
    "test_netbox_sync", "test_demo_once", "test_prometheus_source", "test_ctl_whereabouts",
})


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if module in SLOW_MODULES or "/browser/" in str(item.fspath):
            item.add_marker(pytest.mark.slow)
    # The quick ones first: a failure shows in minutes, not at the end.
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)


@pytest.fixture(autouse=True)
def _wrong_tokens_not_counted():
    """Wrong API tokens are counted per address (429 after LLMGW_TOKEN_FAILURES): every test's client is
    127.0.0.1, and the suite's refusals added up would slow the tests after them. The test of the count
    turns it on."""
    try:
        from django.conf import settings

        before = settings.LLMGW_TOKEN_FAILURES
    except Exception:  # pure unit tests run without Django
        yield
        return
    settings.LLMGW_TOKEN_FAILURES = 0
    yield
    settings.LLMGW_TOKEN_FAILURES = before


@pytest.fixture
def make_user(db):
    from llmgw.users import token_create

    def make(username: str = "op", role: str = "operator"):
        from django.contrib.auth import get_user_model

        key = token_create(username=username, role=role)
        return get_user_model().objects.get(username=username), key

    return make


@pytest.fixture
def api(make_user):
    """An API client with an operator's token."""
    from rest_framework.test import APIClient

    _, key = make_user("operator1", "operator")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def viewer_api(make_user):
    from rest_framework.test import APIClient

    _, key = make_user("viewer1", "viewer")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def anon_api(db):
    from rest_framework.test import APIClient

    return APIClient()


def node_spec(name: str, *, rack: str | None = None, pdu: str | None = None, gpus: int = 8, **extra) -> dict:
    labels = {}
    if rack:
        labels["llmgw.io/rack"] = rack
    if pdu:
        labels["llmgw.io/pdu"] = pdu
    labels.update(extra.pop("labels", {}))
    return {
        "name": name,
        "gpus": gpus,
        "gpu_model": "H100-SXM5-80GB",
        "gpu_memory_gib": 80,
        "gpu_power_limit_watts": 700,
        "cpu_cores": 96,
        "memory_gib": 2048,
        "fabric": extra.pop("fabric", "ib-a"),
        "labels": labels,
        **extra,
    }


@pytest.fixture
def join_node(db):
    """Record a node's first heartbeat through the service (what its agent's first POST does)."""
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for

    def join(name: str, **kw):
        return heartbeat_record(node_name=name, heartbeat=heartbeat_for(node_spec(name, **kw)))

    return join


@pytest.fixture
def node_client(db):
    """An API client holding a node's token."""
    from rest_framework.test import APIClient

    from agents.services import node_token_create

    def make(node_name: str):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {node_token_create(node_name=node_name)}")
        return client

    return make


@pytest.fixture(autouse=True)
def _heartbeat_readings_written_at_once():
    """The heartbeat fast path writes readings in a timer thread; tests want them written before the answer."""
    try:
        from agents import readings
    except Exception:  # pure unit tests run without Django
        yield
        return
    readings.FLUSH_SECONDS = 0
    readings.forget()
    from agents.models import forget_measured_window

    forget_measured_window()  # a rolled-back settings row from an earlier test is not cached
    readings.forget_draws()  # nor its draws, which judge whether readings are plausible
    readings.invalidate_assignments()
    _forget_sensor_updates()
    yield
    readings.forget()


def _forget_sensor_updates() -> None:
    """Clear the console's once-a-second gathering of sensor updates (agents.events): a flush an earlier
    test armed on its own event loop, now closed, would otherwise swallow this test's first updates."""
    from agents import events

    with events._pending_lock:
        events._pending_sensors.clear()
        events._trailing_due = 0.0
        events._last_flush = 0.0


@pytest.fixture(autouse=True)
def _fresh_in_memory_channel_layer():
    """Each test gets an empty in-memory channel layer: a socket an earlier test left behind would hold
    a queue waiting on that test's closed event loop, and a group send to it would fail."""
    try:
        from channels.layers import channel_layers
    except Exception:  # pure unit tests run without Django's stack
        yield
        return
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def _no_cached_figures_from_an_earlier_test():
    """The Facility page's figures are kept in the process's cache by the facility's version: an earlier
    test's database, rolled back, may have left the same version with other readings."""
    try:
        from django.conf import settings

        if not settings.configured:
            raise RuntimeError("no settings")
        from django.core.cache import cache
    except Exception:  # pure unit tests run without Django
        yield
        return
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _no_observe_mode_counts_from_an_earlier_test():
    """The embedded default counts observe mode's would-be refusals in the process (/metrics reads
    them): an earlier test's placements in observe mode would show in this test's series."""
    try:
        from placement import explain
    except Exception:  # pure unit tests run without Django
        yield
        return
    explain._local_counts.clear()
    yield
    explain._local_counts.clear()


@pytest.fixture(autouse=True)
def _no_server_loop_from_an_earlier_test():
    """A live server's event loop, noted by a request of an earlier test in this process, still runs: a
    send from a plain thread would go to it (agents.events.server_loop), and a test reading the channel
    layer from its own loop would wait for a message delivered to another loop's queue. Likewise the
    layer's down-mark (a send that timed out in an earlier test, under load, or with Redis cut): while it
    holds, sends are dropped, and a test reading the channel would wait for ever."""
    try:
        from agents import events
    except Exception:  # pure unit tests run without Django
        yield
        return
    events._server_loop = None
    events._layer_down_until = 0.0
    yield
    events._server_loop = None
    events._layer_down_until = 0.0
