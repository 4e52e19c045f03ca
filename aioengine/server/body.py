"""Read a JSON request body (415 for another declared media type, 413 past the size limit) and
decode it with a typed decoder."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import msgspec
from aiohttp import web

from aioengine.server.errors import ApiError, from_decode_error

T = TypeVar("T")


BODY_TIMEOUT_S = 30.0


async def read_body(request: web.Request, limit: int,
                    timeout: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, refusing one over ``limit`` bytes as soon as that is known (the declared
    length, or the bytes read so far of a chunked upload), and one not received within
    ``timeout`` seconds (408: a client trickling its body holds a connection and a handler
    for as long as it likes otherwise). Reads ``request.content`` directly so the limit holds
    even when the host app mounting us set another ``client_max_size``."""
    _check_media_type(request)
    try:
        return await asyncio.wait_for(_read(request, limit), timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body was not received within {timeout:g} s",
                       code="request_timeout") from None


async def _read(request: web.Request, limit: int) -> bytes:
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _too_large(f"{declared} bytes", limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise _too_large(f"more than {limit} bytes", limit)
        parts.append(chunk)
    if size == 0:
        raise ApiError(400, "request body is empty; expected a JSON object", code="invalid_json")
    return b"".join(parts)


def _check_media_type(request: web.Request) -> None:
    """JSON only; anything else (a form, text, bytes, or no Content-Type at all) is 415. A body
    without a Content-Type is what a web page's ``no-cors`` fetch can send to a server on the
    user's loopback without a CORS preflight: accepting it let any page start generations."""
    if "Content-Type" not in request.headers:
        raise ApiError(415, "Content-Type must be application/json, got none (curl: add -H "
                       "'Content-Type: application/json')", code="unsupported_media_type")
    media = request.content_type  # lower-cased, without parameters such as charset
    if media == "application/json" or (media.startswith("application/")
                                        and media.endswith("+json")):
        return
    hint = " (curl: add -H 'Content-Type: application/json')" \
        if media == "application/x-www-form-urlencoded" else ""
    raise ApiError(415, f"Content-Type must be application/json, got {media!r}{hint}",
                   code="unsupported_media_type")


def decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as e:
        # msgspec 0.23 says only "Invalid UTF-8 encoded string": name the byte and offset
        raise (_not_utf8(body) or from_decode_error(e)) from e
    except UnicodeDecodeError as e:  # msgspec before 0.23 raised this inside a string
        raise _not_utf8(body) or from_decode_error(msgspec.DecodeError(str(e))) from e


def _not_utf8(body: bytes) -> ApiError | None:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return ApiError(400, f"request body is not valid UTF-8: byte 0x{body[e.start]:02x} at "
                        f"offset {e.start}", code="invalid_json")
    return None


def _too_large(size: str, limit: int) -> ApiError:
    return ApiError(413, f"request body of {size} exceeds the server's limit of {limit} bytes "
                    "(max_request_bytes)", code="request_too_large")
