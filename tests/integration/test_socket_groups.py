"""Console sockets leave their channel groups however they end: closed by the page, dropped, closed by the
server, refused, or ended by an error. A member left behind stays until the layer expires it (a day on
channels-redis), and every live update queues for it until its channel is full ("over capacity")."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from agents.events import NODES_GROUP, PLACEMENT_GROUP
from tests.conftest import node_spec
from tests.integration.conftest import redis_url

pytestmark = pytest.mark.django_db(transaction=True)

ROUTES = [("/ws/nodes/", [NODES_GROUP]), ("/ws/nodes/gpu01/", [NODES_GROUP]),
          ("/ws/facility/", [PLACEMENT_GROUP, NODES_GROUP]), ("/ws/models/", [PLACEMENT_GROUP])]


def members(group: str) -> int:
    """How many channels the in-memory layer holds in `group`."""
    return len(get_channel_layer().groups.get(group, {}))


def socket_to(path: str, user) -> WebsocketCommunicator:
    from channels.routing import URLRouter

    from llmgw.routing import websocket_urlpatterns

    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    return communicator


@pytest.fixture
def viewer(make_user):
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for

    heartbeat_record(node_name="gpu01", heartbeat=heartbeat_for(node_spec("gpu01", rack="r1", gpus=1)))
    user, _ = make_user("viewer1", "viewer")
    return user


# -- through Channels' communicator ------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "groups"), ROUTES, ids=[path for path, _ in ROUTES])
def test_many_sockets_opened_and_closed_leave_every_group_empty(viewer, path, groups):
    async def run():
        sockets = [socket_to(path, viewer) for _ in range(25)]
        for communicator in sockets:
            assert (await communicator.connect())[0]
        open_members = {group: members(group) for group in groups}
        for communicator in sockets:
            await communicator.disconnect()
        return open_members

    assert async_to_sync(run)() == dict.fromkeys(groups, 25)
    assert [members(group) for group in groups] == [0] * len(groups)


def test_refused_sockets_join_nothing(viewer):
    from django.contrib.auth.models import AnonymousUser

    async def run():
        for path, user in [("/ws/nodes/", AnonymousUser()), ("/ws/facility/", AnonymousUser()),
                           ("/ws/nodes/gp%C3%BC01/", viewer)]:
            communicator = socket_to(path, user)
            connected, _ = await communicator.connect()
            assert not connected
            await communicator.disconnect()

    async_to_sync(run)()
    assert members(NODES_GROUP) == members(PLACEMENT_GROUP) == 0


def test_an_error_in_connect_after_joining_leaves_the_groups(viewer, monkeypatch):
    from agents.consumers import ReaderConsumer

    def accept(self, *args, **kwargs):
        raise ConnectionError("the page went away during the handshake")

    monkeypatch.setattr(ReaderConsumer, "accept", accept)

    async def run():
        for _ in range(5):
            communicator = socket_to("/ws/facility/", viewer)
            with pytest.raises(ConnectionError):
                await communicator.connect()

    async_to_sync(run)()
    assert members(NODES_GROUP) == members(PLACEMENT_GROUP) == 0


def test_an_error_in_a_render_ends_the_socket_and_leaves_the_group(viewer, monkeypatch):
    import agents.views
    from agents.events import node_changed

    def rows_for(*args, **kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(agents.views, "rows_for", rows_for)

    async def run():
        from asgiref.sync import sync_to_async

        communicator = socket_to("/ws/nodes/", viewer)
        assert (await communicator.connect())[0]
        await communicator.send_json_to({"shown": "gpu01"})
        await communicator.receive_nothing(0.1)
        assert members(NODES_GROUP) == 1
        await sync_to_async(node_changed)("gpu01")
        with pytest.raises(RuntimeError):
            await communicator.wait(5)

    async_to_sync(run)()
    assert members(NODES_GROUP) == 0


def test_a_socket_cancelled_in_the_middle_of_a_render_leaves_the_group(viewer, monkeypatch):
    import agents.views
    from agents.events import node_changed

    rendering = threading.Event()

    def rows_for(*args, **kwargs):
        rendering.set()
        time.sleep(0.5)
        return []

    monkeypatch.setattr(agents.views, "rows_for", rows_for)

    async def run():
        from asgiref.sync import sync_to_async

        communicator = socket_to("/ws/nodes/", viewer)
        assert (await communicator.connect())[0]
        await communicator.send_json_to({"shown": "gpu01"})
        await communicator.receive_nothing(0.1)
        await sync_to_async(node_changed)("gpu01")
        await sync_to_async(rendering.wait)(5)
        communicator.future.cancel()  # a server's shutdown, or its close timeout
        try:
            await communicator.future
        except asyncio.CancelledError:
            pass

    async_to_sync(run)()
    assert members(NODES_GROUP) == 0


@pytest.fixture
def redis_layer(settings):
    """channels-redis on the test Redis, with a prefix of this test's own."""
    import redis
    from channels.layers import channel_layers

    prefix = f"llmgw-test-groups-{time.monotonic_ns()}"
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                    "CONFIG": {"hosts": [redis_url()], "prefix": prefix}}
    }
    channel_layers.backends.clear()
    client = redis.Redis.from_url(redis_url())
    yield lambda group: client.zcard(f"{prefix}:group:{group}")
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()
    channel_layers.backends.clear()


