"""API keys: ``Authorization: Bearer <key>`` (or ``x-api-key: <key>``, as Anthropic's SDKs and
Claude Code send it) on the API routes.

Keys are compared as SHA-256 digests with ``hmac.compare_digest``, so the time a check takes
says nothing about how much of a guess was right, nor about a key's length; every configured
key is compared on every request. Keys are never logged or echoed in an error.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # aiohttp is imported where the middleware is made: ``python -m
    # aioengine.serve`` reads its arguments (collect_keys) and starts the engine while the
    # server's own imports (aiohttp, jinja2: a noticeable part of start-up) run in a thread
    from aiohttp import web
    from aiohttp.typedefs import Middleware

    from aioengine.server.errors import ApiError

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

API_KEY_ENV = "AIOENGINE_API_KEY"
OPEN_PATHS = frozenset({"/health", "/metrics"})  # for probes and scrapers, unless closed too


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def read_key_file(path: str) -> list[str]:
    """One key per line; blank lines and ``#`` comments skipped. ValueError naming the file
    (never a key) when it is unreadable or holds none."""
    try:
        with open(path, encoding="utf-8") as f:
            keys = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    except OSError as e:
        raise ValueError(f"cannot read the API key file {path!r}: {e.strerror}") from e
    if not keys:
        raise ValueError(f"the API key file {path!r} holds no key")
    return keys


def collect_keys(given: Iterable[str], key_file: str | None) -> tuple[str, ...]:
    """``--api-key`` values, the key file's lines and ``$AIOENGINE_API_KEY``, each once."""
    keys = list(given)
    if key_file:
        keys += read_key_file(key_file)
    env = os.environ.get(API_KEY_ENV, "").strip()
    if env:
        keys.append(env)
    return tuple(dict.fromkeys(keys))


def api_key_middleware(keys: Iterable[str], protect_open_paths: bool = False) -> Middleware:
    """Refuse requests without a configured key (401, OpenAI's error shape); ``/health`` and
    ``/metrics`` stay open unless ``protect_open_paths``. CORS preflights (OPTIONS) pass: a
    browser sends them without credentials."""
    digests = [_digest(k) for k in keys]
    if not digests or any(not k for k in keys):
        raise ValueError("API keys must be non-empty strings")

    from aiohttp import web

    @web.middleware
    async def check_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" or (request.path in OPEN_PATHS
                                           and not protect_open_paths):
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            token = request.headers.get("x-api-key", "")
        if not token.strip():
            raise _unauthorized("missing API key: send it as 'Authorization: Bearer <key>' "
                                "or 'x-api-key: <key>'")
        given = _digest(token.strip())
        matched = False
        for digest in digests:  # no early exit: the time does not tell which key matched
            matched |= hmac.compare_digest(given, digest)
        if not matched:
            raise _unauthorized("incorrect API key provided")
        return await handler(request)

    return check_api_key


def _unauthorized(message: str) -> ApiError:
    from aioengine.server.errors import ApiError

    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
