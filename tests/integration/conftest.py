"""Fixtures that start real processes: a Celery worker on Redis against the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LLMGW = str(Path(sys.executable).with_name("llmgw"))


def redis_url() -> str:
    return os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def test_database_url() -> str:
    """The URL of the database pytest-django made for this run, for processes the test starts."""
    from django.db import connection

    s = connection.settings_dict
    if not s["ENGINE"].endswith("postgresql"):
        pytest.fail("this test needs PostgreSQL: run it with DATABASE_URL=postgres://… (make test does)")
    user = s.get("USER") or "postgres"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


class Worker:
    """A real `llmgw worker` process on Redis; kill() is kill -9, start() a new one."""

    def __init__(self, env: dict[str, str], log_dir: Path, beat: bool = False):
        self.env = env
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.beat = beat

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"worker-{self.starts}.log", "w")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [LLMGW, "worker", "--concurrency", "1", "--pool", "solo", "-n", f"test{self.starts}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             *(["--beat", "--schedule", str(self.log_dir / f"beat-{self.starts}")] if self.beat else [])],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        path = self.log_dir / f"worker-{self.starts}.log"
        while time.monotonic() < deadline:
            if "ready." in path.read_text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {path.read_text()[-2000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"worker did not start: {path.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def celery_on_redis(settings):
    """Send tasks to Redis (not in-process) for this test, with a clean queue."""
    import redis

    from llmgw.celery import app

    url = redis_url()
    redis.Redis.from_url(url).flushdb()
    from django.conf import settings as django_settings

    # The app reads Django's CELERY_-prefixed settings, so overrides use those names too.
    old = {
        "CELERY_TASK_ALWAYS_EAGER": django_settings.CELERY_TASK_ALWAYS_EAGER,
        "CELERY_BROKER_URL": django_settings.CELERY_BROKER_URL,
    }
    app.conf.update(CELERY_TASK_ALWAYS_EAGER=False, CELERY_BROKER_URL=url)
    settings.CELERY_TASK_ALWAYS_EAGER = False
    _reset_connections(app)
    yield url
    app.conf.update(**old)
    _reset_connections(app)


def _reset_connections(app) -> None:
    """Drop the app's cached broker connections so the next send uses the broker configured now."""
    import kombu.pools

    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None
    kombu.pools.reset()


@pytest.fixture
def worker(celery_on_redis, tmp_path):
    """A real Celery worker process (with its beat: a reconcile every second) on the test database and Redis."""
    env = {k: v for k, v in os.environ.items() if k not in {"LLMGW_CONFIG"}}
    env.update(
        DATABASE_URL=test_database_url(),
        REDIS_URL=celery_on_redis,
        LLMGW_RECONCILE_INTERVAL="1",
    )
    w = Worker(env, tmp_path, beat=True)
    w.start()
    yield w
    w.stop()
