"""Request fields the server does not know: ignored (as OpenAI-compatible servers do), refused
when they would change the output and are not implemented, or all refused in strict mode.

Clients and wrappers send fields a local server has no use for (``store``, ``metadata``,
``service_tier``, ``prediction``, vLLM's ``guided_decoding_backend`` ...). By default each such
top-level field (and each unknown key of ``stream_options``) is dropped, logged once per name at
warning level, and named in the response's ``x-aioengine-ignored-fields`` header. With
``--strict-request-fields`` (``ServerSettings.strict_request_fields``) they get a 400 naming
them instead. Either way a field that asks for something this server does not do and would
change the answer (``audio``, ``modalities`` with audio, tools outside chat completions or
the legacy ``functions``, ``web_search_options`` ...) gets a specific 400: ignoring it would
hand back a different answer than the one asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from aioengine.server.body import decode
from aioengine.server.errors import ApiError, from_decode_error
from aioengine.server.protocol import StreamOptions

logger = logging.getLogger(__name__)

T = TypeVar("T")

IGNORED_HEADER = "x-aioengine-ignored-fields"

_NESTED: dict[str, type] = {"stream_options": StreamOptions}
_logged: set[str] = set()
_LOG_LIMIT = 256  # names remembered for "log once": a client inventing names cannot grow it


def _audio(value: Any) -> str | None:
    if value is None:
        return None
    return "audio output is not supported by this server (text only)"


def _modalities(value: Any) -> str | None:
    if isinstance(value, list) and all(m == "text" for m in value):
        return None
    return f"modalities {value!r} are not supported: this server answers with text only"


_TOOLS_WHERE = ("tool calling is served on /v1/chat/completions with `tools` and `tool_choice` "
                "(not the legacy `functions`/`function_call`)")


def _tools(value: Any) -> str | None:
    return None if not value else _TOOLS_WHERE


def _tool_choice(value: Any) -> str | None:
    return None if value in (None, "none") else _TOOLS_WHERE


def _web_search(value: Any) -> str | None:
    return None if value is None else "web search is not supported by this server"


def _best_of(value: Any) -> str | None:
    return None if value in (None, 1) else "best_of is not supported (use n)"


def _not_supported(what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in (None, False) else f"{what} is not supported by this server"
    return check


# Unknown fields that change the output when set: a refusal reason for a value that asks for
# something, None for a harmless value (null, "none", an empty list). A field the request
# struct knows is never checked here: tool calling, once the server has it, takes its fields.
REFUSED: dict[str, Callable[[Any], str | None]] = {
    "audio": _audio,
    "modalities": _modalities,
    "tools": _tools,
    "functions": _tools,
    "tool_choice": _tool_choice,
    "function_call": _tool_choice,
    "web_search_options": _web_search,
    "best_of": _best_of,
    "use_beam_search": _not_supported("use_beam_search"),
    "prompt_logprobs": _not_supported("prompt_logprobs"),
    "truncate_prompt_tokens": _not_supported("truncate_prompt_tokens"),
    "guided_whitespace_pattern": _not_supported("guided_whitespace_pattern"),
}


def known_fields(struct: type) -> frozenset[str]:
    return frozenset(f.encode_name for f in msgspec.structs.fields(struct))


class RequestDecoder(Generic[T]):
    """Decode one endpoint's body into ``struct``; ``decode`` returns the request and the names
    of the fields it ignored."""

    def __init__(self, struct: type[T], decoder: msgspec.json.Decoder[T], *,
                 strict: bool = False) -> None:
        self._struct = struct
        self._decoder = decoder
        self._known = known_fields(struct)
        self._nested = {name: known_fields(t) for name, t in _NESTED.items()}
        self.strict = strict

    def decode(self, body: bytes) -> tuple[T, list[str]]:
        try:  # the common case: every field known, one typed decode
            return self._decoder.decode(body), []
        except msgspec.ValidationError as e:
            if "unknown field" not in str(e):
                raise from_decode_error(e) from e
        except msgspec.DecodeError:
            pass  # malformed JSON: the typed decode below reports it
        except UnicodeDecodeError:
            pass
        raw = decode(msgspec.json.Decoder(), body)
        if not isinstance(raw, dict):
            return decode(self._decoder, body), []
        ignored = self._drop_unknown(raw)
        try:
            req = msgspec.convert(raw, self._struct)
        except msgspec.ValidationError as e:
            raise from_decode_error(e) from e
        return req, ignored

    def _drop_unknown(self, raw: dict[str, Any]) -> list[str]:
        unknown = [k for k in raw if k not in self._known]
        for name in unknown:
            check = REFUSED.get(name)
            why = check(raw[name]) if check is not None else None
            if why:
                raise ApiError(400, f"unsupported parameter `{name}`: {why}", param=name,
                               code="unsupported_parameter")
        nested = []
        for name, known in self._nested.items():
            value = raw.get(name)
            if isinstance(value, dict):
                nested += [(name, k) for k in value if k not in known]
        names = unknown + [f"{a}.{b}" for a, b in nested]
        if self.strict and names:
            raise ApiError(400, f"unsupported parameter `{names[0]}`: this server does not use "
                           "it (--strict-request-fields is on; without it unknown fields are "
                           f"ignored){_more(names)}", param=names[0],
                           code="unsupported_parameter")
        for name in unknown:
            del raw[name]
        for outer, inner in nested:
            del raw[outer][inner]
        for name in names:
            _log_once(name)
        return names


def _more(names: list[str]) -> str:
    return f"; also {', '.join(names[1:])}" if len(names) > 1 else ""


def _log_once(name: str) -> None:
    if name in _logged or len(_logged) >= _LOG_LIMIT:
        return
    _logged.add(name)
    logger.warning("ignoring request field %r: this server does not use it (listed in the %s "
                   "response header; --strict-request-fields refuses such requests)", name,
                   IGNORED_HEADER)


def ignored_header(names: list[str]) -> dict[str, str]:
    return {IGNORED_HEADER: ", ".join(names)} if names else {}
