"""WebSocket routes of the console: live rows of the Nodes list and live panels of a node's page."""

from django.urls import path

from agents import consumers

websocket_urlpatterns = [
    path("ws/nodes/", consumers.NodesConsumer.as_asgi()),
    path("ws/nodes/<str:name>/", consumers.NodeConsumer.as_asgi()),
]
