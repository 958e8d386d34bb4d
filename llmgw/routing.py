"""WebSocket routes of the console."""

websocket_urlpatterns: list = []
