"""A stand-in NetBox: /api/dcim/{sites,locations,racks,power-panels,power-feeds,devices}/ answering the
documented JSON (``count``/``next``/``previous``/``results``, ``limit``/``offset`` pagination, filters
by ``site`` slug, a token required), from lists of objects a test builds."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

ENDPOINTS = ("sites", "locations", "racks", "power-panels", "power-feeds", "devices")
# Small pages, so every listing takes several requests.
PAGE = 3


def _site_of(kind: str, obj: dict[str, Any]) -> str | None:
    if kind == "sites":
        return obj["slug"]
    if kind == "power-feeds":
        return obj["power_panel"]["site"]["slug"]
    return obj.get("site", {}).get("slug")


class FakeNetbox:
    """``with FakeNetbox(data, token) as nb:`` serves ``data`` (endpoint → objects) at ``nb.url``."""

    def __init__(self, data: dict[str, list[dict[str, Any]]], token: str = "t0ken"):
        self.data = {k: data.get(k, []) for k in ENDPOINTS}
        self.token = token
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                fake.requests.append(self.path)
                if self.headers.get("Authorization") != f"Token {fake.token}":
                    return self._send(403, {"detail": "Invalid token"})
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 3 or parts[:2] != ["api", "dcim"] or parts[2] not in ENDPOINTS:
                    return self._send(404, {"detail": "Not found."})
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                objs = fake.data[parts[2]]
                if "site" in query:
                    objs = [o for o in objs if _site_of(parts[2], o) == query["site"]]
                if "slug" in query:
                    objs = [o for o in objs if o.get("slug") == query["slug"]]
                limit = int(query.get("limit") or 0) or PAGE
                offset = int(query.get("offset") or 0)
                page = objs[offset : offset + limit]

                def link(at: int) -> str:
                    rest = {k: v for k, v in query.items() if k not in ("limit", "offset")}
                    return f"{fake.url}{url.path}?{urlencode({**rest, 'limit': limit, 'offset': at})}"

                self._send(200, {
                    "count": len(objs),
                    "next": link(offset + limit) if offset + limit < len(objs) else None,
                    "previous": link(max(0, offset - limit)) if offset else None,
                    "results": page,
                })

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeNetbox:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
