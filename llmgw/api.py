"""What every API module shares: errors as JSON naming the field, their schema, and input checks.

Every error the API answers has one shape, `{"detail": str, "field": str | null}` (serializer
refusals add `errors`, DRF's per-field dict); `documented()` puts it in the schema for the codes an
endpoint can answer, so no view repeats it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from agents.node.protocol import BIDI_CONTROLS
from llmgw.dependencies import not_queued_warnings, warning_added
from llmgw.errors import (
    SHOWN_CHARS,
    WRITE_CONFLICT_TEXT,
    InvalidInput,
    LlmgwError,
    cut_short,
    error_body_cut,
    is_write_conflict,
)
from llmgw.jsonguard import MAX_JSON_DEPTH
from llmgw.parsers import BoundedJSONParser


class ErrorSerializer(serializers.Serializer):
    """The body of every 4xx the API answers."""

    detail = serializers.CharField(help_text="One sentence a person reads, starting with the field it is about.")
    field = serializers.CharField(allow_null=True, help_text="The field (dotted path) at fault, or null.")
    errors = serializers.DictField(required=False, help_text="Serializer refusals only: every field's messages.")


class TextField(serializers.CharField):
    """Text only: a number where text belongs is refused, as the schema says, not turned into text.

    Taken as sent, whitespace included: `"rack:r1-01\n"` is refused by the check that reads it, not
    trimmed into another name behind the sender's back.
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# Words people read in tables, refusals and terminals (a hold's reason): no control character (C0, DEL,
# C1: an escape sequence would drive the terminal of whoever lists them); a lone surrogate is refused too.
WORDS_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"


@extend_schema_field({"type": "string", "pattern": WORDS_PATTERN})
class WordsField(TextField):
    """Text people read: the schema states that it holds no control character; the service refuses one."""


class NumberField(serializers.FloatField):
    """A JSON number in a body: ``true`` is no number of seconds or percent (DRF's FloatField takes it as
    1.0), nor is the text ``"60"``."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class CountedListField(serializers.ListField):
    """A ListField whose length is checked before its items: a million bad items cost one short refusal, not
    a million checks and a million messages (DRF checks ``max_length`` after every item)."""

    def to_internal_value(self, data):
        if isinstance(data, list | tuple) and self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class CountedDictField(serializers.DictField):
    """A DictField of at most ``max_items`` entries (``items``: what they are, for the refusal), counted
    before they are checked."""

    def __init__(self, *, max_items: int, items: str, **kwargs):
        self.max_items = max_items
        self.items = items
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, dict) and len(data) > self.max_items:
            raise serializers.ValidationError(f"at most {self.max_items} {self.items}")
        return super().to_internal_value(data)


# An error body lists at most this many entries at each level (one bad item in a million is named, not all).
ERRORS_LISTED = 20


def _errors_cut(errors: Any) -> Any:
    """DRF's per-field errors with at most ERRORS_LISTED entries of each list and dict, level by level."""
    if isinstance(errors, dict):
        return {key: _errors_cut(value) for key, value in list(errors.items())[:ERRORS_LISTED]}
    if isinstance(errors, list):
        return [_errors_cut(value) for value in errors[:ERRORS_LISTED]]
    return errors


ERROR_TEXT = {
    400: "Bad input: nothing of it was applied; `field` names what is wrong.",
    401: "No credentials, or a token that is not known.",
    403: "The token's role does not allow this (reads need viewer, changes operator, tokens an admin).",
    404: "The named thing is not known.",
    409: "Conflicts with the state now (another change won); read again and retry.",
}


def documented(
    *,
    summary: str,
    ok: dict[int, Any],
    errors: Iterable[int] = (),
    request: Any = None,
    parameters: list[OpenApiParameter] | None = None,
    operation_id: str | None = None,
):
    """extend_schema with the endpoint's answers: `ok` as given, 400 (bad path or query text always
    can be), 401, 403 and `errors` in the shared error shape."""
    responses: dict[int, Any] = dict(ok)
    for code in sorted({400, 401, 403, *errors}):
        responses[code] = OpenApiResponse(ErrorSerializer, description=ERROR_TEXT[code])
    return extend_schema(
        summary=summary, request=request, responses=responses, parameters=parameters, operation_id=operation_id
    )


def exception_handler(exc, context):
    """LlmgwError → its status with {"detail", "field"}; everything else as DRF answers it, in that shape;
    every text in it cut to ERROR_TEXT_CHARS (llmgw.errors.error_body_cut)."""
    response = _error_response(exc, context)
    if response is not None and isinstance(response.data, dict):
        response.data = error_body_cut(response.data)
    return response


