"""Every call llmgw makes to another system is bounded: one total deadline and a size cap.

A timeout per wait bounds nothing: a server that sends its status line, its headers or its body one byte
every half second never lets a 5-second read timeout fire. So one deadline covers the whole call —
connect, status line, headers and body — and is kept at the socket:

- through httpx (:func:`client`, :func:`get`): every wait on the socket is given what is left of the
  deadline, and a wait that starts past it fails at once;
- through requests (:func:`bound_session`, for pynetbox and the Redfish client): a watchdog shuts the
  call's sockets when the deadline passes, which ends whatever read is waiting on them.

The body is read in pieces (:func:`read_within`) and cut at ``max_bytes``. A call that passes either
bound raises :class:`OutboundError` (httpx) or the session's own timeout, whose text says which, so the
caller marks that source down with the reason. Name resolution (DNS) is inside the deadline too
(:func:`resolve`): a resolver that does not answer fails the call when its deadline passes, as a server that
does not answer does. Pure: no Django (the node agent uses it too).
"""

from __future__ import annotations

import contextvars
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

# Read this much at a time: small enough that the deadline is looked at often.
CHUNK_BYTES = 64 * 1024


class OutboundError(Exception):
    """A call to another system that failed or passed a bound; the text is the reason a person reads."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the other system answered, read whole within the bounds."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        import json

        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise OutboundError(f"answered HTTP {self.status} with no JSON ({exc})") from None


# -- the deadline ------------------------------------------------------------------------------------------

_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("llmgw_outbound_deadline", default=None)


class Deadline:
    """One call's total deadline, ``seconds`` from now, for the sockets opened or used inside ``with``.

    ``expired`` says, after the call failed, whether the deadline is why. Sockets are handed over by the
    transports of :func:`client` and :func:`bound_session`; a watchdog starts with the first one and
    shuts them all when the deadline passes.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._token: contextvars.Token | None = None

    def left(self) -> float:
        return self.at - time.monotonic()

    def watch(self, sock: Any) -> None:
        """Shut ``sock`` when the deadline passes (at once if it has)."""
        if sock is None:
            return
        with self._lock:
            if not self.expired:
                self._sockets.append(sock)
                if self._timer is None:
                    self._timer = threading.Timer(max(self.left(), 0.0), self._expire)
                    self._timer.daemon = True
                    self._timer.start()
                return
        _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)

    def __enter__(self) -> Deadline:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
            self._sockets = []
        if timer is not None:
            timer.cancel()
        if self._token is not None:
            _current.reset(self._token)
            self._token = None


