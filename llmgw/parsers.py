"""The API's JSON parser: DRF's, but JSON nested deeper than MAX_JSON_DEPTH is a 400 before parsing, an
object that gives a key twice is a 400 naming it (json would keep the last unseen), and an operator's body
is parsed in one of the process's parsing slots (llmgw.parselimit; heartbeats take none)."""

from __future__ import annotations

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.utils import json

from llmgw.bodies import HEARTBEAT_PATH
from llmgw.jsonguard import MAX_JSON_DEPTH, json_depth_exceeds, unique_keys
from llmgw.parselimit import parse_slot


class BoundedJSONParser(JSONParser):
    """JSONParser that scans the depth first (without recursion): `[` × 100,000 is refused, not a RecursionError."""

    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        if request is not None and request.path == HEARTBEAT_PATH:  # heartbeats never wait behind an operator
            return self._parse(stream, parser_context)
        with parse_slot("body"):
            return self._parse(stream, parser_context)

    def _parse(self, stream, parser_context):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read() if stream is not None else b""
        if json_depth_exceeds(raw, MAX_JSON_DEPTH):
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels")
        try:
            text = raw.decode(encoding)
            return json.loads(
                text, parse_constant=json.strict_constant if self.strict else None, object_pairs_hook=unique_keys
            )
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise ParseError(f"JSON parse error - {_words(exc)}") from exc


def _words(exc: Exception) -> str:
    """The parser's complaint in a sender's words (Python's about its own limits and terms are not)."""
    text = str(exc)
    if "integer string conversion" in text:
        return "a number of more than 4,300 digits"
    if "not JSON compliant" in text:
        return "NaN and Infinity are not JSON numbers"
    return text
