"""ASGI entry: HTTP through Django, WebSockets through Channels (the console's live updates)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from agents.asgi import AssignmentsLifespan, HeartbeatFastLane  # noqa: E402
from llmgw import parselimit  # noqa: E402
from llmgw.bodies import BoundedBodies  # noqa: E402
from llmgw.routing import SocketCap, socket_auth_stack, websocket_urlpatterns  # noqa: E402

# An operator's YAML or JSON is parsed in one of a few slots per web process (429 past them): costly
# documents at once never hold every thread, nor the heartbeats' turn.
parselimit.configure(settings.LLMGW_PARSE_CONCURRENCY)

application = ProtocolTypeRouter(
    {
        # Bodies bounded in size and time first, then the heartbeat's fast lane, then Django.
        "http": BoundedBodies(HeartbeatFastLane(django_asgi_app)),
        # The cap first: a socket over it is refused before anything else is done for it.
        "websocket": SocketCap(AllowedHostsOriginValidator(socket_auth_stack(URLRouter(websocket_urlpatterns)))),
        # A served process reads the heartbeat's map of assignments at start and keeps it fresh.
        "lifespan": AssignmentsLifespan(),
    }
)