def test_on_redis_the_groups_zsets_empty_again_after_closes_and_errors(viewer, redis_layer, monkeypatch):
    import agents.views
    from agents.events import node_changed

    zcard = redis_layer

    def rows_for(*args, **kwargs):
        raise RuntimeError("the database went away")

    async def run():
        from asgiref.sync import sync_to_async

        sockets = [socket_to(path, viewer) for path, _ in ROUTES for _ in range(5)]
        for communicator in sockets:
            assert (await communicator.connect())[0]
        opened = (zcard(NODES_GROUP), zcard(PLACEMENT_GROUP))
        for communicator in sockets:
            await communicator.disconnect()
        closed = (zcard(NODES_GROUP), zcard(PLACEMENT_GROUP))

        failing = socket_to("/ws/nodes/", viewer)
        assert (await failing.connect())[0]
        await failing.send_json_to({"shown": "gpu01"})
        await failing.receive_nothing(0.1)
        monkeypatch.setattr(agents.views, "rows_for", rows_for)
        await sync_to_async(node_changed)("gpu01")
        with pytest.raises(RuntimeError):
            await failing.wait(5)
        return opened, closed

    opened, closed = async_to_sync(run)()
    assert opened == (15, 10)
    assert closed == (0, 0)
    assert zcard(NODES_GROUP) == 0


# -- through the served application (uvicorn, as `llmgw serve` runs it) --------------------------------------


@pytest.fixture
def served(viewer, client):
    """The real ASGI application in uvicorn on a loop of this test's own, in a thread: yields (base URL,
    the loop, the headers a logged-in viewer's browser sends)."""
    import uvicorn

    from llmgw.asgi import application
    from llmgw.serving import uvicorn_limits

    client.force_login(viewer)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    host, port = sock.getsockname()
    config = uvicorn.Config(application, lifespan="off", log_level="warning", **uvicorn_limits())
    server = uvicorn.Server(config)
    loop = asyncio.new_event_loop()
    serving = server.serve(sockets=[sock])
    thread = threading.Thread(target=loop.run_until_complete, args=(serving,), daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    headers = {"Cookie": f"sessionid={client.cookies['sessionid'].value}", "Origin": f"http://{host}:{port}"}
    yield f"ws://{host}:{port}", loop, headers
    server.should_exit = True
    thread.join(15)
    sock.close()


def until_members(group: str, count: int, seconds: float = 5) -> int:
    deadline = time.monotonic() + seconds
    while members(group) != count and time.monotonic() < deadline:
        time.sleep(0.02)
    return members(group)


def test_served_sockets_closed_dropped_or_closed_by_the_server_leave_the_group(served, settings):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    base, _, headers = served
    with contextlib.ExitStack() as stack:
        url = f"{base}/ws/nodes/"
        sockets = [stack.enter_context(connect(url, additional_headers=headers)) for _ in range(30)]
        assert until_members(NODES_GROUP, 30) == 30
        for ws in sockets[:10]:
            ws.close()  # the page closes it
        for ws in sockets[10:20]:
            ws.socket.shutdown(socket.SHUT_RDWR)  # the connection drops: no close frame
        for ws in sockets[20:]:
            ws.send("x" * (settings.LLMGW_WS_MAX_BYTES + 1))  # the server closes it (1009, too big)
            with pytest.raises(ConnectionClosed):
                ws.recv(5)
        assert until_members(NODES_GROUP, 0) == 0


def test_a_served_socket_dropped_while_its_rows_render_leaves_the_group(served, monkeypatch):
    """The leak: the page went away while a live update rendered; the render's send then raised (uvicorn:
    ClientDisconnected), the consumer ended on it and never read the disconnect that would leave."""
    from websockets.sync.client import connect

    import agents.views

    base, loop, headers = served
    rendering, release = threading.Event(), threading.Event()
    real_rows_for = agents.views.rows_for

    def rows_for(*args, **kwargs):
        rendering.set()
        release.wait(5)
        return real_rows_for(*args, **kwargs)

    monkeypatch.setattr(agents.views, "rows_for", rows_for)
    for _ in range(5):
        rendering.clear()
        release.clear()
        with connect(f"{base}/ws/nodes/", additional_headers=headers) as ws:
            ws.send('{"shown": "gpu01"}')
            assert until_members(NODES_GROUP, 1) == 1
            time.sleep(0.1)  # the page's message read
            asyncio.run_coroutine_threadsafe(
                get_channel_layer().group_send(NODES_GROUP, {"type": "node.changed", "node": "gpu01"}), loop
            ).result(5)
            assert rendering.wait(5)
        # The browser navigated away while the row rendered; the render's send comes after.
        time.sleep(0.2)
        release.set()
        assert until_members(NODES_GROUP, 0) == 0
