"""Console sockets in one web process: a cap with a fast refusal (1013, try again later), a handshake that does
not wait behind the renders of the pages already open, and group memberships that lapse when a process dies
(channels-redis' group_expiry) while live sockets join again and stay."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from agents.events import NODES_GROUP
from tests.integration.conftest import redis_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cookie(client, make_user):
    user, _ = make_user("viewer1", "viewer")
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def page_socket(path: str, cookie: bytes) -> WebsocketCommunicator:
    """A socket as a browser opens it: through the served application, its origin and login cookie."""
    from llmgw.asgi import application

    return WebsocketCommunicator(application, path, headers=[(b"origin", b"http://127.0.0.1"), (b"cookie", cookie),
                                                             (b"host", b"127.0.0.1")])


def test_sockets_over_the_cap_are_closed_at_once_with_1013_and_one_fits_again_after_a_close(cookie, settings):
    settings.LLMGW_MAX_SOCKETS = 3

    async def run():
        open_ = [page_socket("/ws/nodes/", cookie) for _ in range(3)]
        for ws in open_:
            assert (await ws.connect())[0]
        over = page_socket("/ws/nodes/", cookie)
        assert (await over.connect())[0]
        assert await over.receive_output(5) == {"type": "websocket.close", "code": 1013}
        await open_[0].disconnect()
        again = page_socket("/ws/nodes/", cookie)
        assert (await again.connect())[0]
        await again.receive_nothing(0.2)  # not closed
        for ws in [*open_[1:], again]:
            await ws.disconnect()

    async_to_sync(run)()


def test_a_handshake_does_not_wait_behind_an_open_page_s_render(cookie, monkeypatch):
    import facility.views

    rendering, release = threading.Event(), threading.Event()
    real = facility.views.facility_fragments

    def slow_fragments(*args, **kwargs):
        rendering.set()
        release.wait(30)  # a render that takes long: a big facility, a slow query
        return real(*args, **kwargs)

    monkeypatch.setattr(facility.views, "facility_fragments", slow_fragments)

    async def run():
        from asgiref.sync import sync_to_async

        page = page_socket("/ws/facility/", cookie)
        assert (await page.connect())[0]
        await page.send_json_to({"filter": ""})
        assert await sync_to_async(rendering.wait, thread_sensitive=False)(5)
        try:
            new = page_socket("/ws/nodes/", cookie)
            # While the first page's render runs, the next page's handshake completes.
            assert (await new.connect(timeout=10))[0]
            await new.disconnect()
        finally:
            release.set()
        await page.disconnect()

    async_to_sync(run)()


def test_a_new_page_s_first_render_does_not_wait_behind_an_open_page_s_live_render(cookie, monkeypatch):
    import facility.views

    armed, rendering, release = threading.Event(), threading.Event(), threading.Event()
    real = facility.views.facility_fragments

    def fragments(*args, **kwargs):
        if armed.is_set():
            armed.clear()  # the next render, the open page's live one, takes long: a big facility, a slow query
            rendering.set()
            release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(facility.views, "facility_fragments", fragments)

    async def run():
        from asgiref.sync import sync_to_async
        from channels.layers import get_channel_layer

        from agents.events import PLACEMENT_GROUP

        page = page_socket("/ws/facility/", cookie)
        assert (await page.connect())[0]
        await page.send_json_to({"filter": ""})
        assert 'id="socket-synced"' in (await page.receive_output(10))["text"]
        armed.set()
        await get_channel_layer().group_send(PLACEMENT_GROUP, {"type": "placement.changed"})
        assert await sync_to_async(rendering.wait, thread_sensitive=False)(10)
        try:
            new = page_socket("/ws/facility/", cookie)
            assert (await new.connect(timeout=10))[0]
            await new.send_json_to({"filter": ""})
            # While the open page's live render runs, the new page gets its first render.
            first = await new.receive_output(10)
            assert 'id="socket-synced"' in first["text"]
            await new.disconnect()
        finally:
            release.set()
        await page.disconnect()

    async_to_sync(run)()


@pytest.fixture
def redis_layer(settings):
    """channels-redis on the test Redis, as settings make it, with a 2 s group expiry and a prefix of its own."""
    import redis
    from channels.layers import channel_layers

    prefix = f"llmgw-test-expiry-{time.monotonic_ns()}"
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                    "CONFIG": {"hosts": [redis_url()], "prefix": prefix, "group_expiry": 2}}
    }
    channel_layers.backends.clear()
    client = redis.Redis.from_url(redis_url())
    yield lambda group: client.zcard(f"{prefix}:group:{group}")
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()
    channel_layers.backends.clear()


@pytest.mark.slow
def test_a_killed_process_s_members_lapse_and_live_sockets_stay(cookie, redis_layer):
    from channels.layers import get_channel_layer

    zcard = redis_layer

    async def run():
        import asyncio

        layer = get_channel_layer()
        # A socket of a process killed with -9: its member is never discarded.
        await layer.group_add(NODES_GROUP, "specific.dead!socket")
        live = page_socket("/ws/nodes/", cookie)
        assert (await live.connect())[0]
        assert zcard(NODES_GROUP) == 2
        await asyncio.sleep(3.5)  # past the group expiry (Redis's clock: no other to move)
        await layer.group_send(NODES_GROUP, {"type": "nodes.changed"})  # drops the lapsed members
        members = zcard(NODES_GROUP)
        await live.disconnect()
        return members

    assert async_to_sync(run)() == 1


def test_the_served_layer_has_a_group_expiry_of_minutes():
    env = {**os.environ, "REDIS_URL": redis_url()}
    env.pop("LLMGW_SOCKET_GROUP_EXPIRY_SECONDS", None)
    out = subprocess.run(
        [sys.executable, "-c", "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'llmgw.settings');"
         "from django.conf import settings; print(settings.CHANNEL_LAYERS['default']['CONFIG']['group_expiry'])"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()
    assert out[-1] == "300"
