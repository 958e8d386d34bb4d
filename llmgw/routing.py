"""WebSocket routes of the console: live rows of the Nodes list, live panels of a node's page, the live
Facility and Models pages; any other path refused. In front of them: a cap on the sockets one process holds
(SocketCap), and the login read from the session (SocketAuth)."""

from channels.auth import AuthMiddleware, get_user
from channels.db import DatabaseSyncToAsync
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.urls import path, re_path

from agents import consumers

# The close code of a socket refused because the process holds LLMGW_MAX_SOCKETS: 1013, "try again later" (the
# page says live updates are paused; the htmx ws extension tries again, backing off).
SOCKETS_FULL = 1013


class NoSuchSocket(AsyncWebsocketConsumer):
    """A socket path the console has none for: refused at the handshake (close code 4404, as a node's
    socket for a name no node has), not a routing error with its traceback in the log for each try."""

    async def connect(self) -> None:
        await self.close(code=4404)


class SocketAuth(AuthMiddleware):
    """Channels' AuthMiddleware, reading the user in the handshakes' threads (agents.consumers.handshakes): by
    default it waits in the one thread the sockets' sync handlers share, behind the renders of every open page."""

    async def resolve_scope(self, scope):
        user = DatabaseSyncToAsync(get_user.func, thread_sensitive=False, executor=consumers.handshakes)
        scope["user"]._wrapped = await user(scope)


def socket_auth_stack(inner):
    return CookieMiddleware(SessionMiddleware(SocketAuth(inner)))


class SocketCap:
    """At most LLMGW_MAX_SOCKETS console sockets open in this process: one more is accepted and closed at once
    with SOCKETS_FULL, before any session, database or thread is touched, so a flood of pages costs nothing."""

    def __init__(self, app):
        self.app = app
        self.open = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        if self.open >= settings.LLMGW_MAX_SOCKETS:
            message = await receive()
            if message["type"] == "websocket.connect":
                # Accepted, then closed: a browser sees the close code only on an opened socket.
                await send({"type": "websocket.accept"})
                await send({"type": "websocket.close", "code": SOCKETS_FULL})
            return None
        self.open += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.open -= 1


websocket_urlpatterns = [
    path("ws/nodes/", consumers.NodesConsumer.as_asgi()),
    path("ws/nodes/<str:name>/", consumers.NodeConsumer.as_asgi()),
    path("ws/facility/", consumers.FacilityConsumer.as_asgi()),
    path("ws/models/", consumers.ModelsConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),
]
