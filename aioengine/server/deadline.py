"""A request's deadline: the server's ``--request-timeout`` or the request's own ``timeout``,
and the 504 answered past it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aioengine.server.errors import ApiError


class RequestTimedOut(Exception):
    """The request's deadline passed before it finished; the message says which deadline."""


def timed_out(e: RequestTimedOut) -> ApiError:
    return ApiError(504, str(e), code="timeout")


class Deadline:
    """When a request must be done: the server's ``--request-timeout`` or the request's own
    ``timeout``, whichever is sooner, counted from its arrival. Past it the request is
    aborted in the engine (the runner's cleanup) and answered with ``RequestTimedOut``."""

    def __init__(self, seconds: float | None, why: str) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._at = None if seconds is None else loop.time() + seconds
        self._why = why

    @classmethod
    def of(cls, server: float | None, request: float | None) -> Deadline:
        if request is not None and (server is None or request < server):
            return cls(request, f"its timeout of {request:g} s")
        if server is not None:
            return cls(server, f"the server's --request-timeout of {server:g} s")
        return cls(None, "")

    def _left(self) -> float | None:
        return None if self._at is None else self._at - self._loop.time()

    def _expired(self) -> RequestTimedOut:
        return RequestTimedOut(f"the request did not finish within {self._why}; it was "
                               "aborted")

    async def run(self, awaitable: Any) -> Any:
        left = self._left()
        if left is None:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, max(left, 0.0))
        except asyncio.TimeoutError:
            raise self._expired() from None

    def bound(self, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """``events`` cut at the deadline; ``events`` itself when there is none (no extra
        generator layer per token)."""
        return events if self._at is None else self._bounded(events)

    async def _bounded(self, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        it = events.__aiter__()
        while True:
            try:
                item = await self.run(it.__anext__())
            except StopAsyncIteration:
                return
            yield item