def _shut(sock: Any) -> None:
    """End every wait on ``sock``: its reader sees the end of the stream (the socket's, not TLS's, method:
    another thread may be inside a TLS read)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, TypeError):  # closed already, or detached into a TLS socket
        pass


def _within(timeout: float | None) -> float | None:
    """``timeout`` (one wait's) cut to what is left of the current call's deadline; raises once it is spent."""
    deadline = _current.get()
    if deadline is None:
        return timeout
    left = deadline.left()
    if left <= 0:
        deadline.expired = True
        raise TimeoutError(f"the call's {deadline.seconds:g} s were spent")
    return left if timeout is None else min(timeout, left)


# getaddrinfo cannot be interrupted, so it runs in these threads and the call waits for it only until its
# deadline: a resolver that never answers holds at most this many threads, and later calls queue behind them
# within their own deadlines.
RESOLVER_THREADS = 4
_resolver = ThreadPoolExecutor(max_workers=RESOLVER_THREADS, thread_name_prefix="llmgw-resolve")


def resolve(host: str, port: int) -> list[str]:
    """The addresses of ``host`` (``socket.getaddrinfo``'s, in its order) within the current call's deadline;
    TimeoutError once it passes, socket.gaierror for a name that does not resolve. An address is its own
    answer; outside a :class:`Deadline` the resolver is waited for as it is."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return [host.strip("[]")]
    except ValueError:
        pass
    deadline = _current.get()
    if deadline is None:
        return _addresses(host, port)
    left = _within(None)
    future = _resolver.submit(_addresses, host, port)
    try:
        return future.result(timeout=left)
    except TimeoutError:
        future.cancel()
        deadline.expired = True
        raise TimeoutError(f"resolving {host} took longer than the call's {deadline.seconds:g} s") from None


def _addresses(host: str, port: int) -> list[str]:
    out: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        if sockaddr[0] not in out:
            out.append(sockaddr[0])
    return out


def read_within(read: Callable[[int], bytes], *, deadline_at: float, max_bytes: int, what: str = "the answer") -> bytes:
    """Call ``read(n)`` until it returns b"", the deadline (a ``time.monotonic()``) passes or more than
    ``max_bytes`` came: the body, or OutboundError saying which bound it passed.

    ``read`` must return what has arrived (up to n bytes), not wait for n: ``read1``, not ``read``.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline_at:
            raise OutboundError(f"{what} took longer than its deadline (cut after {size:,} bytes)")
        chunk = read(CHUNK_BYTES)
        if not chunk:
            if time.monotonic() > deadline_at:  # the watchdog's cut looks like the end of the stream
                raise OutboundError(f"{what} took longer than its deadline (cut after {size:,} bytes)")
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise OutboundError(f"{what} is larger than {max_bytes:,} bytes")
        chunks.append(chunk)


def is_time_limit(exc: BaseException) -> bool:
    """Whether ``exc`` is a task's time limit (Celery's soft limit): never swallowed as a source's failure."""
    return type(exc).__name__ in ("SoftTimeLimitExceeded", "TimeLimitExceeded")


# -- httpx -------------------------------------------------------------------------------------------------


def client(**kwargs: Any) -> Any:
    """An httpx.Client whose every wait on a socket (connect, TLS, each write, each read: status line and
    headers included) is held to the deadline of the :func:`get` it serves. ``kwargs`` go to httpx.Client."""
    import httpx

    return httpx.Client(transport=_transport(verify=kwargs.pop("verify", True)), **kwargs)


def _transport(*, verify: Any) -> Any:
    import httpcore
    import httpx

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: httpcore.NetworkStream):
            self._inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            try:
                timeout = _within(timeout)
            except TimeoutError as exc:
                raise httpcore.ReadTimeout(str(exc)) from None
            return self._inner.read(max_bytes, timeout)

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            try:
                timeout = _within(timeout)
            except TimeoutError as exc:
                raise httpcore.WriteTimeout(str(exc)) from None
            self._inner.write(buffer, timeout)

        def close(self) -> None:
            self._inner.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            try:
                timeout = _within(timeout)
            except TimeoutError as exc:
                raise httpcore.ConnectTimeout(str(exc)) from None
            return Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

        def get_extra_info(self, info: str) -> Any:
            return self._inner.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def __init__(self):
            self._inner = httpcore.SyncBackend()

        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            try:
                addresses = resolve(host, port)
            except TimeoutError as exc:
                raise httpcore.ConnectTimeout(str(exc)) from None
            except OSError as exc:  # the name does not resolve
                raise httpcore.ConnectError(f"{host}: {exc}") from None
            for n, address in enumerate(addresses, 1):  # each address in turn, as a name's own connect would
                try:
                    left = _within(timeout)
                except TimeoutError as exc:
                    raise httpcore.ConnectTimeout(str(exc)) from None
                try:
                    return Stream(self._inner.connect_tcp(address, port, left, local_address, socket_options))
                except httpcore.ConnectError:
                    if n == len(addresses):
                        raise
            raise httpcore.ConnectError(f"{host}: no address")

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            try:
                timeout = _within(timeout)
            except TimeoutError as exc:
                raise httpcore.ConnectTimeout(str(exc)) from None
            return Stream(self._inner.connect_unix_socket(path, timeout, socket_options))

        def sleep(self, seconds: float) -> None:
            self._inner.sleep(seconds)

    class Transport(httpx.HTTPTransport):
        def __init__(self):  # httpx's transport (its errors, its streams) on a pool of sockets that keep the deadline
            self._pool = httpcore.ConnectionPool(
                ssl_context=httpx.create_ssl_context(verify=verify), network_backend=Backend()
            )

    return Transport()


