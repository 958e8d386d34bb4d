"""PostgreSQL or Redis down, for real: a real `llmgw serve` reaches each through a TCP proxy of the test's
own, which the test cuts (new connections refused, or accepted and never answered; the open ones dropped)
and restores. Nothing here stops the real servers.

With the database cut, the API and heartbeats answer 503 with the API's error shape and Retry-After, the
console a short HTML page, each well within the client's 6 s; once restored, the next requests are served,
with no restart. With Redis cut, heartbeats and reads carry on, and a change that asks for a reconcile is
stored and says the reconcile was not queued.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from tests.conftest import node_spec
from tests.integration.conftest import redis_url
from tests.integration.conftest import test_database_url as database_url

pytestmark = pytest.mark.django_db(transaction=True)

LLMGW = str(Path(sys.executable).with_name("llmgw"))
# "Within 5 s": a client that gives up after 6 s must never have to.
CLIENT_TIMEOUT = 6.0
MODELS = "kind: Model\nname: small\nreplicas: {replicas}\nprofile: {{gpus: 1}}\n"


class CutProxy:
    """A TCP proxy on 127.0.0.1 (a port of its own) in front of `target`: cut() drops every open connection
    and then refuses new ones ("refuse": nothing listens) or takes them and never answers ("hang");
    restore() drops what a cut held and forwards again on the same port."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.mode = "up"
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.listener = self._listen(0)
        self.port = self.listener.getsockname()[1]

    def _listen(self, port: int) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return listener

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was shut: the port refuses from now on
            with self.lock:
                mode = self.mode
                self.sockets.append(client)
            if mode != "up":
                continue  # "hang": held, never answered, until restore() drops it
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets.append(upstream)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _drop_all(self) -> None:
        with self.lock:
            dropped, self.sockets = self.sockets, []
        for sock in dropped:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def cut(self, mode: str = "refuse") -> None:
        assert mode in {"refuse", "hang"}
        with self.lock:
            self.mode = mode
        if mode == "refuse":
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept; the port refuses
            self.listener.close()
        self._drop_all()

    def restore(self) -> None:
        with self.lock:
            was, self.mode = self.mode, "up"
        self._drop_all()
        if was == "refuse":
            self.listener = self._listen(self.port)

    def close(self) -> None:
        if self.mode != "refuse":
            self.cut("refuse")


