"""A real server and a real browser: `llmgw serve` (Daphne, in-memory channel layer) in a subprocess on the
test database, and Debian's Chromium driven by Playwright's sync API.

Tests write their data through the services with `transactional_db`, so the server sees it committed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "browser"
PASSWORD = "browser-pass-9"
# Each server's log by its base URL, for a test that reads what the server logged.
SERVER_LOGS: dict[str, Path] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url() -> str:
    """The URL of the test database pytest-django made, for the server subprocess."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql"):
        pytest.fail("the browser tests share their database with a server process: run them on PostgreSQL "
                    "(DATABASE_URL=postgres://postgres@127.0.0.1:5432/llmgw)")
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """`llmgw serve` on a free port against the test database; its base URL."""
    yield from serve()


def redis_url() -> str:
    return os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(scope="module")
def redis_server(django_db_setup, django_db_blocker):
    """`llmgw serve` with REDIS_URL: live updates reach it from other processes (ctl, the tests), as in
    production. Nothing reconciles in it (no worker): the tests drive placement themselves."""
    yield from serve({"REDIS_URL": redis_url()})


@pytest.fixture
def redis_layer(settings):
    """This process sends its live updates through Redis, where the redis_server listens."""
    from channels.layers import channel_layers

    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [redis_url()]}}
    }
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def serve(extra_env: dict[str, str] | None = None):
    port = free_port()
    llmgw = shutil.which("llmgw", path=str(Path(sys.executable).parent)) or "llmgw"
    data_dir = tempfile.mkdtemp(prefix="llmgw-browser-")
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "LLMGW_DATA_DIR": data_dir,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
        # The tests drive reconciles and condition rounds themselves: the embedded server's own round
        # every 15 s would judge conditions and place replicas in the middle of one, now and then.
        "LLMGW_RECONCILE_INTERVAL": "86400",
    }
    env.pop("REDIS_URL", None)
    env.pop("LLMGW_CONFIG", None)
    env.update(extra_env or {})
    log = open(Path(data_dir) / "server.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen([llmgw, "serve", f"127.0.0.1:{port}"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    SERVER_LOGS[base] = Path(data_dir) / "server.log"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/login/", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.close()
            pytest.fail(f"llmgw serve did not start: {(Path(data_dir) / 'server.log').read_text()[-3000:]}")
        time.sleep(0.2)
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def browser(server):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (make test installs it)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread; the tests' own database writes
    # (through the services) are plain sync code, so Django's async guard is lifted while it runs.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def operator(transactional_db, make_user):
    """An operator who logs in with a password."""
    user, _ = make_user("facility", "operator")
    user.set_password(PASSWORD)
    user.save()
    return user


@pytest.fixture
def page(browser, server, operator, request):
    """A fresh browser page, logged in as the operator; its screenshot is saved when the test ends. Any
    error in the browser's console (an htmx error, a failed script) fails the test."""
    yield from open_page(browser, server, operator, request)


@pytest.fixture
def redis_page(browser, redis_server, operator, request):
    """As `page`, on the server that hears live updates through Redis."""
    yield from open_page(browser, redis_server, operator, request)


def open_page(browser, server, operator, request, **context_options):
    context = browser.new_context(base_url=server, viewport={"width": 1440, "height": 900}, **context_options)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.set_default_timeout(10_000)
    tab.goto("/login/")
    tab.fill("input[name=username]", operator.username)
    tab.fill("input[name=password]", PASSWORD)
    tab.click("button[type=submit]")
    tab.wait_for_url("**/nodes/")
    yield tab
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    # A form refused with its errors answers 422 by design (shown next to the field); Chromium logs every
    # 4xx as a failed load. Anything else is an error of the page.
    errors = [e for e in errors if "status of 422" not in e]
    assert not errors, f"errors in the browser's console: {errors}"
