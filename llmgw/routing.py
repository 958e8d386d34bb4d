"""WebSocket routes of the console: live rows of the Nodes list, live panels of a node's page, the live
Facility and Models pages; any other path refused."""

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from agents import consumers


class NoSuchSocket(AsyncWebsocketConsumer):
    """A socket path the console has none for: refused at the handshake (close code 4404, as a node's
    socket for a name no node has), not a routing error with its traceback in the log for each try."""

    async def connect(self) -> None:
        await self.close(code=4404)


websocket_urlpatterns = [
    path("ws/nodes/", consumers.NodesConsumer.as_asgi()),
    path("ws/nodes/<str:name>/", consumers.NodeConsumer.as_asgi()),
    path("ws/facility/", consumers.FacilityConsumer.as_asgi()),
    path("ws/models/", consumers.ModelsConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),
]