class Server:
    """A real `llmgw serve` on a free port of 127.0.0.1."""

    def __init__(self, env: dict[str, str], log: Path):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [LLMGW, "serve", f"127.0.0.1:{self.port}"], env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llmgw serve exited: {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/login/", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llmgw serve did not start: {log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def server_env(tmp_path: Path, *, database_url: str, redis: str | None = None) -> dict[str, str]:
    from django.conf import settings

    env = {k: v for k, v in os.environ.items() if k not in {"LLMGW_CONFIG", "REDIS_URL", "DATABASE_URL"}}
    # The test's key, so the session made here logs the console in there.
    env.update(DATABASE_URL=database_url, SECRET_KEY=settings.SECRET_KEY, LLMGW_DATA_DIR=str(tmp_path / "data"))
    if redis:
        env["REDIS_URL"] = redis
    return env


@pytest.fixture
def people(make_user):
    """An operator's API token, two nodes' tokens, and a console session (cookie) of a viewer."""
    from django.test import Client

    from agents.services import node_token_create

    _, key = make_user("op", role="operator")
    viewer, _ = make_user("facility", role="viewer")
    browser = Client()
    browser.force_login(viewer)
    return {
        "api": {"Authorization": f"Token {key}"},
        "nodes": {name: {"Authorization": f"Token {node_token_create(node_name=name)}"} for name in ("gpu01", "gpu02")},
        "cookies": {"sessionid": browser.cookies["sessionid"].value},
    }


def heartbeat(client: httpx.Client, people: dict, name: str) -> httpx.Response:
    from agents.simulator.cluster import heartbeat_for

    return client.post("/api/v1/agents/heartbeat", json=heartbeat_for(node_spec(name)), headers=people["nodes"][name])


def timed(call, *args, **kwargs) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call(*args, **kwargs)
    return response, time.monotonic() - started


def assert_json_503(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"detail": "the database is not reachable now; try again in a few seconds", "field": None}
    assert int(response.headers["retry-after"]) > 0


@pytest.fixture
def database_proxy():
    from django.db import connection

    s = connection.settings_dict
    proxy = CutProxy((s.get("HOST") or "127.0.0.1", int(s.get("PORT") or 5432)))
    yield proxy
    proxy.close()


@pytest.mark.parametrize("cut", ["refuse", "hang"])
def test_with_the_database_cut_the_api_heartbeats_and_console_answer_503_at_once_and_recover(
    cut, people, database_proxy, tmp_path
):
    url = urlparse(database_url())
    through_proxy = url._replace(netloc=f"{url.username}@127.0.0.1:{database_proxy.port}").geturl()
    server = Server(server_env(tmp_path, database_url=through_proxy), tmp_path / "serve.log")
    try:
        with httpx.Client(base_url=server.url, timeout=CLIENT_TIMEOUT, cookies=people["cookies"]) as client:
            assert heartbeat(client, people, "gpu01").status_code == 200
            assert client.get("/api/v1/nodes", headers=people["api"]).status_code == 200
            assert client.get("/nodes/").status_code == 200

            database_proxy.cut(cut)
            answer, took = timed(client.get, "/api/v1/nodes", headers=people["api"])
            assert_json_503(answer)
            # A node's first heartbeat goes through Django's full path (its token, its rows): 503 too.
            beat, beat_took = timed(heartbeat, client, people, "gpu02")
            assert_json_503(beat)
            page, page_took = timed(client.get, "/nodes/")
            assert page.status_code == 503
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert "The database is not reachable now" in page.text and len(page.text) < 1000
            assert int(page.headers["retry-after"]) > 0
            print(f"database cut ({cut}): 503 after API {took:.2f} s, heartbeat {beat_took:.2f} s, "
                  f"console {page_took:.2f} s")

            database_proxy.restore()
            # The very next requests are served: no restart, no wait for a pool's back-off.
            assert client.get("/api/v1/nodes", headers=people["api"]).status_code == 200
            answer = heartbeat(client, people, "gpu02")
            assert answer.status_code == 200, answer.text
            assert answer.json()["node"] == "gpu02"
            assert client.get("/nodes/").status_code == 200
            assert "gpu02" in client.get("/api/v1/nodes", headers=people["api"]).text
    finally:
        server.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "Internal Server Error" not in log, log[-3000:]


@pytest.fixture
def redis_proxy():
    import redis

    target = urlparse(redis_url())
    redis.Redis.from_url(redis_url()).flushdb()
    proxy = CutProxy((target.hostname or "127.0.0.1", target.port or 6379))
    yield proxy, target._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    proxy.close()
    redis.Redis.from_url(redis_url()).flushdb()


@pytest.mark.parametrize("cut", ["refuse", "hang"])
def test_with_redis_cut_heartbeats_and_reads_go_on_and_a_change_says_its_reconcile_was_not_queued(
    cut, people, redis_proxy, tmp_path
):
    proxy, through_proxy = redis_proxy
    server = Server(
        server_env(tmp_path, database_url=database_url(), redis=through_proxy), tmp_path / "serve.log"
    )
    try:
        with httpx.Client(base_url=server.url, timeout=CLIENT_TIMEOUT, cookies=people["cookies"]) as client:
            assert heartbeat(client, people, "gpu01").status_code == 200
            applied = client.post("/api/v1/apply", json={"text": MODELS.format(replicas=1)}, headers=people["api"])
            assert applied.status_code == 200, applied.text
            assert "warning" not in applied.json() and "warning" not in applied.headers

            proxy.cut(cut)
            # A node joining: its rows are written, a live update and a reconcile are asked for, and neither
            # can go; the node is answered all the same.
            beat, beat_took = timed(heartbeat, client, people, "gpu02")
            assert beat.status_code == 200, beat.text
            assert beat.json()["node"] == "gpu02"
            assert client.get("/api/v1/nodes", headers=people["api"]).status_code == 200
            assert client.get("/nodes/").status_code == 200

            applied, took = timed(
                client.post, "/api/v1/apply", json={"text": MODELS.format(replicas=2)}, headers=people["api"]
            )
            assert applied.status_code == 200, applied.text
            body = applied.json()
            assert body["models"][0]["name"] == "small"
            assert body["warning"] == (
                "reconcile not queued: the task broker (Redis) is not reachable; the change is stored, and "
                "placement follows it once Redis is back"
            )
            assert applied.headers["warning"] == f'199 llmgw "{body["warning"]}"'
            print(f"redis cut ({cut}): a joining node answered in {beat_took:.2f} s, the change in {took:.2f} s")
            # Stored: the model reads back with its new count.
            model = client.get("/api/v1/models/small", headers=people["api"]).json()
            assert model["replicas"]["desired"] == 2

            proxy.restore()
            applied = client.post("/api/v1/apply", json={"text": MODELS.format(replicas=3)}, headers=people["api"])
            assert applied.status_code == 200, applied.text
            assert "warning" not in applied.json() and "warning" not in applied.headers
    finally:
        server.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "reconcile not queued" in log
    assert "Internal Server Error" not in log, log[-3000:]


@pytest.fixture
def broker_down(settings):
    """Tasks go to a Redis that is not there (a port nothing listens on), as in production with Redis down."""
    from llmgw.celery import app
    from tests.integration.conftest import _reset_connections

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    old = {"CELERY_TASK_ALWAYS_EAGER": app.conf.task_always_eager, "CELERY_BROKER_URL": app.conf.broker_url}

    def down() -> None:
        app.conf.update(CELERY_TASK_ALWAYS_EAGER=False, CELERY_BROKER_URL=f"redis://127.0.0.1:{port}/0")
        settings.CELERY_TASK_ALWAYS_EAGER = False
        _reset_connections(app)

    yield down
    app.conf.update(**old)
    _reset_connections(app)


def test_a_console_change_with_redis_down_is_stored_and_the_next_page_says_its_reconcile_was_not_queued(
    broker_down, make_user, join_node
):
    from django.test import Client

    from facility.models import Hold

    join_node("gpu01", rack="r1")
    broker_down()
    operator, _ = make_user("facility", role="operator")
    browser = Client()
    browser.force_login(operator)
    answer = browser.post("/facility/holds", {"domain": "rack:r1", "reason": "PDU swap", "confirm": "1"})
    assert answer.status_code == 302
    assert answer.headers["Warning"].startswith('199 llmgw "reconcile not queued: the task broker (Redis)')
    assert Hold.objects.filter(domain="rack:r1").exists()
    page = browser.get(answer.headers["Location"])
    assert page.status_code == 200
    assert "reconcile not queued: the task broker (Redis) is not reachable" in page.content.decode()
    # Said once: the page after does not repeat it.
    assert "reconcile not queued" not in browser.get("/facility/").content.decode()


def test_an_api_change_with_redis_down_says_so_in_its_warning_beside_its_own(broker_down, api, join_node):
    join_node("gpu01", rack="r1")
    broker_down()
    # An empty rack: the hold's own warning, and the reconcile's after it.
    answer = api.post("/api/v1/facility/holds", {"domain": "rack:r9", "reason": "PDU swap", "new": True}, format="json")
    assert answer.status_code == 201, answer.content
    own, _, queued = answer.json()["warning"].partition("; reconcile not queued")
    assert own and queued, answer.json()
