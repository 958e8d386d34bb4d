"""What llmgw's own middleware share: running in either mode Django serves in."""

from __future__ import annotations


class EitherMode:
    """A middleware for WSGI and ASGI alike: under ASGI (every middleware of the stack async-capable) a
    request crosses into a thread once, for the view. A subclass answers in ``__call__`` (sync) and
    ``__acall__`` (async); ``__call__`` hands an async request to ``__acall__`` first."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        from asgiref.sync import iscoroutinefunction, markcoroutinefunction

        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
