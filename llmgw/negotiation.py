"""The API's content negotiation: DRF's, with a clear refusal of a format no renderer writes.

A module of its own: DRF's APIView reads the setting naming this class when rest_framework.views is first
imported, so it may not import that module itself (llmgw.api does).
"""

from __future__ import annotations

from rest_framework.negotiation import DefaultContentNegotiation

from llmgw.errors import InvalidInput, value_shown


class ContentNegotiation(DefaultContentNegotiation):
    """A ``?format=`` no renderer of the endpoint writes is a 400 naming ``format`` and the ones it takes
    (DRF answers a bare 404, as if the endpoint were not there)."""

    def filter_renderers(self, renderers, format):
        found = [renderer for renderer in renderers if renderer.format == format]
        if not found:
            formats = sorted({renderer.format for renderer in renderers})
            raise InvalidInput(f"format: one of {', '.join(formats)}; not {value_shown(format)}", field="format")
        return found
