"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``; on the
Anthropic Messages routes Anthropic's: ``{"type": "error", "error": {"type", "message"}}``.

Handlers raise ``ApiError``; the middleware turns it (and aiohttp's own 404/405/413, the API-key
check's 401, and any unexpected exception) into the route's body, so every failure a client
sees has the shape its SDK reads.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "timeout_error",
          413: "invalid_request_error", 415: "invalid_request_error", 500: "internal_server_error",
          503: "service_unavailable_error", 504: "timeout_error"}
# Anthropic's error types by status (its docs' "HTTP errors" table); anything else api_error.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error",
                    405: "invalid_request_error", 408: "timeout_error",
                    413: "request_too_large", 415: "invalid_request_error",
                    429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
"""Routes that answer errors in Anthropic's shape (matched as path suffixes: the app may be
mounted under a prefix)."""


class ApiError(Exception):
    """A request the server refuses; ``status`` is the HTTP status, ``param`` the field."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type_: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or {}
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def anthropic_body(self) -> dict[str, object]:
        """Anthropic's shape has no ``param``: the message names the field instead."""
        message = self.message
        if self.param and self.param not in message:
            message = f"{self.param}: {message}"
        return {"type": "error", "error": {
            "type": _ANTHROPIC_TYPES.get(self.status, "api_error"), "message": message}}

    def response(self, anthropic: bool = False) -> web.Response:
        body = self.anthropic_body() if anthropic else self.body()
        return web.Response(status=self.status, body=msgspec.json.encode(body),
                            content_type="application/json", headers=self.headers)


_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_FIELD = re.compile(r"(unknown|missing required) field `([^`]+)`")


def from_decode_error(err: msgspec.DecodeError) -> ApiError:
    """Turn msgspec's message (``Expected `int`, got `str` - at `$.n```) into a 400 naming the
    parameter it points at; an unknown or missing field inside an object by its path
    (``messages[1].refusal``)."""
    text = str(err)
    if isinstance(err, msgspec.ValidationError):
        field = _FIELD.search(text)
        at = _PATH.search(text)
        where = at.group(1) if at else ""  # "" at the top level
        param = where or None
        if field:
            name = field.group(2)
            param = f"{where}.{name}" if where else name
            if field.group(1) == "unknown":
                text = f"unsupported parameter `{name}`: {text}"
        return ApiError(400, f"invalid request: {text}", param=param, code="invalid_parameter")
    return ApiError(400, f"malformed JSON body: {text}", code="invalid_json")


def engine_dead(err: BaseException) -> ApiError:
    """503 for a dead engine. Only the first line of the cause goes to the HTTP client: an
    engine failure carries the engine's traceback, which the client library already logged."""
    return ApiError(503, f"the engine is dead: {first_line(err)}", code="engine_dead")


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.split("\n", 1)[0] if text else type(err).__name__


def from_value_error(err: ValueError) -> ApiError:
    """``SamplingParams`` and the client raise ``ValueError`` whose message starts with the
    offending field's name."""
    text = str(err)
    first = text.split(" ", 1)[0]
    param = first if first.isidentifier() else None
    return ApiError(400, text, param=param, code="invalid_parameter")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RefusalLog:
    """Logs refused requests (status, route, reason; never a body or a key) at DEBUG, at most
    ``per_second`` lines a second: a flood of bad requests costs a few lines and a count."""

    def __init__(self, per_second: int = 20) -> None:
        self.per_second = per_second
        self._window = 0
        self._logged = 0
        self._suppressed = 0

    def log(self, request: web.Request, err: ApiError) -> None:
        if not logger.isEnabledFor(logging.DEBUG):
            return
        now = int(time.monotonic())
        if now != self._window:
            if self._suppressed:
                logger.debug("refused %d more request(s) in the last second (not shown)",
                             self._suppressed)
            self._window, self._logged, self._suppressed = now, 0, 0
        if self._logged >= self.per_second:
            self._suppressed += 1
            return
        self._logged += 1
        logger.debug("refused %s %s from %s: %d %s: %s", request.method, request.path,
                     request.remote, err.status, err.code, err.message[:200])


def error_middleware(refusals: RefusalLog) -> Middleware:
    """Turns ``ApiError``, aiohttp's HTTP errors and unexpected exceptions into error
    responses in the route's shape (OpenAI's, or Anthropic's on ``ANTHROPIC_PATHS``); every
    4xx goes to ``refusals``."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        anthropic = request.path.endswith(ANTHROPIC_PATHS)
        try:
            return await handler(request)
        except ApiError as e:
            refusals.log(request, e)
            return e.response(anthropic)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            err = _from_http(request, e)
            refusals.log(request, err)
            return err.response(anthropic)
        except Exception:
            logger.exception("unhandled error serving %s %s", request.method, request.path)
            return ApiError(500, "internal server error (see the server log)").response(
                anthropic)

    return errors


def _from_http(request: web.Request, e: web.HTTPException) -> ApiError:
    message = {404: f"no route for {request.method} {request.path}",
               405: f"method {request.method} not allowed on {request.path}",
               413: e.text or "request body too large"}.get(e.status, e.reason)
    return ApiError(e.status, message, code=e.reason.lower().replace(" ", "_"))