def _error_response(exc, context):
    if isinstance(exc, LlmgwError):
        body = {"field": None, **exc.as_dict()}
        if body["field"] is None and isinstance(exc, InvalidInput):
            # A file's refusal that names a line, not a key (YAML that does not parse): the body field
            # that held the file.
            body["field"] = getattr(context.get("view"), "text_field", None)
        retry_after = getattr(exc, "retry_after", None)  # llmgw.parselimit.Busy
        return Response(body, status=exc.status, headers={"Retry-After": str(retry_after)} if retry_after else None)
    if isinstance(exc, DatabaseError) and is_write_conflict(exc):
        # Every writer locks nodes in one order, so this is rare; the client may simply try again.
        return Response({"detail": WRITE_CONFLICT_TEXT, "field": None}, status=status.HTTP_409_CONFLICT)
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(response.data, dict):
        return response
    if response.status_code == status.HTTP_400_BAD_REQUEST and "detail" not in response.data:
        # Serializer errors: keep DRF's per-field dict, and add one sentence naming the first field.
        field, messages = next(iter(response.data.items()), (None, None))
        first = _first_message(messages)
        response.data = {"detail": f"{field}: {first}" if field else first, "field": field or None,
                         "errors": _errors_cut(response.data)}
    response.data.setdefault("field", None)
    return response


def _first_message(messages) -> str:
    while isinstance(messages, list | dict) and messages:
        if isinstance(messages, dict):
            key, messages = next(iter(messages.items()))
            if isinstance(messages, list) and messages and not isinstance(messages[0], list | dict):
                return f"{key}: {messages[0]}"
        else:
            messages = messages[0]
    return str(messages)


# -- text the database cannot store ------------------------------------------------------------------------



# For the schema of free-text query parameters: what text_fault lets through (no NUL, no bidirectional
# control).
STORABLE_TEXT_PATTERN = rf"^[^\x00{BIDI_CONTROLS}]*$"
# The embeddings and isolates that reorder the text after them as it is shown: a hold's reason or a label
# with one reads otherwise in the console and in ctl than it is stored ("Trojan Source").
_BIDI_CONTROLS = re.compile(f"[{BIDI_CONTROLS}]")


def text_fault(value: str) -> str | None:
    """Why PostgreSQL (or a person) cannot take this text: a NUL, a lone surrogate, a bidirectional control;
    None when fine."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        return "must not contain lone surrogates (not valid Unicode)"
    found = _BIDI_CONTROLS.search(value)
    if found:
        return (
            f"must not contain bidirectional control characters (U+{ord(found.group()):04X} at character "
            f"{found.start() + 1}): they show the text in another order than it is"
        )
    return None


def check_text(value: str, field: str) -> None:
    fault = text_fault(value)
    if fault:
        raise InvalidInput(f"{field}: {fault}", field=field)


def check_body(data: Any) -> None:
    """Refuse a body with a NUL or lone surrogate anywhere (keys included), or nested past MAX_JSON_DEPTH,
    naming the field: the services then never hand the database text it answers with an error."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidInput(f"{path or 'body'}: nested deeper than {MAX_JSON_DEPTH} levels", field=path or None)
        if isinstance(value, str):
            check_text(value, path or "body")
        elif isinstance(value, dict):
            for key, item in value.items():
                key_path = f"{path}.{key}" if path else str(key)
                if isinstance(key, str):
                    check_text(key, key_path)
                stack.append((item, key_path, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


class ApiView(APIView):
    """Base of the API's views: path and query text, and a JSON body, checked for what the database
    cannot store before any view code runs; the refusal names the parameter."""

    parser_classes = [BoundedJSONParser]
    # The body field holding a whole file (models.yaml, server.yaml), where a refusal names no key of it.
    text_field: str | None = None

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        for name, value in kwargs.items():
            if isinstance(value, str):
                check_text(value, name)
        for name, values in request.query_params.lists():
            check_text(name, "query")
            for value in values:
                check_text(value, name)
            if len(values) > 1:  # every parameter takes one value: the last would win, the others unread
                shown = cut_short(name, SHOWN_CHARS)
                raise InvalidInput(
                    f"{shown}: given {len(values)} times; give it once (a filter takes several terms in one "
                    "value, separated by spaces)",
                    field=shown,
                )
        if request.method in ("POST", "PUT", "PATCH"):
            check_body(request.data)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        # A change stored whose reconcile could not be queued (Redis down) says so in its `warning`.
        if not_queued_warnings() and response.status_code < 300 and isinstance(response.data, dict):
            response.data["warning"] = warning_added(response.data.get("warning"))
        return response


@csrf_exempt  # a POST to no endpoint is answered the same 404 (the API takes tokens, not a session's form)
def api_not_found(request, *args, **kwargs):
    """Any path under /api/v1/ that names no endpoint, whatever the method: a JSON 404 like the others, not
    an HTML page."""
    from django.http import JsonResponse

    path = cut_short(request.path, SHOWN_CHARS)  # a path of any length is said back in a few words
    return JsonResponse({"detail": f"{path} is not an API endpoint", "field": None}, status=404)