def get(
    client: Any,
    url: str,
    *,
    deadline_seconds: float,
    max_bytes: int,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """GET ``url`` through ``client`` (from :func:`client`) within ``deadline_seconds`` in all and ``max_bytes``.

    The deadline covers the whole call: connect, the status line and headers, and the body.
    """
    import httpx

    try:
        with Deadline(deadline_seconds) as deadline:
            timeout = httpx.Timeout(max(0.05, deadline.left()))
            with client.stream("GET", url, params=params, headers=headers, timeout=timeout) as response:
                stream = response.iter_bytes()  # as it arrives: a chunk size would wait to fill it

                def read(_: int) -> bytes:
                    return next(stream, b"")

                body = read_within(read, deadline_at=deadline.at, max_bytes=max_bytes)
                return Answer(response.status_code, dict(response.headers), body)
    except httpx.TimeoutException:
        raise OutboundError(f"no answer within {deadline_seconds:.3g} s") from None
    except httpx.HTTPError as exc:
        raise OutboundError(f"{type(exc).__name__}: {str(exc)[:200]}") from None


# -- requests ----------------------------------------------------------------------------------------------


def bound_session(session: Any) -> Any:
    """Make a requests.Session's connections keep the deadline of the :class:`Deadline` each call is made
    in: its sockets are handed to the deadline, whose watchdog shuts them when it passes (requests'
    timeout bounds each wait on the socket, not the call). Returns ``session``."""
    adapter = _adapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _not_cut_by_a_deadline(record: Any) -> bool:
    """A logging filter: urllib3's "Failed to parse headers" about a head the deadline cut is no news (the
    call fails with the deadline's reason)."""
    deadline = _current.get()
    return deadline is None or not deadline.expired


def _adapter() -> Any:
    import logging

    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
    from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError

    def watched(sock: Any) -> Any:
        deadline = _current.get()
        if deadline is not None:
            deadline.watch(sock)
        return sock

    class Watched:
        def _new_conn(self):  # the connection's socket, before TLS wraps it
            name = self._dns_host
            if _current.get() is None:
                return watched(super()._new_conn())
            try:
                addresses = resolve(name, self.port)
            except socket.gaierror as exc:
                raise NameResolutionError(self.host, self, exc) from exc
            except TimeoutError as exc:
                raise ConnectTimeoutError(self, str(exc)) from None
            # The resolved address is connected to; the name stays the request's Host and the TLS name.
            for n, address in enumerate(addresses, 1):
                self._dns_host = address
                try:
                    return watched(super()._new_conn())
                except (NewConnectionError, ConnectTimeoutError):
                    if n == len(addresses):
                        raise
                finally:
                    self._dns_host = name
            raise NameResolutionError(self.host, self, socket.gaierror(f"{name}: no address"))

        def getresponse(self, *args, **kwargs):  # the status line and headers: the wait a trickle stretches
            watched(self.sock)
            response = super().getresponse(*args, **kwargs)
            deadline = _current.get()
            if deadline is not None and deadline.expired:  # a head cut short reads as a whole one
                response.close()
                raise TimeoutError(f"no answer within {deadline.seconds:.3g} s")
            return response

    class Connection(Watched, HTTPConnection):
        pass

    class TLSConnection(Watched, HTTPSConnection):
        pass

    class Pool(HTTPConnectionPool):
        ConnectionCls = Connection

    class TLSPool(HTTPSConnectionPool):
        ConnectionCls = TLSConnection

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args, **kwargs):
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {"http": Pool, "https": TLSPool}

    logging.getLogger("urllib3.connection").addFilter(_not_cut_by_a_deadline)
    return Adapter()
