"""`llmgw ctl` as a client of the REST API, kubectl-style: from a laptop, without Django.

Remote mode is on when LLMGW_URL or `llmgw ctl --server URL` names a control plane; the token comes from
LLMGW_TOKEN, else from the token file `llmgw ctl login` wrote (``$XDG_CONFIG_HOME/llmgw/token``, mode 0600).
Each command reads through `read`/`write`: the local selectors and services where the database is, the
API's JSON here, and one renderer prints both. This module and the command modules' top levels import
no Django, so a remote listing starts in a fraction of a second.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

from llmgw.errors import Conflict, InvalidInput, LlmgwError, NotFound

TIMEOUT_SECONDS = 60


def config_dir() -> Path:
    """Where ctl keeps its token: $XDG_CONFIG_HOME/llmgw, else ~/.config/llmgw."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmgw"


def token_path() -> Path:
    return config_dir() / "token"


def token_save(token: str) -> Path:
    """Write the token file readable by its owner only (created 0600, never briefly wider)."""
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token.strip() + "\n")
    os.chmod(path, 0o600)
    return path


def token_load() -> str | None:
    if os.environ.get("LLMGW_TOKEN"):
        return os.environ["LLMGW_TOKEN"].strip()
    try:
        return token_path().read_text().strip() or None
    except OSError:
        return None


# GET /nodes answers a filter that finds nothing with what it could have meant in this header (JSON: the
# console's words, NodeFilterSet.suggestions), so ctl nodes says it remote as it does on the database.
SUGGESTIONS_HEADER = "Llmgw-Suggestions"


class Remote:
    """The control plane's API at `url` (…/api/v1/ is added), with an API token."""

    def __init__(self, url: str, token: str | None, token_from: str | None = None):
        self.url = url.rstrip("/")
        self.token = token
        # Where the token was read (a refusal says where to look): LLMGW_TOKEN, a file; None: the saved one.
        self.token_from = token_from
        # The last request answered with JSON (``GET /api/v1/nodes``): an answer of a shape no llmgw writes
        # fails the command's reading of it, and ctl then names this (wrong_shape).
        self.answered: str | None = None
        self.headers: dict[str, str] = {}  # the last answer's headers, names in lower case

    def call(
        self, method: str, path: str, *, params: dict | None = None, body: Any = None, timeout: float = TIMEOUT_SECONDS
    ) -> Any:
        """The decoded JSON answer (None when empty); the API's {"detail","field"} raised as the local error."""
        import urllib.error  # here: local mode, on the database, never loads the HTTP client
        import urllib.parse
        import urllib.request

        url = f"{self.url}/api/v1/{path.lstrip('/')}"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                self.headers = {name.lower(): value for name, value in response.headers.items()}
        except urllib.error.HTTPError as exc:
            raise self.error(exc.code, exc.read()) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LlmgwError(f"cannot reach {self.url}: {reason}") from None
        if not raw:
            return None
        try:
            decoded = _decoded(raw)
        except ValueError:
            # Another server at that address (a web app answering every path with its page, a proxy's login).
            raise LlmgwError(
                f"{self.url} answered {method} /api/v1/{path.lstrip('/')} with no JSON: is it llmgw's address?"
            ) from None
        self.answered = f"{method} /api/v1/{path.lstrip('/')}"
        return decoded

    def wrong_shape(self, exc: Exception) -> LlmgwError | None:
        """What to say when reading an answer failed (`exc`: a TypeError, KeyError … of the command's
        reading): JSON, but not the shape llmgw's API answers there — another server at the address (a
        proxy's or another app's JSON). None when no answer was read yet: the failure is not the answer's."""
        if self.answered is None or not isinstance(exc, TypeError | KeyError | AttributeError | IndexError | ValueError):
            return None
        return LlmgwError(
            f"{self.url} answered {self.answered} with JSON of a shape llmgw's API does not answer: is it llmgw's address?"
        )

    def error(self, code: int, raw: bytes) -> LlmgwError:
        """The error local mode would raise: the API's words, its field, its kind."""
        try:
            body = _decoded(raw)
            detail, field = str(body["detail"]), body.get("field")
        except (ValueError, KeyError, TypeError):
            detail, field = f"the server answered {code}", None
        if code == 401:
            how = "llmgw ctl token create USER --role operator, then llmgw ctl login"
            if not self.token:
                return LlmgwError(f"{self.url} asks for a token and none is set: log in ({how}) or set LLMGW_TOKEN")
            where = self.token_from or ("LLMGW_TOKEN" if os.environ.get("LLMGW_TOKEN") else str(token_path()))
            return LlmgwError(f"{self.url} refused the token ({code}: {detail}); check {where} ({how})")
        if code == 403:  # the token is good, its user's role is not enough (viewer, not operator)
            return LlmgwError(f"{self.url} refused: {detail}")
        kind = {404: NotFound, 409: Conflict}.get(code, InvalidInput if code == 400 else LlmgwError)
        return kind(detail, field=field)


