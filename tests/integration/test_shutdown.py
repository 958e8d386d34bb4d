"""SIGTERM stops `llmgw serve` in bounded time, its console sockets closed (1012, going away): even with a
socket's render stuck in the database (a lock held elsewhere), which once kept a stopped process alive for
as long as the lock lasted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psycopg
import pytest

from tests.integration.conftest import test_database_url as database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# A bound, not a measurement: systemd's TimeoutStopSec for the web unit.
STOP_BOUND_SECONDS = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path, client, django_user_model, settings):
    user = django_user_model.objects.create_superuser("root", "", "root-pass-9")
    client.force_login(user)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "LLMGW_CONFIG", "LLMGW_URL")}
    env.update(DATABASE_URL=database_url(), LLMGW_DATA_DIR=str(tmp_path), LLMGW_SHUTDOWN_SECONDS="3",
               ALLOWED_HOSTS="127.0.0.1", SECRET_KEY=settings.SECRET_KEY)
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "llmgw.cli", "serve", f"127.0.0.1:{port}"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
    headers = {"Cookie": f"sessionid={client.cookies['sessionid'].value}", "Origin": f"http://127.0.0.1:{port}"}
    yield proc, f"ws://127.0.0.1:{port}", headers
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_sigterm_stops_the_server_with_a_socket_whose_render_is_stuck(server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    proc, base, headers = server
    with connect(f"{base}/ws/facility/", additional_headers=headers) as ws:
        ws.send('{"filter": ""}')
        assert "socket-synced" in ws.recv(30)  # the first render began
        with psycopg.connect(database_url().replace("postgres://", "postgresql://")) as locker:
            # The render's tables locked by another session: the next render waits on the lock.
            locker.execute("LOCK TABLE agents_node, facility_facilitysettings IN ACCESS EXCLUSIVE MODE")
            time.sleep(0.5)
            ws.send('{"filter": "q=r1"}')
            time.sleep(1)
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_BOUND_SECONDS)
            except subprocess.TimeoutExpired:
                pytest.fail(f"llmgw serve still running {STOP_BOUND_SECONDS} s after SIGTERM")
            finally:
                locker.rollback()
            assert time.monotonic() - began < STOP_BOUND_SECONDS
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(STOP_BOUND_SECONDS)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
