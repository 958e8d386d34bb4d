"""A stand-in NetBox that replays what a real one answered (tests/fixtures/netbox/<version>/<snapshot>/).

It serves /api/status/ and /api/dcim/<endpoint>/ as NetBox does: ``count``/``next``/``previous``/
``results``, ``limit``/``offset`` pagination, the ``site`` (slug) and ``slug`` filters, a token required
(``Token …`` or ``Bearer …``), and any other path NetBox's HTML 404 page, as a wrong ``--url`` gets.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "netbox"
# Small pages, so every listing takes several requests.
PAGE = 3


def recorded(snapshot: str = "base", version: str | None = None) -> dict[str, Any]:
    """A recorded NetBox: endpoint (``power-feeds``) → its objects, ``status`` → /api/status/'s answer,
    and ``_404`` → the HTML page it answers for a path that is not its API's.

    ``snapshot`` is a directory under the version: ``base``, ``rack-deleted``, or a step of a series such
    as ``sites/s1-two-sites`` (see ``series_steps``)."""
    root = FIXTURES / (version or newest_version())
    if not (root / snapshot).is_dir():
        raise FileNotFoundError(f"no recorded NetBox snapshot {root / snapshot}")
    out: dict[str, Any] = {}
    for path in sorted((root / snapshot).glob("*.json")):
        name = path.stem.removeprefix("dcim_")
        out[name] = json.loads(path.read_text())
    page = root / snapshot / "wrong-url-404.html"
    if page.exists():
        out["_404"] = page.read_text()
    return out


def series_steps(series: str = "sites", version: str | None = None) -> list[str]:
    """A recorded series' steps in the order they were recorded (``sites/s1-two-sites``, ...), from its meta.json."""
    meta = json.loads((FIXTURES / (version or newest_version()) / series / "meta.json").read_text())
    return [f"{series}/{step['step']}" for step in meta["steps"]]


def newest_version() -> str:
    versions = [p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name[:1].isdigit()]
    return max(versions, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()))


def _site_of(kind: str, obj: dict[str, Any], data: dict[str, Any]) -> str | None:
    def by_id(endpoint: str, ref: Any) -> dict[str, Any]:
        wanted = ref.get("id") if isinstance(ref, dict) else None
        return next((o for o in data.get(endpoint, []) if o.get("id") == wanted), {})

    if kind == "sites":
        return obj.get("slug")
    if kind == "power-feeds":
        panel = obj.get("power_panel") or {}
        return (panel.get("site") or by_id("power-panels", panel).get("site") or {}).get("slug")
    if kind in ("power-ports", "power-outlets"):
        return (by_id("devices", obj.get("device")).get("site") or {}).get("slug")
    return (obj.get("site") or {}).get("slug")


class FakeNetbox:
    """``with FakeNetbox(data, token) as nb:`` serves ``data`` (endpoint → objects) at ``nb.url``."""

    def __init__(self, data: dict[str, Any], token: str = "t0ken"):
        self.data = data
        self.token = token
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                fake.requests.append(self.path)
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if parts[:1] != ["api"] or not (parts == ["api", "status"] or (len(parts) == 3 and parts[1] == "dcim")):
                    return self._page(404, fake.data.get("_404", "<!DOCTYPE html><html><body>Page not found</body></html>"))
                if self.headers.get("Authorization") not in (f"Token {fake.token}", f"Bearer {fake.token}"):
                    return self._send(403, {"detail": "Invalid token"})
                if parts == ["api", "status"]:
                    return self._send(200, fake.data.get("status", {}))
                if parts[2] not in fake.data:
                    return self._send(404, {"detail": "Not found."})
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                objs = fake.data[parts[2]]
                if "site" in query:
                    objs = [o for o in objs if _site_of(parts[2], o, fake.data) == query["site"]]
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
                self.send_header("API-Version", "4.6")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _page(self, status: int, text: str) -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
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