def _decoded(raw: bytes) -> Any:
    """An answer's JSON; ValueError for text that is none, or that nests deeper than Python's parser goes
    (no answer of llmgw's does)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deep") from None


def path_part(value: str, field: str, *, safe: str = "") -> str:
    """A name given on the command line as one part of an API path, %-escaped; InvalidInput naming ``field``
    for text no path carries (a lone surrogate: a byte the shell passed that is not UTF-8), in either mode."""
    try:
        return quote(value, safe=safe)
    except UnicodeEncodeError:
        raise InvalidInput(f"{field}: must not contain lone surrogates (not valid Unicode)", field=field) from None


def remote_from(server: str | None) -> Remote | None:
    """The API to talk to (--server, else LLMGW_URL), or None: work on the database here."""
    url = server or os.environ.get("LLMGW_URL")
    if not url:
        return None
    where = "--server" if server else "LLMGW_URL"
    scheme, found, rest = url.partition("://")
    if not found:
        raise InvalidInput(f"{where}: {url!r} has no scheme; write http://{url} (or https://)", field="server")
    if scheme.lower() not in ("http", "https"):
        raise InvalidInput(
            f"{where}: {url!r}: the API is served over http:// or https://, not {scheme}://", field="server"
        )
    # The server's address, as people copy it from a browser: the scheme in any case, the API's own path
    # (/api/v1) or none after it.
    if not rest.split("/", 1)[0]:
        raise InvalidInput(f"{where}: {url!r} names no host; write {scheme.lower()}://HOST:PORT", field="server")
    base = f"{scheme.lower()}://{rest}".rstrip("/")
    if base.endswith("/api/v1"):
        base = base[: -len("/api/v1")]
    return Remote(base, token_load())


def read(args, path: str, local: Callable[[], Any], **params: Any) -> Any:
    """What `local()` returns where the database is, or the API's GET `path` in remote mode."""
    remote: Remote | None = getattr(args, "remote", None)
    if remote is None:
        return local()
    return remote.call("GET", path, params=params)


# The page a paged listing is read by (GET /replicas answers at most 1,000 a request).
PAGE = 1000


def read_pages(args, path: str, local: Callable[[], list], **params: Any) -> list:
    """Every row of a paged listing: `local()` where the database is, else the API's GET `path` a page at a
    time (``offset``, ``limit``) until a page comes back shorter than asked."""
    remote: Remote | None = getattr(args, "remote", None)
    if remote is None:
        return local()
    rows: list = []
    while True:
        page = remote.call("GET", path, params={**params, "offset": len(rows), "limit": PAGE})
        rows.extend(page)
        if len(page) < PAGE:
            return rows


def listing(handler: Callable[[Any], int]) -> Callable[[Any], int]:
    """Mark a command that only reads (in local mode too: no write, no signal, no task): llmgw.ctl then
    starts Django with the listings' apps (settings.CTL_READ_APPS), not the whole web stack."""
    handler.read_only = True  # type: ignore[attr-defined]
    return handler


def write(
    args, method: str, path: str, body: Any, local: Callable[[], Any], *, timeout: float = TIMEOUT_SECONDS
) -> Any:
    """`local()` (the services) where the database is, or the API's `method` on `path` in remote mode."""
    remote: Remote | None = getattr(args, "remote", None)
    if remote is None:
        return local()
    return remote.call(method, path, body=body, timeout=timeout)


def local_only(args, command: str) -> None:
    """Refuse, in remote mode, a command the API has no endpoint for (today every command has one)."""
    if getattr(args, "remote", None) is not None:
        raise LlmgwError(
            f"`llmgw ctl {command}` has no API yet: run it where the control plane's database is "
            "(without --server and LLMGW_URL)"
        )


class LazyModule(ModuleType):
    """A module imported when first used: command modules name Django's modules at the top, and a
    remote command, which never uses them, never imports them."""

    def __init__(self, name: str):
        super().__init__(name)
        self._lazy_name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._lazy_name), attr)


def lazy(name: str) -> Any:
    return LazyModule(name)
