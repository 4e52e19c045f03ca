"""Admission control: how many requests (and prompt tokens) a client keeps waiting for the
engine's first step at once. Past the limit a request is refused at once, so a server can
answer 503 and a load balancer send the work elsewhere, instead of every request waiting."""

from __future__ import annotations

from aioengine.runtime.errors import EngineOverloadedError


class Admission:
    """A request is waiting from the moment it is admitted until its first output (or its
    end) reaches the client: the queue as the engine's scheduler holds it, seen from here."""

    __slots__ = ("_max_requests", "_max_tokens", "_tokens", "_waiting")

    def __init__(self, max_requests: int | None, max_tokens: int | None) -> None:
        self._max_requests = max_requests
        self._max_tokens = max_tokens
        self._waiting: dict[str, int] = {}
        self._tokens = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def waiting_tokens(self) -> int:
        return self._tokens

    def admit(self, key: str, tokens: int) -> None:
        """Count ``key`` as waiting, or raise ``EngineOverloadedError``. An empty queue admits
        any one request, however long its prompt."""
        n = len(self._waiting)
        if n and self._max_requests is not None and n >= self._max_requests:
            raise self._overloaded(f"{n} requests are waiting (max_queued_requests="
                                   f"{self._max_requests})")
        if n and self._max_tokens is not None and self._tokens + tokens > self._max_tokens:
            raise self._overloaded(f"{self._tokens} prompt tokens are waiting and this request "
                                   f"adds {tokens} (max_queued_tokens={self._max_tokens})")
        self._waiting[key] = tokens
        self._tokens += tokens

    def started(self, key: str) -> None:
        """``key`` is no longer waiting (it got its first output, or ended); idempotent."""
        tokens = self._waiting.pop(key, None)
        if tokens is not None:
            self._tokens -= tokens

    def _overloaded(self, why: str) -> EngineOverloadedError:
        return EngineOverloadedError(f"the engine is overloaded: {why}; retry later",
                                     queued_requests=len(self._waiting),
                                     queued_tokens=self._tokens)
