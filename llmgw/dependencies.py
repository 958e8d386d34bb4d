"""PostgreSQL or Redis down: a prompt 503 that says so, and writes that say what they could not queue.

The database: a request waits at most LLMGW_DB_POOL_TIMEOUT for a connection (LLMGW_DB_CONNECT_TIMEOUT for
a new one; refused is at once), then DependenciesMiddleware answers **503** with `Retry-After`: under
/api/ (heartbeats included) the API's error shape, `{"detail", "field": null}`; elsewhere a short HTML
page. Nothing remembers the outage: the pool checks a connection before it hands it out, and gives up a
failed reconnection soon (settings), so the first requests after the database is back are served.

Heartbeats have connections of their own (LLMGW_DB_HEARTBEAT_POOL_SIZE, `heartbeat_lane`): however many
other requests hold the pool's, a heartbeat is not answered 503 while the database is up.

Redis: heartbeats and reads do not need it. A change that asks for a reconcile is stored and answered;
when the task could not be queued (`task_not_queued`), the answer says so: a `Warning` header, the API's
`warning` field (llmgw.api.ApiView), and a message on the console's next page.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time

from django.http import HttpRequest, HttpResponse, JsonResponse

from llmgw.middleware import EitherMode

log = logging.getLogger(__name__)

# What a client is told to wait before it tries again (seconds).
RETRY_AFTER_SECONDS = 5

DATABASE_DOWN_TEXT = "the database is not reachable now; try again in a few seconds"
DATABASE_DOWN_PAGE = (
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Unavailable · llmgw</title></head>\n"
    "<body><h1>llmgw is unavailable</h1>\n"
    "<p>The database is not reachable now. This page works again as soon as it is back: "
    "reload it in a few seconds.</p></body></html>\n"
)

# SQLSTATEs that say the server cannot serve now: connection exceptions (class 08), shutting down or
# starting up (57P01-57P03), too many connections (53300).
UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


# Whether this request is a heartbeat: its database connection then comes from the heartbeats' own pool
# (llmgw.postgresql), so an operator's burst that holds every other connection never makes it wait. Set for
# the request by llmgw.bodies.BoundedBodies; threads the request's code runs in see it.
heartbeat_lane: contextvars.ContextVar[bool] = contextvars.ContextVar("llmgw_heartbeat_lane", default=False)


def is_database_unavailable(exc: BaseException) -> bool:
    """Whether a database error says PostgreSQL is down or out of reach (refused, gone, no connection from
    the pool in time), rather than refusing a statement. Django wraps psycopg's error as its own; the
    original is its cause. SQLite's errors are never this (its file is local)."""
    for error in (exc, exc.__cause__):
        if error is None or not type(error).__module__.startswith("psycopg"):
            continue
        from psycopg import InterfaceError, OperationalError

        if isinstance(error, InterfaceError):
            return "connection" in str(error)  # closed or lost, not a cursor misused
        if not isinstance(error, OperationalError):
            continue
        state = getattr(error, "sqlstate", None)
        # No SQLSTATE: the error is the client's (refused, timed out, connection lost, the pool's timeout).
        return state is None or state.startswith("08") or state in UNAVAILABLE_STATES
    return False


def database_down_response(request: HttpRequest) -> HttpResponse:
    """503 with Retry-After: JSON in the API's error shape under /api/, a short HTML page elsewhere."""
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": DATABASE_DOWN_TEXT, "field": None}, status=503)
    else:
        response = HttpResponse(DATABASE_DOWN_PAGE, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response._has_been_logged = True  # not one ERROR line a request: DependenciesMiddleware logs them, spaced
    return response


# -- what a request could not queue ------------------------------------------------------------------------

# The request's list of notes (None outside a request). A list, appended to: a view run in a thread of
# its own (ASGI) shares it with the middleware that made it.
_not_queued: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("llmgw_not_queued", default=None)


def task_not_queued(what: str, exc: BaseException) -> None:
    """`what` (a task) could not be sent to the workers, Redis being down or out of reach: logged, and said
    in the answer of the request that asked (if any). The change that asked is stored all the same."""
    log.warning("%s not queued: the task broker (Redis) is not reachable: %s", what, exc)
    notes = _not_queued.get()
    if notes is not None:
        text = (
            f"{what} not queued: the task broker (Redis) is not reachable; the change is stored, and placement "
            "follows it once Redis is back"
        )
        if text not in notes:
            notes.append(text)


def not_queued_warnings() -> list[str]:
    """What this request could not queue (empty outside a request)."""
    return list(_not_queued.get() or ())


def warning_added(existing: str | None) -> str | None:
    """The API's `warning` field with what this request could not queue appended."""
    parts = [existing] if existing else []
    parts += not_queued_warnings()
    return "; ".join(parts) or None


# -- the middleware ----------------------------------------------------------------------------------------

_log_lock = threading.Lock()
_log_state = {"at": 0.0, "count": 0}
LOG_EVERY_SECONDS = 10.0


def _log_database_down(exc: BaseException) -> None:
    """One line every LOG_EVERY_SECONDS at most, with how many requests were answered 503 since."""
    now = time.monotonic()
    with _log_lock:
        _log_state["count"] += 1
        if now - _log_state["at"] < LOG_EVERY_SECONDS:
            return
        count, _log_state["count"], _log_state["at"] = _log_state["count"], 0, now
    log.warning("database not reachable, %d request(s) answered 503: %s", count, str(exc).strip() or type(exc).__name__)


class DependenciesMiddleware(EitherMode):
    """A request that finds the database down is answered 503 (the view's error, not a 500 page); what a
    request could not queue is said in its answer (see the module's text)."""

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        notes: list[str] = []
        token = _not_queued.set(notes)
        try:
            response = self.get_response(request)
        finally:
            _not_queued.reset(token)
        return self._with_notes(request, response, notes)

    async def __acall__(self, request):
        notes: list[str] = []
        token = _not_queued.set(notes)
        try:
            response = await self.get_response(request)
        finally:
            _not_queued.reset(token)
        return self._with_notes(request, response, notes)

    def process_exception(self, request, exception):
        if not is_database_unavailable(exception):
            return None
        _log_database_down(exception)
        return database_down_response(request)

    @staticmethod
    def _with_notes(request, response, notes: list[str]):
        if not notes:
            return response
        # RFC 9110 calls the field obsolete, but tools still show it; 199 is "miscellaneous warning".
        response["Warning"] = ", ".join(f'199 llmgw "{text}"' for text in notes)
        if not request.path.startswith("/api/") and hasattr(request, "_messages"):
            from django.contrib import messages

            for text in notes:
                messages.warning(request, text)  # shown on the console's next page
        return response
