"""Console requests whose path or query holds text the database cannot take (a NUL, a lone surrogate): a
4xx before any view runs, not the 500 PostgreSQL's refusal would make of it. The API checks its own
requests (llmgw.api.ApiView), answering in its error shape with the parameter named.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseNotFound
from django.utils.html import escape

from llmgw.api import text_fault
from llmgw.middleware import EitherMode


def refusal(request: HttpRequest) -> HttpResponse | None:
    """404 for a path no page can have, 400 naming the query parameter; None when the request is fine."""
    path = request.path
    if path.startswith("/api/"):
        return None
    if text_fault(path):
        return HttpResponseNotFound("<!doctype html>\n<title>Not found · llmgw</title>\n<h1>No such page</h1>\n")
    for name, values in request.GET.lists():
        for text, field in ((name, "query"), *((value, name) for value in values)):
            fault = text_fault(text)
            if fault:
                shown = escape(field if text_fault(field) is None else "query")
                return HttpResponseBadRequest(
                    f"<!doctype html>\n<title>Bad request · llmgw</title>\n<h1>{shown}: {escape(fault)}</h1>\n"
                )
    return None


class StorableTextMiddleware(EitherMode):
    """Answers :func:`refusal`'s 4xx in place of the view."""

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        return refusal(request) or self.get_response(request)

    async def __acall__(self, request):
        return refusal(request) or await self.get_response(request)
