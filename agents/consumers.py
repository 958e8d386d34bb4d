"""Live updates of the console: a WebSocket per open Nodes list or node page.

The consumer joins the channel groups agents.events sends to ("nodes", "node.<name>"), and on each
event renders the same partial templates the HTTP views render, each with its element id and
hx-swap-oob, so the htmx ws extension swaps the changed rows and values in place. Sync consumer:
rendering reads the database, and Channels runs each handler in a thread for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl

from asgiref.sync import async_to_sync
from channels.consumer import SyncConsumer
from channels.db import DatabaseSyncToAsync
from channels.generic.websocket import WebsocketConsumer
from django.conf import settings
from django.template.loader import render_to_string

from agents.events import NODES_GROUP, PLACEMENT_GROUP
from agents.models import Node
from agents.node.protocol import is_node_name
from llmgw.api import text_fault
from llmgw.jsonguard import json_depth_exceeds, unique_keys
from llmgw.permissions import can_read

log = logging.getLogger(__name__)

# A page shows at most one page of rows; a client naming more is cut here.
MAX_SHOWN = 500
# How deep a message from the page may nest ({"shown": …, "HEADERS": {…}} is 2).
MAX_DEPTH = 8
# What a page's own messages ask (a filter, an open detail) is worked out at most this often on one socket.
PAGE_SECONDS = 0.25


def page_message(text_data: str | None) -> dict:
    """What a page sent (a flat object), or {}: anything large, nested or unstorable is not from it, and is ignored
    (unread by a recursive parser: `[` × 100,000 would end in RecursionError)."""
    if not text_data or len(text_data) > settings.LLMGW_WS_MAX_BYTES or json_depth_exceeds(text_data, MAX_DEPTH):
        return {}
    try:
        message = json.loads(text_data, object_pairs_hook=unique_keys)
    except ValueError:
        return {}
    if not isinstance(message, dict):
        return {}
    # Text the database cannot take (a NUL, a lone surrogate), as itself or %-escaped in the filter's query:
    # not from the page either (its own request with it is refused, llmgw.textguard); read, it would end the
    # socket with the database's error at its next render.
    texts = [value for value in message.values() if isinstance(value, str)]
    if isinstance(message.get("filter"), str):
        texts += [text for pair in parse_qsl(message["filter"][:1000]) for text in pair]
    return {} if any(text_fault(text) for text in texts) else message


# SyncConsumer.dispatch's own function, unwrapped from the shared thread it is bound to.
_dispatch_in_thread = SyncConsumer.__dict__["dispatch"].func
# The threads handshakes run in (the role check, the session's user): apart from the renders' thread, and
# few, so a burst of pages opening holds at most this many database connections.
HANDSHAKE_THREADS = 2
handshakes = ThreadPoolExecutor(max_workers=HANDSHAKE_THREADS, thread_name_prefix="llmgw-handshake")
# The threads a page's own messages run in (its filter, an open detail: a new page's first render), apart from
# the thread the live updates share: there a new page's first render waited behind every open page's render of
# each change. A socket's messages still run one at a time, in order, whichever thread runs each.
PAGE_THREADS = 2
pages = ThreadPoolExecutor(max_workers=PAGE_THREADS, thread_name_prefix="llmgw-page")


class ReaderConsumer(WebsocketConsumer):
    """A console socket, only for a user who may read: joins `groups_to_join()`, leaves them however it ends.

    Leaving is not left to `disconnect()`: a consumer ends without reading the disconnect when a handler
    raises, and one does whenever the page went away while it rendered (uvicorn's send raises
    ClientDisconnected), or when connect fails after joining, or when the server cancels it. A member left
    behind stays in the group until the layer expires it (a day on channels-redis), each live update
    queued for it until its channel is full, logged "over capacity" at every send from then on.
    """

    # Leaving a group waits at most this long for the layer (Redis down): the socket's end never hangs on it.
    LEAVE_SECONDS = 5.0

    async def __call__(self, scope, receive, send):
        self.joined: list[str] = []
        self.left = False
        self.membership = asyncio.Lock()  # a join in flight is done before the leave, never after it
        rejoining = asyncio.ensure_future(self.rejoin_forever())
        try:
            await super().__call__(scope, receive, send)
        finally:
            rejoining.cancel()
            # Shielded: a cancelled socket (the server's shutdown) still leaves.
            await asyncio.shield(self.leave_groups())

    async def dispatch(self, message):
        if message.get("type") == "websocket.connect":
            # The handshake (the role check, the groups joined) in a thread of its own: sync handlers share
            # one thread, and a new socket's handshake queued there behind the renders of every open page
            # took as long as all of them together.
            connect = DatabaseSyncToAsync(_dispatch_in_thread, thread_sensitive=False, executor=handshakes)
            await connect(self, message)
        elif message.get("type") == "websocket.receive":
            receive = DatabaseSyncToAsync(_dispatch_in_thread, thread_sensitive=False, executor=pages)
            await receive(self, message)
        else:
            await super().dispatch(message)

    async def rejoin_forever(self) -> None:
        """Join the groups again every third of the layer's group expiry: members a process killed left behind
        expire (channels-redis' group_expiry, LLMGW_SOCKET_GROUP_EXPIRY), the live sockets never do."""
        expiry = getattr(getattr(self, "channel_layer", None), "group_expiry", None) or 86400
        while True:
            await asyncio.sleep(max(expiry / 3, 0.5))
            async with self.membership:
                if self.left:
                    return
                for group in self.joined:
                    try:
                        await asyncio.wait_for(self.channel_layer.group_add(group, self.channel_name), self.LEAVE_SECONDS)
                    except Exception:  # the layer is down: the next round joins again
                        log.warning("socket %s did not rejoin group %s", self.channel_name, group, exc_info=True)

    def groups_to_join(self) -> list[str]:
        raise NotImplementedError

    def connect(self) -> None:
        if not can_read(self.scope.get("user")):
            self.close(code=4403)
            return
        for group in self.groups_to_join():
            async_to_sync(self.join_group)(group)
        self.accept()

    async def join_group(self, group: str) -> None:
        async with self.membership:
            if self.left:  # the socket ended while connect ran in its thread
                return
            self.joined.append(group)  # before the add: should the add fail half-way, the leave still tries
            await self.channel_layer.group_add(group, self.channel_name)

    async def leave_groups(self) -> None:
        """Leave every group joined; once only (the end of the socket, whatever it was)."""
        async with self.membership:
            self.left = True
            joined, self.joined = self.joined, []
            for group in joined:
                try:
                    leave = self.channel_layer.group_discard(group, self.channel_name)
                    await asyncio.wait_for(leave, self.LEAVE_SECONDS)
                except Exception:  # the layer is down: its expiry drops the member in the end
                    log.warning("socket %s did not leave group %s", self.channel_name, group, exc_info=True)


# The cells of a Nodes row that a heartbeat changes (agents/_node_reading.html).
READING_CELLS = ("power", "temp", "throttle")


class NodesConsumer(ReaderConsumer):
    """The Nodes list's socket: re-renders the rows the page shows when their node changes.

    The page tells which rows it shows (a `ws-send` of `shown`, sent again on every table swap and
    reconnect), so a heartbeat of a node on another page costs nothing.
    """

    shown: set[str]
    # The summary line counts every node of the filter: sent again at most this often.
    SUMMARY_SECONDS = 2.0

    def groups_to_join(self) -> list[str]:
        self.shown = set()
        # What the page shows of each row, as this socket last sent it: the row but its readings, and each
        # reading cell (READING_CELLS).
        self.sent: dict[str, tuple[str, dict[str, str]]] = {}
        self.filter = ""
        self.summary_at = 0.0
        self.filter_read_at = 0.0
        self.summary: str | None = None  # as the page shows it: set when the page says its filter
        return [NODES_GROUP]

    def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        message = page_message(text_data)
        if isinstance(message.get("shown"), str):
            self.shown = set(message["shown"].split()[:MAX_SHOWN])
            # The page swapped its table (or connected): what it shows was rendered just now, not sent here.
            self.sent = {}
        if isinstance(message.get("filter"), str):
            self.filter = message["filter"][:1000]
            # The summary as the page shows it, counted at most every PAGE_SECONDS (a script sending filters
            # without pause costs a count a quarter second, not one a message): else the next one counts.
            now = time.monotonic()
            if now - self.filter_read_at >= PAGE_SECONDS:
                self.filter_read_at = now
                self.summary = self.summary_html()
            else:
                self.summary = None

    def node_changed(self, event: dict) -> None:
        if event.get("node") in self.shown:
            self.send_rows([event["node"]])
        self.send_summary()

    def nodes_readings(self, event: dict) -> None:
        # New readings of many nodes at once (agents.events): the shown rows among them, in one send.
        changed = sorted(self.shown.intersection(event.get("nodes") or ()))
        if changed:
            self.send_rows(changed)
        self.send_summary()

    def nodes_changed(self, event: dict) -> None:
        # A hold or a budget: any shown row may have changed state.
        if self.shown:
            self.send_rows(sorted(self.shown))
        self.send_summary(force=True)

    def send_summary(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self.summary_at < self.SUMMARY_SECONDS:
            return
        self.summary_at = time.monotonic()
        html = self.summary_html()
        if self.summary is None:  # the page never said its filter: what it shows is not known yet
            self.summary = html
        elif html != self.summary:  # only when a count changed: a heartbeat alone sends nothing
            self.summary = html
            self.send(text_data=html)

    def summary_html(self) -> str:
        from agents.views import node_summary

        return render_to_string("agents/_node_summary.html", {**node_summary(dict(parse_qsl(self.filter))), "oob": True})

    def send_rows(self, names: list[str]) -> None:
        """What changed of these rows since this socket sent them: a row whose readings alone changed, only
        the cells that did (a heartbeat moves the power, seldom the rest); any other, whole."""
        from agents.views import rows_for

        parts = []
        for row in rows_for(names, by="name"):
            cells = {cell: render_to_string("agents/_node_reading.html", {"row": row, "cell": cell, "cell_oob": True})
                     .strip() for cell in READING_CELLS}
            whole_row = render_to_string("agents/_node_row.html", {"row": row, "oob": True}).strip()
            # The row less its cells (as the row renders them: without the oob attribute): what else it shows.
            rest = whole_row
            for html in cells.values():
                rest = rest.replace(html.replace(' hx-swap-oob="true"', "", 1), "")
            before = self.sent.get(row.name)
            if before is None or before[0] != rest:
                parts.append(whole_row)
            else:
                parts += [html for cell, html in cells.items() if before[1].get(cell) != html]
            self.sent[row.name] = (rest, cells)
        if parts:
            self.send(text_data="".join(parts))


class NodeConsumer(ReaderConsumer):
    """A node page's socket: re-renders the page's live panel and location when the node (or a hold) changes."""

    def connect(self) -> None:
        self.node_name = self.scope["url_route"]["kwargs"]["name"]
        if not is_node_name(self.node_name):  # no node has this name: refused, before any group
            self.close(code=4404)
            return
        super().connect()

    def groups_to_join(self) -> list[str]:
        return [NODES_GROUP]

    def node_changed(self, event: dict) -> None:
        if event.get("node") == self.node_name:
            self.send_panels()

    def nodes_readings(self, event: dict) -> None:
        if self.node_name in (event.get("nodes") or ()):
            self.send_panels()

    def nodes_changed(self, event: dict) -> None:
        self.send_panels()

    def send_panels(self) -> None:
        from agents.views import node_live_context

        node = Node.objects.filter(name=self.node_name).first()
        if node is None:
            return
        context = {**node_live_context(node), "oob": True}
        self.send(
            text_data=render_to_string("agents/_node_live.html", context)
            + render_to_string("agents/_node_location.html", context)
        )


# -- the Facility and Models pages ---------------------------------------------------------------------------

# A heartbeat changes measured draw: the Facility page renders again for it at most this often.
READINGS_RENDER_SECONDS = 5.0


# A page's socket renders again no sooner than this many times what its last render took: on a busy server
# (a thousand nodes joining, placement changing every second) an open Facility page rendered its parts every
# second, each render seconds long, and took the web process's CPU from heartbeats and page loads.
RENDER_COST_TIMES = 4.0


class FilteredPageConsumer(ReaderConsumer):
    """A page that renders one body for the filter the page reports (a `ws-send` of `filter`, a query string).

    What the page asks renders at once, but at most every PAGE_SECONDS: messages sent without pause (a
    script's) render their last state once, at the socket's own tick, not once each. A render owed for
    later is never dropped: the tick sends it once its time has come."""

    TICK_SECONDS = 1.0

    async def __call__(self, scope, receive, send):
        self.due_at: float | None = None  # when a render is owed; the tick asks for it then
        ticker = asyncio.ensure_future(self.tick_forever())
        try:
            await super().__call__(scope, receive, send)
        finally:
            ticker.cancel()

    async def tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.TICK_SECONDS)
            due = self.due_at
            name = getattr(self, "channel_name", None)
            if due is not None and name and time.monotonic() >= due:
                self.due_at = None
                try:
                    await self.channel_layer.send(name, {"type": "page.tick"})
                except Exception:  # the layer is down: the next change asks again
                    log.warning("page socket %s: tick not sent", name, exc_info=True)

    def groups_to_join(self) -> list[str]:
        self.filter = ""
        self.last_render = 0.0
        self.render_cost = 0.0  # how long the last render took
        return [PLACEMENT_GROUP]

    def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        message = page_message(text_data)
        if isinstance(message.get("filter"), str):
            new = message["filter"][:1000]
            changed, self.filter = new != self.filter, new
            if changed and self.last_render:
                # A live render for the old filter may have landed after the page's filtered swap: the
                # page shows this filter's body again, so it never stays on the old one.
                self.owe(PAGE_SECONDS)

    def owe(self, seconds: float) -> None:
        """A render is owed within `seconds` of the last one — or RENDER_COST_TIMES what the last one took,
        when more: now if that has passed, else at the tick."""
        due = self.last_render + max(seconds, self.render_cost * RENDER_COST_TIMES)
        if time.monotonic() >= due:
            self.render()
        elif getattr(self, "due_at", None) is None or due < self.due_at:
            self.due_at = due

    def page_tick(self, event: dict) -> None:
        self.render()

    def params(self) -> dict[str, str]:
        return dict(parse_qsl(self.filter))

    def placement_changed(self, event: dict) -> None:
        self.render()

    def render(self) -> None:
        self.last_render = time.monotonic()
        self.due_at = None
        self.send(text_data=self.html())
        self.render_cost = time.monotonic() - self.last_render

    def html(self) -> str:
        raise NotImplementedError


def scope_csrf_token(scope) -> str:
    """A CSRF token for the forms a live update renders (Release…), from the socket's CSRF cookie: the same
    secret the page's own forms carry, masked once, so the card swapped in posts as the page's would."""
    from django.conf import settings as django_settings
    from django.http import HttpRequest
    from django.middleware.csrf import get_token

    cookies = {}
    for name, value in scope.get("headers") or ():
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, item = part.strip().partition("=")
                cookies[key] = item
    secret = cookies.get(django_settings.CSRF_COOKIE_NAME, "")
    if len(secret) != 32 or not secret.isalnum():
        return ""
    request = HttpRequest()
    request.META["CSRF_COOKIE"] = secret
    return get_token(request)


class FacilityConsumer(FilteredPageConsumer):
    """The Facility page's socket: sends what changed on the page, part by part — a summary count, a rack
    tile, a row or room heading, a worst-first row, the holds, conditions or capping card, the open detail —
    or the rack map or list whole when its shape changed (a rack joined, the order moved).

    Placement, a hold, a budget or a cap render again within RENDER_SECONDS; heartbeats at most every
    READINGS_RENDER_SECONDS. A change that comes inside the window is not dropped: the socket's own tick
    renders it once the window has passed. The page says its filter and page (`filter`) and the domain whose
    detail is open (`detail`); a first `filter` sends every part once, as the page may be older than the socket.
    """

    RENDER_SECONDS = 1.0

    # Sent with the first render for a page: the page then knows the socket has caught up (facility.js).
    SYNCED = '<span id="socket-synced" hidden hx-swap-oob="true"></span>'

    def groups_to_join(self) -> list[str]:
        self.sent: dict = {}  # what the page shows, by fingerprints (facility.views.fragment_hashes)
        self.greeted = False
        self.sync_owed = False  # the next render starts with SYNCED: the page said what it shows
        self.detail = ""
        self.csrf_token = scope_csrf_token(self.scope)
        return [*super().groups_to_join(), NODES_GROUP]

    def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        from facility.views import hashes_of_page

        message = page_message(text_data)
        if isinstance(message.get("filter"), str) and (not self.greeted or message["filter"][:1000] != self.filter):
            # A page loaded, or its body swapped for a filter: what it shows, as its form says.
            self.filter = message["filter"][:1000]
            body = message.get("parts") if isinstance(message.get("parts"), str) else ""
            cards = message.get("cards") if isinstance(message.get("cards"), str) else None
            self.sent = hashes_of_page(body, cards, self.sent if self.greeted else None)
            self.greeted = True
            self.sync_owed = True
            self.owe(PAGE_SECONDS)
        if isinstance(message.get("detail"), str) and message["detail"][:300] != self.detail:
            self.detail = message["detail"][:300]
            self.owe(PAGE_SECONDS)

    def placement_changed(self, event: dict) -> None:
        self.owe(self.RENDER_SECONDS)

    def node_changed(self, event: dict) -> None:
        self.owe(READINGS_RENDER_SECONDS)

    nodes_readings = node_changed

    def nodes_changed(self, event: dict) -> None:
        pass  # a hold or a budget: placement.changed follows it

    def fragments(self) -> dict:
        from facility.views import facility_fragments
        from llmgw.permissions import can_operate

        return facility_fragments(
            self.params(), detail=getattr(self, "detail", ""), can_operate=can_operate(self.scope.get("user")),
            csrf_token=getattr(self, "csrf_token", ""),
        )

    def html(self) -> str:
        """Every part the page shows, as one message (what a first render sends)."""
        from facility.views import fragments_changed

        return "".join(fragments_changed({}, self.fragments()))

    def render(self, *, synced: bool = False) -> None:
        from facility.views import fragment_hashes, fragments_changed

        self.last_render = time.monotonic()
        self.due_at = None
        fragments = self.fragments()
        self.render_cost = time.monotonic() - self.last_render
        messages = fragments_changed(self.sent, fragments)
        self.sent = fragment_hashes(fragments)
        if synced or self.sync_owed:
            self.sync_owed = False
            messages = [self.SYNCED, *messages]
        for html in messages:
            self.send(text_data=html)


class ModelsConsumer(FilteredPageConsumer):
    """The Models page's socket (and a model's page's): the models of the page the browser shows (its
    filter: ``q`` and ``page``, or ``model``), with their replicas, states and pending reasons, rendered
    again when placement changes."""

    def html(self) -> str:
        from placement.views import models_context

        return render_to_string("placement/_models.html", {**models_context(self.params()), "oob": True})
