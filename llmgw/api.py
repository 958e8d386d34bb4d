"""What every API module shares: errors as JSON naming the field."""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from llmgw.errors import LlmgwError


def exception_handler(exc, context):
    """LlmgwError → its status with {"detail", "field"}; everything else as DRF answers it."""
    if isinstance(exc, LlmgwError):
        return Response(exc.as_dict(), status=exc.status)
    response = drf_exception_handler(exc, context)
    if response is not None and response.status_code == status.HTTP_400_BAD_REQUEST and isinstance(response.data, dict):
        # Serializer errors: keep DRF's per-field dict, and add one sentence naming the first field.
        field, messages = next(iter(response.data.items()), (None, None))
        if field and "detail" not in response.data:
            first = _first_message(messages)
            response.data = {"detail": f"{field}: {first}", "field": field, "errors": response.data}
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
