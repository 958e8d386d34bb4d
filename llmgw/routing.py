"""WebSocket routes of the console: live rows of the Nodes list, live panels of a node's page, the live
Facility and Models pages."""

from django.urls import path

from agents import consumers

websocket_urlpatterns = [
    path("ws/nodes/", consumers.NodesConsumer.as_asgi()),
    path("ws/nodes/<str:name>/", consumers.NodeConsumer.as_asgi()),
    path("ws/facility/", consumers.FacilityConsumer.as_asgi()),
    path("ws/models/", consumers.ModelsConsumer.as_asgi()),
]
